"""The basteln pass: tiling and fusion after the basteln strategy (Zhao et al., "Modeling the Interplay between Loop Tiling
and Fusion in Optimizing Compilers Using Affine Relations", TOCS; MICRO 2020), on TVM's TensorIR.

The paper works on schedule trees with isl; here every iteration space is a TensorIR block (an `SBlock`
of the program's root), its access relations are the block's `reads`/`writes` regions (affine in its
iteration variables), and the schedule tree's extension nodes are `compute_at`, which computes exactly
the region a tile needs. The algorithms, in the order `basteln` runs them:

1. Element-wise inlining (Alg. 5): an element-wise block (no reduction; writes and reads index by plain
   iteration variables) is inlined into its consumers when they read what it writes without re-reading
   it (a consumer instance per element, as bias -> relu); on a CPU a consumer that re-reads each element
   (a conv reading its input KH*KW*K times) would recompute the operator each time, which the paper's
   "overlapped accesses" rule refuses for several consumers and we refuse for one too.
2. Pre-tiling fusion (Alg. 1): a reduction block and the element-wise block that is its only consumer
   and reads it by a quasi-identity relation (the same spatial variables in the same order) form one
   group; the consumer runs after the reduction inside each tile.
3. Tiling the live-out spaces (Alg. 2, lines 1-5): the anchor of each output group (its reduction, or
   the output block itself) is tiled with the tile sizes the tuner gives; the tile loops come first,
   ordered so that the dimensions whose tiling would make an intermediate recompute come last.
4. Tile shapes of the intermediate spaces (Alg. 2, lines 6-25), in reverse topological order: the
   footprint a tile needs of each buffer (the upward-exposed data: the image of the tile box through the
   consumers' read regions, a rectangular hull as isl's box over-approximation), mapped back through the
   producer's write relation to the producer's instances; overlapped tiles (a halo) are allowed and
   counted as recomputation. The paper's m > n rule: an intermediate with fewer parallel dimensions
   than the output tile loops it would sit under stays untiled there (it goes to a shallower loop).
5. Post-tiling fusion (Alg. 3): each intermediate group is computed at the deepest output tile loop
   where both rules hold and its recomputed fraction is within the redundancy threshold (sec. 5.4: 0 =
   never recompute, 1 = always fuse); `compute_at` places it and TVM's `CompactBufferAllocation` shrinks
   its buffer to the tile's footprint (the per-tile scratch of sec. 6.4). An intermediate that fuses
   nowhere is scheduled as a space of its own (parallel outer loop, vectorized inner loop).
6. Multiple outputs (Alg. 4, sec. 5.3-5.4): outputs whose anchors have equal iteration spaces are tiled
   with equal tile sizes and their tile loops merged (`Schedule.merge`), so a producer they share is
   computed once per tile for both; whether it fuses follows the same threshold, now on the union of
   what both need. Outputs of different spaces form classes, each with tile loops of its own (the first
   class takes the tuner's tile sizes, a further one the same sizes clipped to its extents). A producer
   that several classes read is copied once per further class (Fig. 11b: op0' and op0'') when the parts
   the classes need intersect in at most `threshold` of it (disjoint parts, as the two halves of a chunk,
   cost nothing); each class's consumers read its own copy, fused under that class's tiles. Above the
   threshold it is computed once, whole, before all of them. Copies are made closest to the outputs
   first, so that a copied producer's own producers are shared by the copies in turn.

Inside the tiles every block gets our own CPU schedule (`cpu_schedule`, not the paper's). The pieces, one
module each: `spaces` (the program as iteration spaces and access relations), `footprints` (Alg. 2's
footprints and the redundancy of a fusion), `plan` (groups, output classes, tile sizes, where each
intermediate fuses), `copies` (Fig. 11b), `cpu_schedule`; this module runs them in the paper's order.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tvm
from tvm import s_tir

from .copies import buffer_bytes, duplicate_shared
from .cpu_schedule import reduces_along_rows, rfactor_rows, schedule_blocks
from .plan import (
    Decision,
    Duplication,
    Fused,
    Plan,
    class_sets,
    default_tiles,
    group_spaces,
    output_classes,
    place_groups,
    tiles_of_class,
)
from .spaces import BastelnError, Group, Space, consumers_of, reuse, spaces_of


def basteln(
    prim_func: tvm.tirx.PrimFunc,
    tiles: Sequence[int] | None = None,
    threshold: float = 0.0,
    *,
    vector: int = 16,
    register: int = 1,
    register2: int = 1,
    unroll: int = 0,
    parallel: bool = True,
    tensorize: bool = False,
    lanes: int | None = None,
    copies: bool = True,
) -> Fused:
    """Tiles the live-out spaces of `prim_func` and fuses every intermediate space into their tiles.

    Args:
        prim_func: a TensorIR function (blocks in its root, as `te.create_prim_func` makes).
        tiles: the tile size of each spatial dimension of the output anchor, in its block order
            (None: 1 for all but the last two, whole for those).
        threshold: the largest fraction of an intermediate's instances a fusion may recompute
            (sec. 5.4): 0 fuses only without redundancy, 1 (or more) fuses whatever fits.
        vector: the longest innermost loop to vectorize (the vector unit's lanes times a small factor).
        register: a register block of every reduction: the spatial loop its vector loads do not depend on
            (a conv's output channel in NCHW, its column in a channel-blocked layout), split by this.
        register2: a second register block, of the innermost other spatial loop (an outer product).
        unroll: `pragma_auto_unroll_max_step` on the tile loops (0: none).
        parallel: parallelize the outermost tile loops (fused).
        tensorize: mark every register-blocked reduction's innermost reduction loop for an outer-product
            micro-kernel (`compiler.passes.tensorize`: the target's FMA or dot-product instruction, the
            nest left as it is where it does not match), and every layout conversion for transposed tiles in
            registers (`compiler.passes.tensorize.schedule_transpose`).
        lanes: the vector unit's float32 lanes, the transposed tiles' size (None: `vector`).
        copies: copy a producer that outputs of different spaces read, one copy per class of outputs, where
            the threshold allows (Fig. 11b); False: such a producer is computed once, whole, before them.

    Returns:
        The schedule and the decisions (`Fused`).

    Raises:
        BastelnError: the program has no output block or the tile sizes do not fit it.
    """
    sch = s_tir.Schedule(prim_func)
    root = sch.get(sch.get_sblock("root"))
    intermediate_bytes = sum(buffer_bytes(b) for b in root.alloc_buffers)
    spaces = {s.name: s for s in spaces_of(sch)}
    # the function's own buffers: everything the blocks write that the root does not allocate
    params = {s.writes.buffer for s in spaces.values() if "@" not in s.writes.buffer}

    # Alg. 5: element-wise inlining
    inlined: list[str] = []
    for name in list(spaces):
        space = spaces[name]
        if not space.elementwise or space.writes.buffer in params:
            continue
        consumers = consumers_of(spaces, name)
        if not consumers or sum(reuse(spaces[c], space.writes.buffer, space) for c in consumers) > 1.0 + 1e-9:
            continue
        try:
            sch.compute_inline(sch.get_sblock(name))
        except Exception:  # a consumer TVM cannot inline into (an opaque access): keep the block
            continue
        inlined.append(name)
        spaces = {s.name: s for s in spaces_of(sch)}

    if not any(s.writes.buffer in params for s in spaces.values()):
        raise BastelnError("the program writes no output buffer")
    # rows reduced in vectors (softmax's max and sum), before the analysis sees the program's spaces
    if any([rfactor_rows(sch, name, space, vector) for name, space in spaces.items() if reduces_along_rows(space)]):
        spaces = {s.name: s for s in spaces_of(sch)}

    groups, member_of = group_spaces(spaces, params)
    duplications: list[Duplication] = []
    refused: dict[str, float] = {}
    if copies and len(output_classes(spaces, groups, params)) > 1:  # Fig. 11b: a producer of several classes, per class
        sch, duplications, refused = duplicate_shared(sch, spaces, params, threshold)
        spaces = {s.name: s for s in spaces_of(sch)}
        groups, member_of = group_spaces(spaces, params)
    order_all = list(spaces)  # topological
    output_groups = [g for g in groups.values() if any(spaces[b].writes.buffer in params for b in g.blocks)]
    outputs = [g.anchor for g in output_groups]
    classes = output_classes(spaces, groups, params)
    sets = class_sets(spaces, groups, member_of, classes, refused)

    # the first class of equal output spaces is tiled with the tuner's sizes (sec. 5.4: its outputs share tile
    # loops); a further class gets the same sizes where its extents allow (independent groups)
    lead = spaces[classes[0][0]]
    d = len(lead.spatial)
    if tiles is None:
        tiles = default_tiles(lead)
    tiles = [int(t) for t in tiles]
    if len(tiles) != d or any(not 1 <= t <= e for t, (_, e) in zip(tiles, lead.spatial)):
        raise BastelnError(f"tiles {tiles} do not fit the output's spatial extents {[e for _, e in lead.spatial]}")

    intermediates = [g for g in groups.values() if g not in output_groups]
    analyzable = all(a.indices is not None for s in spaces.values() for a in s.reads)
    plans: list[Plan] = []
    placed: dict[str, int] = {}
    decisions: list[Decision] = []
    for ci, outs in enumerate(classes):
        mine = [g for g in intermediates if sets[g.anchor] == {ci} or ci == 0 and not sets[g.anchor]]
        if ci and not mine:  # nothing to fuse: its outputs are scheduled on their own
            continue
        anchor = spaces[outs[0]]
        class_tiles = tiles if ci == 0 else tiles_of_class(tiles, lead, anchor)
        plan = place_groups(spaces, groups, member_of, outs, class_tiles, mine, placed, threshold, analyzable)
        plans.append(plan)
        decisions.extend(plan.decisions)
    planned = {dd.group for dd in decisions}
    for group in sorted(intermediates, key=lambda g: order_all.index(g.anchor), reverse=True):
        if group.anchor in planned:
            continue
        reason = (f"shared by outputs of different spaces ({refused[group.anchor]:.2f} of it needed by several)"
                  if group.anchor in refused else "consumer")
        decisions.append(Decision(group.anchor, 0, 0.0, reason))

    _schedule(sch, spaces, groups, output_groups, plans, vector=vector, register=register,
              register2=register2, unroll=unroll, parallel=parallel, tensorize=tensorize, lanes=lanes or vector)

    return Fused(sch, outputs, plans[0].order, decisions, inlined, intermediate_bytes, scratch_bytes(sch.mod),
                 duplications)


def scratch_bytes(mod: tvm.IRModule) -> int:
    """Bytes of the intermediate buffers of `mod`'s "main" once TVM has placed each allocation at the
    innermost loop that holds all its accesses and shrunk it to what one iteration touches (the lowering
    every build runs: `PlanAndUpdateBufferAllocationLocation`, `CompactBufferAllocation`)."""
    seq = tvm.ir.transform.Sequential([s_tir.transform.LowerInitBlock(), s_tir.transform.ConvertBlocksToOpaque(),
                                       s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
                                       s_tir.transform.CompactBufferAllocation()])
    total = 0
    stack = [seq(mod)["main"].body]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        for buf in getattr(node, "alloc_buffers", ()):
            total += buffer_bytes(buf)
        for attr in ("body", "block", "then_case", "else_case", "init"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (int, float, str)):
                stack.append(child)
        stack.extend(getattr(node, "seq", ()))
    return total


def _schedule(sch: Any, spaces: dict[str, Space], groups: dict[str, Group], output_groups: list[Group],
              plans: list[Plan], *, vector: int, register: int, register2: int, unroll: int,
              parallel: bool, tensorize: bool, lanes: int) -> None:
    """The plans applied: each class's output tile loops (equal output spaces merged into one nest, sec. 5.4),
    the output groups' tails computed in the innermost tile, each fused intermediate `compute_at` its depth,
    the outermost tile loops parallel; then every block's loops inside the tiles (`schedule_blocks`)."""
    plan_of: dict[str, Plan] = {}  # every block under a plan's tile loops
    depth_of: dict[str, int] = {}  # and how many of them enclose it
    for plan in plans:
        d = len(plan.order)
        tile_loops: list[list[Any]] = []
        for name in plan.outputs:
            block = sch.get_sblock(name)
            loops = sch.get_loops(block)
            n_spatial = len(spaces[name].spatial)
            outer, inner = [], []
            for dim, loop in enumerate(loops[:n_spatial]):
                o, i = sch.split(loop, [None, plan.tiles[dim]])
                outer.append(o)
                inner.append(i)
            sch.reorder(*[outer[dim] for dim in plan.order], *inner, *loops[n_spatial:])
            tile_loops.append([outer[dim] for dim in plan.order])
        if len(tile_loops) > 1:  # equal output spaces: one tile loop nest for all (sec. 5.4)
            merged = [sch.merge(*[loops[level] for loops in tile_loops]) for level in range(d)]
            tile_loops = [merged]
        tloops = tile_loops[0]
        for group in output_groups:
            if group.anchor not in plan.outputs:
                continue
            for b in group.blocks:
                plan_of[b], depth_of[b] = plan, d
            for b in group.tail:
                sch.reverse_compute_at(sch.get_sblock(b), tloops[-1])
        for decision in plan.decisions:
            if decision.depth == 0:
                continue
            for b in reversed(groups[decision.group].blocks):
                sch.compute_at(sch.get_sblock(b), tloops[decision.depth - 1])
                plan_of[b], depth_of[b] = plan, decision.depth

        # parallel: the tile loops above every fused intermediate (all of them when nothing is fused)
        depth = min([d, *(dd.depth for dd in plan.decisions if dd.depth > 0)])
        if parallel and depth > 0:
            plan.collapsed = depth - 1
            outer = sch.fuse(*tloops[:depth]) if depth > 1 else tloops[0]
            sch.parallel(outer)
            if unroll:
                sch.annotate(outer, "pragma_auto_unroll_max_step", unroll)
                sch.annotate(outer, "pragma_unroll_explicit", 1)  # LLVM codegen ignores the implicit hint

    # the tile loops left above each block once the parallel ones are fused into one
    depths = {name: depth_of[name] - plan_of[name].collapsed if depth_of.get(name) else 0 for name in spaces}
    schedule_blocks(sch, spaces, depths, vector=vector, register=register, register2=register2,
                    parallel=parallel, tensorize=tensorize, lanes=lanes)
