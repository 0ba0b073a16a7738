"""Schedules for the glue between tuned kernels: the blocks of untuned functions (`build.default_cpu_schedule`)
that the plain rule leaves far from memory bandwidth.

The plain rule fuses a block's leading spatial loops, runs them in parallel above a work threshold and
vectorizes the innermost loop when it is spatial and short. Three kinds of block miss it, and each gets a rule
here (measured with `python -m bench.glue`; `GLUE_RULES`, tried in order):

- `channel_reduction`: a reduction whose last spatial axis is the contiguous one of what it reads and writes,
  the reduction axes inside it: a mean over H, W in NCHWc (squeeze-excite, global pooling) or a pool in NCHWc.
  The plain rule leaves the reduction innermost and strided; LLVM vectorizes the channel loop only where it
  unrolls the reduction completely (3x3 pools, 7x7 means), not over 14x14 or 56x56. Here the channel loop goes
  under the reductions, vectorized, into a local accumulator.
- `row_reduction`: a reduction along the contiguous axis (softmax's max and sum of exps, layer norm's sums):
  scalar under the plain rule. Here it is split by the vector width and `rfactor`ed into a vector of partial
  results, which a last short loop adds.
- `layout_copy`: a copy into another layout (NCHW <-> NCHWc, a transpose). The plain rule runs it in the order
  of what it reads and stores with a stride; here it runs in the order of what it writes, the stores
  contiguous, or, where the written rows are shorter than half a vector (an image's 3 channels innermost),
  by tiles read along rows.

Element-wise chains, concatenations and channel shuffles keep the plain rule: measured near a copy of their
bytes already (LLVM vectorizes what the plain rule leaves scalar there).

Each rule returns False, having changed nothing, when a block is not of its kind; one that TVM refuses half way
raises, and `build.default_cpu_schedule` then schedules the whole function by the plain rule.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import tvm
from tvm import sym
from tvm.s_tir import Schedule
from tvm.s_tir.dlight.analysis import SBlockInfo
from tvm.tirx import IndexMap


def _extents(sch: Schedule, loops: list[Any]) -> list[int]:
    return [int(sch.get(loop).extent) for loop in loops]


def _var_at(region: Any, axis: int) -> Any:
    """The index variable of `region`'s dimension `axis` when it is one point at a variable, else None."""
    if axis >= len(region) or len(region) == 0:
        return None
    dim = region[axis]
    if not isinstance(dim.extent, tvm.tirx.IntImm) or int(dim.extent) != 1:
        return None
    return dim.min if isinstance(dim.min, tvm.tirx.Var) else None


def _innermost_is(regions: Any, var: Any) -> bool:
    """Every buffer region in `regions` is indexed by `var` in its last dimension (scalars and broadcasts that do
    not depend on it aside)."""
    found = False
    for region in regions:
        if len(region.region) == 0:
            continue
        last = _var_at(region.region, len(region.region) - 1)
        if last is None or not last.same_as(var):
            if any(_uses(dim.min, var) for dim in region.region):
                return False
            continue
        found = True
    return found


def _uses(expr: Any, var: Any) -> bool:
    return any(v.same_as(var) for v in tvm.tirx.analysis.undefined_vars(expr))


def _contraction(block: Any) -> bool:
    """Two or more buffers read along the reduction: a convolution's or a matrix product's (a complex operator,
    tuned or given its own schedule), not glue."""
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == tvm.tirx.IterVar.CommReduce]
    return sum(any(_uses(dim.min, v) for dim in r.region for v in reduce) for r in block.reads) >= 2


def _parallel(sch: Schedule, loops: list[Any], extents: list[int], cores: int) -> None:
    """Fuses the leading loops until they have `cores * 8` iterations, and runs them in parallel."""
    picked, total = [], 1
    for loop, extent in zip(loops, extents):
        if total >= cores * 8:
            break
        picked.append(loop)
        total *= extent
    if total > 1:
        sch.parallel(sch.fuse(*picked) if len(picked) > 1 else picked[0])


def channel_reduction(sch: Schedule, info: SBlockInfo, cores: int, lanes: int, min_parallel_work: int) -> bool:
    """A reduction (iterators S..S R..R) whose last spatial axis is the innermost of every buffer it reads and
    writes: that axis under the reductions, vectorized, the outer spatial loops in parallel."""
    kinds = info.dom_kind()
    spatial = len(kinds) - len(kinds.lstrip("S"))
    if not info.is_reduction() or spatial == 0 or kinds[spatial:] != "R" * (len(kinds) - spatial):
        return False
    loops = info.get_loops()
    extents = _extents(sch, loops)
    if not 1 < extents[spatial - 1] <= 4 * lanes:
        return False
    block = sch.get(info.block_rv)
    var = block.iter_vars[spatial - 1].var
    if _contraction(block) or not (_innermost_is(block.reads, var) and _innermost_is(block.writes, var)):
        return False
    channel = loops[spatial - 1]
    sch.reorder(*loops[spatial:], channel)
    if spatial > 1:
        # the accumulators in a vector of their own per point, stored once: LLVM keeps it in a register. Scope
        # "global": TVM puts a small global buffer on the stack, a "local" one in a workspace allocated on every
        # iteration of the parallel loop (`LowerTVMBuiltin`)
        local = sch.cache_write(info.block_rv, 0, "global")
        sch.reverse_compute_at(local, loops[spatial - 2])
        sch.vectorize(sch.get_loops(local)[-1])
    if math.prod(extents) >= min_parallel_work and spatial > 1:
        _parallel(sch, loops[:spatial - 1], extents[:spatial - 1], cores)
    sch.vectorize(channel)  # before the init is split off: TVM checks the dataflow of a reduction with its init
    init = sch.decompose_reduction(info.block_rv, loops[spatial])
    sch.vectorize(sch.get_loops(init)[-1])
    return True


def row_reduction(sch: Schedule, info: SBlockInfo, cores: int, lanes: int, min_parallel_work: int) -> bool:
    """A reduction (S..S R) along the innermost axis of what it reads, a multiple of the vector width long: split
    by the width, `rfactor`ed into a vector of partial results (vectorized, the reduction's outer part around it),
    which the original block then adds up, row by row."""
    kinds = info.dom_kind()
    if not info.is_reduction() or not kinds.endswith("R") or kinds.count("R") != 1 or not kinds.startswith("S"):
        return False
    loops = info.get_loops()
    extents = _extents(sch, loops)
    if extents[-1] % lanes:
        return False
    block = sch.get(info.block_rv)
    if _contraction(block) or not _innermost_is(block.reads, block.iter_vars[-1].var):
        return False
    spatial = len(loops) - 1
    outer, inner = sch.split(loops[-1], [None, lanes])
    rf = sch.rfactor(inner, factor_axis=len(block.writes[0].region))  # the partial results innermost
    rf_loops = sch.get_loops(rf)
    # the partial results added up row by row: one vector of them per row, which LLVM keeps in a register
    sch.reverse_compute_at(info.block_rv, rf_loops[spatial - 1])
    if math.prod(extents) >= min_parallel_work:
        _parallel(sch, rf_loops[:spatial], extents[:spatial], cores)
    sch.vectorize(rf_loops[-1])
    init = sch.decompose_reduction(rf, rf_loops[spatial])
    sch.vectorize(sch.get_loops(init)[-1])
    return True


def layout_copy(sch: Schedule, info: SBlockInfo, cores: int, lanes: int, min_parallel_work: int) -> bool:
    """A copy into another layout (one read, one write, injective, not element-wise: NCHW <-> NCHWc, a
    transpose). Where the innermost written axis is at least half a vector long: the block re-indexed by what it
    writes (`transform_block_layout`), so its loops run in the order of the written buffer, the stores
    contiguous and the innermost loop vectorized (the reads gathered). Where it is shorter (an image's 3
    channels innermost) and is one loop: the loop the reads run contiguously along is split by the vector width,
    its inner part vectorized under the written axis's loop (a tile read by rows, written by columns)."""
    if not info.is_layout_transform(sch):
        return False
    block = sch.get(info.block_rv)
    iters = [iv.var for iv in block.iter_vars]
    write = block.writes[0]
    dims = [d for d, dim in enumerate(write.region) if not isinstance(dim.min, tvm.tirx.IntImm)]
    if not dims:
        return False
    written = [write.region[d].min for d in dims]
    last = int(write.source.shape[dims[-1]])
    if 2 * last >= lanes:
        if len(written) == len(iters) and all(w.same_as(v) for w, v in zip(written, iters)):
            return False  # in the written order already (TE's transforms): the plain rule's order
        if last > 4 * lanes and last % lanes:
            return False
        sch.transform_block_layout(info.block_rv, IndexMap(iters, written, None))
        loops = sch.get_loops(info.block_rv)
        extents = _extents(sch, loops)
        if extents[-1] > 4 * lanes:
            outer, inner = sch.split(loops[-1], [None, lanes])
            loops, extents = [*loops[:-1], outer, inner], [*extents[:-1], extents[-1] // lanes, lanes]
        if math.prod(extents) >= min_parallel_work and len(loops) > 1:
            _parallel(sch, loops[:-1], extents[:-1], cores)
        sch.vectorize(loops[-1])
        return True
    loops = info.get_loops()
    extents = _extents(sch, loops)
    column = next((i for i, v in enumerate(iters) if v.same_as(written[-1])), None)
    row = next((i for i, s in enumerate(_strides(block.reads[0], iters)) if s == 1 and i != column), None)
    if column is None or row is None or extents[row] % lanes:
        return False
    if (row, column) == (len(loops) - 1, len(loops) - 2) and extents[row] <= 4 * lanes:
        return False  # the loops in that order already: the plain rule's schedule
    outer, inner = sch.split(loops[row], [None, lanes])
    rest = [(loop, e) for i, (loop, e) in enumerate(zip(loops, extents)) if i not in (row, column)]
    sch.reorder(*[loop for loop, _ in rest], outer, loops[column], inner)
    if math.prod(extents) >= min_parallel_work and rest:
        _parallel(sch, [loop for loop, _ in rest], [e for _, e in rest], cores)
    sch.vectorize(inner)
    return True


def _strides(region: Any, iters: list[Any]) -> list[int]:
    """Each iterator's stride in the flattened index of `region`'s buffer (0 where the index is not linear)."""
    dtype = str(region.region[0].min.ty) if len(region.region) else "int64"
    flat = tvm.tirx.const(0, dtype)
    for dim, size in zip(region.region, region.source.shape):
        flat = flat * tvm.tirx.const(int(size), dtype) + dim.min
    coeffs = sym.detect_linear_equation(flat, iters)
    if len(coeffs) != len(iters) + 1 or not all(isinstance(c, tvm.tirx.IntImm) for c in coeffs):
        return [0] * len(iters)
    return [int(c) for c in coeffs[:-1]]


# a rule: (schedule, block, cores, vector lanes, min parallel work) -> whether it scheduled the block
GlueRule = Callable[[Schedule, SBlockInfo, int, int, int], bool]
GLUE_RULES: tuple[GlueRule, ...] = (channel_reduction, row_reduction, layout_copy)
