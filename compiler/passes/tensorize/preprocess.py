"""Instruction preprocessing (the paper's Alg. 1, `PreProcess`): each marked statement's constraint type
decides what is done to it before partitioning and matching.

- ALIGN (`expand_allocations`): a scratch buffer that a marked nest accesses (allocated in the function:
  a cache or packing buffer) has its innermost dimension expanded to a multiple of the instruction's
  alignment (its lanes), so that whole vectors fit it; one the nest reads gets one more slice of its
  outermost dimension that is no unit (a row of a fused tile's padded input), so that the whole vector of a
  partial row's last element stays inside it (its extra lanes computed, never stored). The indices do not
  change (buffers are still multi-dimensional here, and a unit dimension's index is 0 whatever its stride),
  so the program computes what it computed before. Buffers the user passes in
  are the layout's business: the packed int8/bf16 weights of `kernels.py` are allocated aligned (zero
  padded) by their packing stage, the way the paper pads data to an instruction's alignment.
- LAYOUT (instruction replacement): where the widest instruction's lanes do not divide the lane loop of
  a matched nest, an equivalent instruction of fewer constraints (narrower vectors of the same target:
  AVX2's ymm FMA on an AVX-512 machine) replaces it. This is decided at match time in
  `select.match_outer_product`, where the lane loop is known.
- COM (extra computation on an enlarged input, to remove the branch of a complex operator): two forms.
  conv2d reads a padded input (a pad stage of `kernels.py`), so its window reduction has no boundary
  branch at all; and a lane remainder of an outer product is computed as a whole vector on the packed
  weight's zero padding, only its valid lanes written back (decided at match time in
  `select._match_columns`, where it checks that the vector reads stay inside the weight). A general rewrite
  that drops any guard when the extra work provably reads in bounds and writes only elements nobody reads
  is not written (see docs/design.md, "Tensorization").

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import tirx

from ... import tir_util
from .instructions import available
from .mark import ANNOTATION


def preprocess(func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """`PreProcess` of a lowered function (after `LowerOpaqueBlock`) for `target`: ALIGN as above (LAYOUT and
    COM are where the module docstring says)."""
    lanes = max((ins.lanes for ins in available(target)), default=1)
    return expand_allocations(func, lanes)


def expand_allocations(func: tvm.tirx.PrimFunc, align: int) -> tvm.tirx.PrimFunc:
    """ALIGN: every buffer allocated in `func` and accessed inside a marked loop gets its innermost extent
    rounded up to a multiple of `align` (its accesses unchanged)."""
    if align <= 1:
        return func
    stored: set[int] = set()
    loaded: set[int] = set()
    for s in tir_util.walk(func.body):
        if isinstance(s, tirx.For) and ANNOTATION in s.annotations:
            for x in tir_util.walk(s.body):
                if isinstance(x, tirx.BufferStore):
                    stored.add(tir_util.key(x.buffer))
            for e in tir_util.exprs(s.body):
                _loaded(e, loaded)
    remap: dict[int, Any] = {}

    def realloc(s: Any) -> Any | None:
        if isinstance(s, tirx.AllocBuffer) and tir_util.key(s.buffer) in stored | loaded:
            buf = s.buffer
            extents = [tir_util.const_int(n) for n in buf.shape]
            if not extents or None in extents or buf.strides:
                return s
            new_extents = list(extents)
            new_extents[-1] = (extents[-1] + align - 1) // align * align
            if tir_util.key(buf) in loaded:  # a slice more of the outermost dimension that is no unit
                k = next((k for k, n in enumerate(extents) if n > 1), 0)
                new_extents[k] += align if k == len(extents) - 1 else 1
            if new_extents == extents:
                return s
            shape = [tirx.const(n, str(old.ty.dtype)) for n, old in zip(new_extents, buf.shape)]
            new = tirx.decl_buffer(shape, str(buf.dtype), buf.name, data=buf.data, scope=buf.scope())
            remap[tir_util.key(buf)] = new
            return tirx.AllocBuffer(new, s.annotations) if s.annotations else tirx.AllocBuffer(new)
        return None

    body = tir_util.map_stmt(func.body, lambda e: e, realloc)
    if not remap:
        return func
    body = tir_util.map_stmt(body, lambda e: _rebuffer(e, remap), lambda s: _restore(s, remap))
    return func.with_body(body)


def _loaded(e: Any, used: set[int]) -> None:
    if isinstance(e, tvm.ir.TensorLoad):
        used.add(tir_util.key(e.source))
    for name in ("a", "b", "value", "condition", "true_value", "false_value"):
        child = getattr(e, name, None)
        if isinstance(child, tvm.ir.Expr):
            _loaded(child, used)
    for child in list(getattr(e, "args", []) or []) + list(getattr(e, "indices", []) or []):
        if isinstance(child, tvm.ir.Expr):
            _loaded(child, used)


def _rebuffer(e: Any, remap: dict[int, Any]) -> Any:
    """`e` with loads of remapped buffers reading the expanded buffer (in every kind of expression)."""
    def fn(x: Any) -> Any | None:
        if isinstance(x, tvm.ir.TensorLoad) and tir_util.key(x.source) in remap:
            return tirx.BufferLoad(remap[tir_util.key(x.source)], [_rebuffer(i, remap) for i in x.indices])
        return None

    return tir_util.rewrite(e, fn)


def _restore(s: Any, remap: dict[int, Any]) -> Any | None:
    if isinstance(s, tirx.BufferStore) and tir_util.key(s.buffer) in remap:
        return tirx.BufferStore(remap[tir_util.key(s.buffer)], _rebuffer(s.value, remap),
                                [_rebuffer(i, remap) for i in s.indices])
    if isinstance(s, tirx.BufferStore):
        return tirx.BufferStore(s.buffer, _rebuffer(s.value, remap), [_rebuffer(i, remap) for i in s.indices])
    return None
