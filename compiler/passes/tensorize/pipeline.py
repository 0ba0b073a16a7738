"""The tensorize pass in a build: for every PrimFunc with a marked loop, lower its blocks to loops (TVM's own
passes up to `LowerOpaqueBlock`, buffers still multi-dimensional, block predicates now `if`s), then
preprocess (Alg. 1), partition (Alg. 2) and select instructions, all before TVM's pipeline flattens the
buffers; TVM's pipeline then runs as always (its block passes find no blocks left).

A function without a marked loop is returned untouched, so the pass can run in front of every build.
A function marked `without_tensorize(func, "off")` is left alone; `"no-partition"` selects instructions
without partitioning first (the comparison `bench.tensorize` makes: only nests that divide match).

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from typing import Any, Literal

import tvm
from tvm.s_tir import transform

from .mark import ANNOTATION
from .partition import partition
from .preprocess import preprocess
from .select import tensorize

ATTR = "altune.tensorize"
REPORT_ATTR = "altune.tensorized"
Mode = Literal["on", "off", "no-partition"]
# TVM's passes that take scheduled TensorIR to loops (the head of its s_tir pipeline, in its order)
_LOWERING = ("CanonicalizeLoop", "LowerCrossThreadReduction", "LowerInitBlock",
             "PlanAndUpdateBufferAllocationLocation", "ConvertBlocksToOpaque", "CompactBufferAllocation",
             "LowerMatchBuffer", "StmtSimplify", "LowerOpaqueBlock")


def tensorize_pass(exact: bool = False) -> tvm.transform.Pass:
    """The module pass (see the module docstring).

    Args:
        exact: use only instructions that never saturate (`instructions.Instruction.exact`).
    """
    @tvm.transform.module_pass(opt_level=0, name="altune.Tensorize")
    def _tensorize(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return tensorize_module(mod, exact=exact)[0]

    return _tensorize


def without_tensorize(func: tvm.tirx.PrimFunc, mode: Mode = "off") -> tvm.tirx.PrimFunc:
    """`func` marked so the pass leaves it alone ("off") or does not partition it ("no-partition")."""
    return func.with_attr(ATTR, mode)


def lower(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's lowering of blocks to loops (`_LOWERING`), as the pass sees a function."""
    return tvm.transform.Sequential([getattr(transform, name)() for name in _LOWERING])(mod)


def tensorize_module(mod: tvm.IRModule, target: tvm.target.Target | None = None, exact: bool = False
                     ) -> tuple[tvm.IRModule, dict[str, Any]]:
    """Preprocesses, partitions and tensorizes every marked PrimFunc of `mod`.

    Args:
        mod: scheduled TensorIR (marks set with `mark.mark`).
        target: the LLVM target; by default each function's "target" attribute (what `tvm.compile` binds).
        exact: use only instructions that never saturate.

    Returns:
        The module and, per tensorized function name, its `select.Report`.
    """
    reports: dict[str, Any] = {}
    out = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc) or not _has_marks(func):
            continue
        mode = str(func.attrs[ATTR]) if func.attrs is not None and ATTR in func.attrs else "on"
        if mode == "off":
            continue
        func_target = target
        if func_target is None:
            func_target = func.attrs.get("target", None) if func.attrs is not None else None
        if func_target is None:
            raise ValueError(f"{gv.name_hint}: no target to choose instructions for (tvm.compile binds one)")
        lowered = lower(tvm.IRModule({gv: func}))[gv]
        lowered = preprocess(lowered, func_target)
        if mode != "no-partition":
            lowered = partition(lowered)
        lowered, report = tensorize(lowered, func_target, exact)
        reports[gv.name_hint] = report
        out[gv] = lowered.with_attr(REPORT_ATTR, ",".join(report.used))
    if not out:
        return mod, reports
    mod = mod.shallow_copy() if hasattr(mod, "shallow_copy") else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in out.items():
        mod[gv] = func
    return mod, reports


def _has_marks(func: Any) -> bool:
    """Whether a loop of `func` (scheduled TensorIR or lowered) carries the mark."""
    return ANNOTATION in tvm.ir.save_json(func.body)
