"""Marking: the schedule names the loop whose nest a tensor instruction should execute (the paper's
`pragma(xxi, "Intrin", "TADD")`); the search decides which loop, the passes of this package do the rest.

The mark is a loop annotation, `altune.tensorize`, whose value is the kind of instruction wanted:

- "auto": whatever instruction of the target matches the nest (`select.py` tries them all);
- "outer_product": a register-blocked micro-kernel `C[i, j] += A[i, r] * B[r, j]` (fp32 FMA) or its
  grouped dot-product forms (int8, bf16);
- "elementwise": a vector instruction over the marked (innermost) loop (add, sub, mul, relu, ...);
- "transpose": an in-register transpose of a copy's inner lanes x lanes tile (`transpose.py`: a layout
  conversion, its input contiguous along the marked loop and its output along the one inside it).

TVM's `LowerOpaqueBlock` keeps loop annotations on the lowered `For`, where our passes find it.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from tvm import tirx

from ... import tir_util

if TYPE_CHECKING:
    import tvm

ANNOTATION = "altune.tensorize"
# the block attribute of a reduction whose last axis is a dot-product instruction's group (a model's
# `conv2d_nhwc_dot`, a catalog operator in `compiler.layout.templates`' dot-product form): the loop search
# keeps that axis whole, innermost, the instruction's operand
DOT_GROUP = "altune.dot_group"
Kind = Literal["auto", "outer_product", "elementwise", "transpose"]
KINDS: tuple[Kind, ...] = ("auto", "outer_product", "elementwise", "transpose")


def mark(sch: tvm.s_tir.Schedule, loop: Any, kind: Kind = "auto") -> None:
    """Marks `loop` (a loop random variable of `sch`) for a tensor instruction of `kind`.

    For "outer_product" the marked loop is the reduction loop `r` of the micro-kernel, directly holding
    the row loop, the lane loop(s) and, for dot products, the group loop (see `select.py`); for
    "elementwise" it is the innermost loop, whose extent a multiple of the target's lanes.

    Raises:
        ValueError: for an unknown kind.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown tensorize kind: {kind!r} (one of {', '.join(KINDS)})")
    sch.annotate(loop, ANNOTATION, kind)


def marked_kinds(func: tvm.tirx.PrimFunc) -> list[str]:
    """The kinds of the marked loops of a lowered function, in program order."""
    return [str(s.annotations[ANNOTATION]) for s in tir_util.walk(func.body)
            if isinstance(s, tirx.For) and ANNOTATION in s.annotations]
