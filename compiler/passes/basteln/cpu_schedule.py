"""Our CPU schedule of the blocks inside basteln's tiles -- not the paper's, which stops at tiling and fusion:
every reduction gets its spatial loops, then its reduction loops, then the innermost spatial loop
vectorized (optionally a register block of one or two spatial loops, optionally marked for a tensor
instruction), and its initialization hoisted out of the reduction (`decompose_reduction`); a block
outside every tile is parallel too. A reduction along the innermost dimension of one tensor (softmax's row
max and sum) is split first (`rfactor_rows`): partial results one vector a row, then the lanes reduced.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compiler.passes.tensorize import mark, schedule_transpose
from compiler.tir_util import const_extent, loop_feeds

from .spaces import Space

MAX_VECTOR = 64  # the longest innermost loop vectorized


def schedule_blocks(sch: Any, spaces: dict[str, Space], depths: dict[str, int], *, vector: int, register: int,
                    register2: int, parallel: bool, tensorize: bool, lanes: int) -> None:
    """Every block of `spaces` still in `sch` scheduled below its `depths[name]` tile loops (`_inner`); a block
    under no tile loop is parallel too (when `parallel`)."""
    for name, space in spaces.items():
        try:
            block = sch.get_sblock(name)
        except Exception:  # inlined
            continue
        depth = depths.get(name, 0)
        _inner(sch, block, space, depth, vector=vector, register=register, register2=register2,
               parallel=parallel and depth == 0, tensorize=tensorize, lanes=lanes)


def _inner(sch: Any, block: Any, space: Space, depth: int, *, vector: int, register: int, register2: int,
           parallel: bool, tensorize: bool = False, lanes: int = 0) -> None:
    """A plain CPU schedule for one block below its `depth` tile loops: reductions before the innermost
    spatial loop, that loop vectorized, the initialization hoisted; a block on its own: parallel too."""
    loops = sch.get_loops(block)
    own = loops[depth:] if depth else loops
    if not own:
        return
    # which loops are the reduction's: by the block variables they feed (`compute_at` drops unit loops)
    reduce_vars = {v for v, _ in space.reduce}
    feeds = loop_feeds(sch, block, own)
    reduce = [loop for loop, vs in zip(own, feeds) if vs & reduce_vars]
    # the spatial loops in the order of the dimensions the block writes (`compute_at` nests them in the
    # order of its variables, which `rfactor`'s partial block does not keep): the innermost is the vector
    rank = {v: i for i, (v, _) in enumerate(space.spatial)}
    at = [i for i, vs in enumerate(feeds) if not vs & reduce_vars]
    order = sorted(at, key=lambda i: min((rank[v] for v in feeds[i] if v in rank), default=-1))
    if order != at:
        sch.reorder(*[own[i] for i in order])
    spatial = [own[i] for i in order]
    if parallel and spatial:
        sch.parallel(spatial[0])
        spatial_rest = spatial[1:]
    else:
        spatial_rest = spatial
    if reduce and spatial_rest:
        last = spatial_rest[-1]
        pre = spatial_rest[:-1]
        fit = _vector_fit(const_extent(sch.get(last)) or 0, vector)
        if fit:  # a row longer than a vector: its vectors are a loop outside the reduction (a register block's)
            outer, last = sch.split(last, [None, fit])
            pre.append(outer)
        bound = loop_feeds(sch, block, pre)
        at = _register_dim(space, bound)
        # a second register dimension, the innermost other loop: an outer product of both blocks
        at2 = next((i for i in range(len(pre) - 1, -1, -1) if i != at and bound[i] and (const_extent(sch.get(pre[i])) or 0) > 1),
                   None) if at is not None and register2 > 1 else None
        blocks: dict[int, Any] = {}
        for index, want in ((at, register), (at2, register2)):
            if index is None:
                continue
            extent = const_extent(sch.get(pre[index])) or 0
            factor = _register_factor(extent, want)
            if factor == extent > 1:  # the whole loop fits: it moves inside the reduction as it is
                blocks[index] = (pre[index], None)
            elif factor > 1:
                o, i = sch.split(pre[index], [None, factor])
                blocks[index] = (i, o)
        regs = [blocks[i][0] for i in sorted(blocks)]
        pre = [blocks[i][1] if i in blocks else loop for i, loop in enumerate(pre)]
        pre = [loop for loop in pre if loop is not None]
        if tensorize and regs:  # the micro-kernel runs the innermost reduction loop: the longest, so that its
            # accumulators are loaded and stored once per the most instructions (a conv's channels, not a 3-tap window)
            reduce = sorted(reduce, key=lambda loop: const_extent(sch.get(loop)) or 0)
        sch.reorder(*pre, *reduce, *regs, last)
        for r in regs if not tensorize else ():  # the micro-kernel unrolls its own (it matches serial loops)
            sch.unroll(r)
        _vectorize(sch, last, vector)
        if tensorize and regs:
            mark(sch, reduce[-1], "outer_product")
        try:
            sch.decompose_reduction(block, reduce[0])
        except Exception:  # a reduction TVM cannot split off (its init is under a non-reduction loop)
            pass
    elif spatial_rest and not reduce:
        # a layout conversion (the output's back to the user's layout): transposed tiles in registers
        if not (tensorize and schedule_transpose(sch, block, spatial_rest, lanes)):
            _vectorize(sch, spatial_rest[-1], vector)


def reduces_along_rows(space: Space) -> bool:
    """A reduction along the innermost dimension of one tensor, by its one reduction variable, which the
    innermost spatial variable does not index there (softmax's row max and row sum, layer norm's mean and
    variance; any other input it reads once a row, as the variance its mean): vectors over the spatial
    loop would gather, one element a row; vectors along the rows are contiguous."""
    if len(space.reduce) != 1 or not space.spatial:
        return False
    (var, _), last = space.reduce[0], space.spatial[-1][0]
    inputs = [a for a in space.reads if a.buffer != space.writes.buffer and a.indices]
    rows = [a for a in inputs if any(var in dict(x.coeffs) for x in a.indices)]
    return len({a.buffer for a in rows}) == 1 and all(
        var in dict(a.indices[-1].coeffs) and last not in dict(a.indices[-1].coeffs) for a in rows)


def rfactor_rows(sch: Any, name: str, space: Space, vector: int) -> bool:
    """Reduces each row in vectors (`rfactor`, before any tiling: TVM's needs the block alone in its loop
    nest): a block of partial results, one vector a row (its reduction the row's vectors, its innermost
    spatial loop the lanes, which `_inner` vectorizes), then the original block reduces the lanes. False
    (nothing factored) where the row is not several whole vectors or TVM cannot factor the reducer."""
    extent = space.reduce[0][1]
    lanes = next((f for f in range(min(vector, extent), 1, -1) if extent % f == 0), None)
    if lanes is None or extent == lanes or lanes * 2 <= min(vector, extent):
        return False
    block = sch.get_sblock(name)
    loops = sch.get_loops(block)
    row = [loop for loop, fed in zip(loops, loop_feeds(sch, block, loops)) if space.reduce[0][0] in fed]
    if len(row) != 1:
        return False
    _, inner = sch.split(row[0], [None, lanes])
    try:
        sch.rfactor(inner, factor_axis=len(space.spatial))
    except Exception:  # noqa: BLE001 - a reducer TVM cannot factor: the row stays one loop (the split is harmless)
        return False
    return True


def _register_dim(space: Space, bound: Sequence[set[str]]) -> int | None:
    """Which of the spatial loops before the vectorized one (`bound`: the block variables each feeds) to
    block in registers: the innermost of those the fewest vector loads depend on. One no load depends on
    (a conv's output channel, or its output column in a channel-blocked layout) reuses each loaded vector
    for every register; where every loop moves some load (a depthwise conv: its input moves with the
    column, its weight and input with the channel block), the column, which leaves the weight's vector
    reused, beats the channel block, which reuses nothing."""
    if not bound:
        return None
    last = space.spatial[-1][0]
    loads = [{v for x in a.indices for v, _ in x.coeffs} for a in space.reads
             if a.buffer != space.writes.buffer and a.indices is not None and any(last in dict(x.coeffs) for x in a.indices)]
    candidates = [i for i in range(len(bound) - 1, -1, -1) if bound[i]]
    if not candidates:
        return len(bound) - 1
    return min(candidates, key=lambda i: sum(1 for used in loads if bound[i] & used))


def _register_factor(extent: int, register: int) -> int:
    """The register block: the largest divisor of the loop's extent up to `register` (a tail's guards keep
    LLVM from keeping the block in registers); 0 when only 1 divides."""
    return max((f for f in range(2, min(register, extent) + 1) if extent % f == 0), default=0)


def _vector_fit(extent: int, vector: int) -> int | None:
    """The vector length to split a loop longer than `vector` by: a factor that divides it leaves no
    predicated tail (a tail's guards keep LLVM from vectorizing); one shorter than half the asked length is
    not worth it (None: the tail then is)."""
    if extent <= vector:
        return None
    return next((f for f in range(vector, vector // 2, -1) if extent % f == 0), None)


def _vectorize(sch: Any, loop: Any, vector: int) -> None:
    extent = const_extent(sch.get(loop))
    if extent is None or extent <= 1:
        return
    try:
        if extent > vector:
            _, loop = sch.split(loop, [None, _vector_fit(extent, vector) or vector])
        sch.vectorize(loop)
    except Exception:  # a loop with a predicate or a dependence TVM refuses to vectorize stays scalar
        pass
