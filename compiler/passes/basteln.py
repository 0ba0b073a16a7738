"""Tiling and fusion after the basteln strategy (Zhao et al., "Modeling the Interplay between Loop Tiling
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

Inside each tile every reduction gets a plain CPU schedule: spatial loops, then its reduction loops,
then the innermost spatial loop vectorized (optionally a register block of the next spatial loop), and
its initialization hoisted out of the reduction (`decompose_reduction`). A reduction along the innermost
dimension of one tensor (softmax's row max and row sum, layer norm's mean and variance), where vectors
over the spatial loop would gather one element a row, is split first (`rfactor`, before the analysis): a block of partial results,
one vector a row, which reads the row contiguously, and the original block reducing the lanes; both are
spaces like the others and fuse under the tiles.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import s_tir, sym, tirx

from compiler.passes.tensorize import mark, schedule_transpose

from ..tir_util import key, loop_feeds, rewrite

MAX_EXACT_TILES = 512  # footprints are summed over every tile up to this many; beyond, over a regular sample
MAX_VECTOR = 64  # the longest innermost loop vectorized


class BastelnError(ValueError):
    """A program the pass cannot tile (no output block, a non-affine access it must analyze, bad tile sizes)."""


# ---------------------------------------------------------------------------
# The program as iteration spaces.


@dataclass(frozen=True)
class Affine:
    """One index of an access region: sum(coeffs[v] * v) + const, covering `extent` consecutive values."""

    coeffs: tuple[tuple[str, int], ...]
    const: int
    extent: int

    def interval(self, box: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """The values this index takes while each variable ranges over `box` (inclusive bounds)."""
        lo = hi = self.const
        for var, c in self.coeffs:
            a, b = box[var]
            lo, hi = (lo + c * a, hi + c * b) if c >= 0 else (lo + c * b, hi + c * a)
        return lo, hi + self.extent - 1


@dataclass(frozen=True, eq=False)
class Nonlinear:
    """An index that is not affine (`ic // 16`, `ic % 16` of a blocked layout): its values over a box come
    from TVM's integer-set analysis (a hull, as for the affine ones). `coeffs` names the variables it uses
    (coefficient 0: not a plain variable)."""

    expr: Any
    variables: tuple[Any, ...]
    extent: int

    @property
    def coeffs(self) -> tuple[tuple[str, int], ...]:
        used: set[str] = set()
        _vars_of(self.expr, used)
        return tuple((v.name, 0) for v in self.variables if v.name in used)

    @property
    def const(self) -> int:
        return 0

    def interval(self, box: dict[str, tuple[int, int]]) -> tuple[int, int]:
        dom = {v: sym.IntervalSet(box[v.name][0], box[v.name][1]) for v in self.variables if v.name in box}
        found = sym.Analyzer().int_set(self.expr, dom)
        return int(found.min_value), int(found.max_value) + self.extent - 1


def _vars_of(expr: Any, out: set[str]) -> None:
    """The names of the variables in `expr` (a walk over its operands)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, tirx.Var):
            out.add(e.name)
            continue
        for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
            child = getattr(e, attr, None)
            if child is not None and not isinstance(child, (int, float, str)):
                stack.append(child)
        stack.extend(getattr(e, "args", ()) or ())


@dataclass(frozen=True)
class Access:
    """A read or write of `buffer`: one `Affine` per buffer dimension, or None where one is not affine."""

    buffer: str
    indices: tuple[Affine, ...] | None


@dataclass(frozen=True)
class Space:
    """One iteration space (a block of the root): its variables, accesses and role."""

    name: str
    spatial: tuple[tuple[str, int], ...]  # (variable, extent) in block order
    reduce: tuple[tuple[str, int], ...]
    writes: Access
    reads: tuple[Access, ...]

    @property
    def volume(self) -> int:
        """Instances of the space, reductions included."""
        return math.prod(e for _, e in self.spatial) * math.prod(e for _, e in self.reduce)

    @property
    def spatial_volume(self) -> int:
        return math.prod(e for _, e in self.spatial)

    @property
    def identity_write(self) -> bool:
        """Writes buffer[v0, v1, ...] with its spatial variables in order: a producer whose instances a
        footprint of its buffer names one for one (every block TE creates)."""
        idx = self.writes.indices
        return idx is not None and len(idx) == len(self.spatial) and all(
            a.coeffs == ((v, 1),) and a.const == 0 and a.extent == 1 for a, (v, _) in zip(idx, self.spatial))

    @property
    def elementwise(self) -> bool:
        """No reduction, an identity write, and reads indexed by plain variables (or constants)."""
        if self.reduce or not self.identity_write:
            return False
        for access in self.reads:
            if access.indices is None:
                return False
            for a in access.indices:
                if a.extent != 1 or a.const != 0 and a.coeffs or len(a.coeffs) > 1 or any(c != 1 for _, c in a.coeffs):
                    return False
        return True

    def reads_of(self, buffer: str) -> list[Access]:
        return [a for a in self.reads if a.buffer == buffer]

    def quasi_identity(self, buffer: str) -> bool:
        """Reads `buffer` exactly at its own spatial variables, in order (Definition 4.1)."""
        reads = self.reads_of(buffer)
        return bool(reads) and not self.reduce and all(
            r.indices is not None and len(r.indices) == len(self.spatial)
            and all(a.coeffs == ((v, 1),) and a.const == 0 and a.extent == 1 for a, (v, _) in zip(r.indices, self.spatial))
            for r in reads)


def _affine(region: Any, variables: list[Any]) -> tuple[Affine | Nonlinear, ...] | None:
    names = [v.name for v in variables]
    out = []
    for rng in region:
        extent = rng.extent
        if not isinstance(extent, int) and not hasattr(extent, "value"):
            return None
        coeffs = sym.detect_linear_equation(rng.min, variables)
        if len(coeffs) != len(variables) + 1 or not all(hasattr(c, "value") for c in coeffs):
            out.append(Nonlinear(rng.min, tuple(variables), int(extent if isinstance(extent, int) else extent.value)))
            continue
        terms = tuple((n, int(c.value)) for n, c in zip(names, coeffs[:-1]) if int(c.value) != 0)
        out.append(Affine(terms, int(coeffs[-1].value), int(extent if isinstance(extent, int) else extent.value)))
    return tuple(out)


def spaces_of(sch: tvm.s_tir.Schedule) -> list[Space]:
    """The iteration spaces of the root's child blocks, in program (topological) order."""
    allocated = list(sch.get(sch.get_sblock("root")).alloc_buffers)

    def label(buf: Any) -> str:  # TE reuses names (two convs' "pad_temp"): intermediates are told apart by slot
        return next((f"{buf.name}@{i}" for i, a in enumerate(allocated) if a.same_as(buf)), buf.name)

    out = []
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        variables = [iv.var for iv in block.iter_vars]
        spatial, reduce = [], []
        for iv in block.iter_vars:
            extent = iv.dom.extent
            if not hasattr(extent, "value"):
                raise BastelnError(f"block {block.name_hint}: iteration variable {iv.var} has a symbolic extent")
            kind = reduce if iv.iter_type == tirx.IterVar.CommReduce else spatial
            kind.append((iv.var.name, int(extent.value)))
        if len(block.writes) != 1:
            raise BastelnError(f"block {block.name_hint} writes {len(block.writes)} buffers; one is expected")
        w = block.writes[0]
        reads = tuple(Access(label(r.source), _affine(r.region, variables)) for r in block.reads)
        write = Access(label(w.source), _affine(w.region, variables))
        # a block whose variables come in another order than the dimensions it writes (`rfactor`'s partial
        # block puts the lanes first): its spatial variables in the order of what it writes
        named = [a.coeffs[0][0] if a.coeffs and len(a.coeffs) == 1 and a.coeffs[0][1] == 1 and not a.const
                 and a.extent == 1 else None for a in write.indices or ()]
        if sorted(filter(None, named)) == sorted(v for v, _ in spatial) and len(named) == len(spatial):
            spatial = sorted(spatial, key=lambda ve: named.index(ve[0]))
        out.append(Space(block.name_hint, tuple(spatial), tuple(reduce), write, reads))
    return out


# ---------------------------------------------------------------------------
# The plan: groups, tile loops, fusion decisions.


@dataclass
class Group:
    """Spaces scheduled together (Alg. 1): an anchor and the element-wise blocks that follow it."""

    anchor: str
    tail: list[str] = field(default_factory=list)

    @property
    def blocks(self) -> list[str]:
        return [self.anchor, *self.tail]


@dataclass(frozen=True)
class Decision:
    """Where an intermediate group went and why.

    Attributes:
        group: its anchor block.
        depth: how many output tile loops enclose it (0: not fused, computed whole on its own).
        redundancy: the fraction of its instances computed more than once at that depth (0 = none).
        reason: why it is not deeper ("threshold", "m > n", "consumer", "not affine", ...).
    """

    group: str
    depth: int
    redundancy: float
    reason: str


@dataclass(frozen=True)
class Duplication:
    """A producer that outputs of different spaces read, computed once per class of outputs (Fig. 11b).

    Attributes:
        group: its anchor block (the first class's).
        copies: the anchors of its copies, one per further class, each computed under that class's tile loops.
        overlap: the fraction of its instances that more than one class needs (0: the parts do not intersect
            and the copies recompute nothing; the sum of the pairwise intersections of the parts' hulls).
    """

    group: str
    copies: tuple[str, ...]
    overlap: float


@dataclass
class Fused:
    """The result of `basteln`: the schedule and what the pass decided.

    Attributes:
        sch: the scheduled program.
        outputs: the anchors of the output groups (tiled with the tuner's tile sizes).
        tile_order: the output anchor's spatial dimensions in tile-loop order.
        decisions: one per intermediate group, in the order they were placed.
        inlined: element-wise blocks inlined into their consumers (Alg. 5).
        intermediate_bytes: bytes of every intermediate buffer before the pass.
        scratch_bytes: bytes the intermediates occupy after it (a fused one: its per-tile footprint).
        duplications: producers copied for outputs of different spaces (sec. 5.3, Fig. 11b).
    """

    sch: tvm.s_tir.Schedule
    outputs: list[str]
    tile_order: list[int]
    decisions: list[Decision]
    inlined: list[str]
    intermediate_bytes: int
    scratch_bytes: int
    duplications: list[Duplication] = field(default_factory=list)

    @property
    def fused(self) -> list[str]:
        return [d.group for d in self.decisions if d.depth > 0]


def _consumers(spaces: dict[str, Space], name: str) -> list[str]:
    buf = spaces[name].writes.buffer
    return [s.name for s in spaces.values() if s.name != name and any(r.buffer == buf for r in s.reads)]


def _producer(spaces: dict[str, Space], buffer: str) -> str | None:
    return next((s.name for s in spaces.values() if s.writes.buffer == buffer), None)


def _reuse(consumer: Space, buffer: str, producer: Space) -> float:
    """How many times `consumer` reads each element of `buffer` on average (1: once)."""
    return len(consumer.reads_of(buffer)) * consumer.volume / max(producer.spatial_volume, 1)


# ---------------------------------------------------------------------------
# Footprints (Alg. 2): tile box -> upward-exposed data -> producer instances.


def _clip(box: dict[str, tuple[int, int]], space: Space) -> dict[str, tuple[int, int]] | None:
    out = {}
    for var, extent in space.spatial:
        lo, hi = box[var]
        lo, hi = max(lo, 0), min(hi, extent - 1)
        if lo > hi:
            return None
        out[var] = (lo, hi)
    return out


def _box_volume(box: dict[str, tuple[int, int]] | None) -> int:
    return 0 if box is None else math.prod(hi - lo + 1 for lo, hi in box.values())


class Footprints:
    """The instances of each fused space that one tile of the output needs (rectangular hulls)."""

    def __init__(self, spaces: dict[str, Space], outputs: list[str]):
        self.spaces = spaces
        self.outputs = outputs

    def boxes(self, output_boxes: dict[str, dict[str, tuple[int, int]]], members: Sequence[str]) -> dict:
        """Spatial boxes of every space in `members` (reverse topological order) for one tile.

        `output_boxes`: the spatial box of each output anchor in this tile; a member's box is the hull
        of what its consumers among the boxed spaces read of its buffer, mapped back through its
        identity write. A member no boxed consumer reads gets no box.
        """
        boxes: dict[str, dict[str, tuple[int, int]] | None] = dict(output_boxes)
        for name in members:
            space = self.spaces[name]
            hull: list[tuple[int, int]] | None = None
            for cname, cbox in list(boxes.items()):
                if cbox is None or cname == name:
                    continue
                consumer = self.spaces[cname]
                full = {**cbox, **{v: (0, e - 1) for v, e in consumer.reduce}}
                for access in consumer.reads_of(space.writes.buffer):
                    assert access.indices is not None, f"{cname} reads {space.writes.buffer} non-affinely"
                    ivs = [a.interval(full) for a in access.indices]
                    hull = ivs if hull is None else [(min(a, c), max(b, d)) for (a, b), (c, d) in zip(hull, ivs)]
            boxes[name] = None if hull is None else _clip({v: iv for (v, _), iv in zip(space.spatial, hull)}, space)
        return boxes


def _tile_positions(counts: Sequence[int]) -> tuple[list[tuple[int, ...]], float]:
    """Every tile position, or a regular sample of them and the weight each stands for."""
    total = math.prod(counts)
    if total <= MAX_EXACT_TILES:
        return list(itertools.product(*(range(c) for c in counts))), 1.0
    per_dim = max(2, int(MAX_EXACT_TILES ** (1 / max(len(counts), 1))))
    axes = [sorted({round(i * (c - 1) / max(per_dim - 1, 1)) for i in range(min(per_dim, c))}) for c in counts]
    sample = list(itertools.product(*axes))
    return sample, total / len(sample)


# ---------------------------------------------------------------------------
# The pass.


def _tile_box(anchor: Space, order: Sequence[int], tiles: Sequence[int], depth: int,
              position: Sequence[int]) -> dict[str, tuple[int, int]]:
    box = {v: (0, e - 1) for v, e in anchor.spatial}
    for level, dim in enumerate(order[:depth]):
        var, extent = anchor.spatial[dim]
        lo = position[level] * tiles[dim]
        box[var] = (lo, min(lo + tiles[dim], extent) - 1)
    return box


def redundancy(spaces: dict[str, Space], outputs: Sequence[str], order: Sequence[int], tiles: Sequence[int],
               depth: int, members: Sequence[str], group: Group) -> float:
    """The fraction of `group`'s anchor instances computed more than once when every space in `members`
    (reverse topological order, `group`'s blocks among them) is computed inside the first `depth` tile
    loops of the outputs: sum over tiles of the footprint / its whole space - 1."""
    anchor = spaces[outputs[0]]
    counts = [math.ceil(anchor.spatial[d][1] / tiles[d]) for d in order[:depth]]
    positions, weight = _tile_positions(counts)
    fp = Footprints(spaces, list(outputs))
    computed = 0.0
    for position in positions:
        out_boxes = {o: _tile_box(spaces[o], order, tiles, depth, position) for o in outputs}
        computed += weight * _box_volume(fp.boxes(out_boxes, members).get(group.anchor))
    return max(computed / spaces[group.anchor].spatial_volume - 1.0, 0.0)


def _groups(spaces: dict[str, Space], params: set[str]) -> tuple[dict[str, Group], dict[str, str]]:
    """Alg. 1: a reduction and the element-wise consumer that alone reads it, by a quasi-identity, are one
    group; returns the groups by anchor and the anchor of each block's group."""
    groups: dict[str, Group] = {}
    member_of: dict[str, str] = {}
    for name in spaces:  # topological
        if name in member_of:
            continue
        group = Group(name)
        last = name
        while spaces[name].reduce or group.tail:
            consumers = _consumers(spaces, last)
            if len(consumers) != 1 or not spaces[consumers[0]].quasi_identity(spaces[last].writes.buffer):
                break
            if [e for _, e in spaces[consumers[0]].spatial] != [e for _, e in spaces[last].spatial]:
                break  # it reads a part (a slice): the whole would be computed for it
            nxt = consumers[0]
            if not spaces[nxt].elementwise or spaces[last].writes.buffer in params:
                break
            group.tail.append(nxt)
            last = nxt
            if spaces[nxt].writes.buffer in params:
                break
        groups[name] = group
        for b in group.blocks:
            member_of[b] = name
    return groups, member_of


def _output_classes(spaces: dict[str, Space], groups: dict[str, Group], params: set[str]) -> list[list[str]]:
    """The anchors of the output groups, in classes of equal spatial extents (the first output's class first)."""
    classes: list[list[str]] = []
    for group in groups.values():
        if not any(spaces[b].writes.buffer in params for b in group.blocks):
            continue
        extents = [e for _, e in spaces[group.anchor].spatial]
        same = next((c for c in classes if [e for _, e in spaces[c[0]].spatial] == extents), None)
        if same is None:
            classes.append([group.anchor])
        else:
            same.append(group.anchor)
    return classes


SHARED = -1  # in a class set: a consumer is computed whole, for several classes, so this group is too


def _class_sets(spaces: dict[str, Space], groups: dict[str, Group], member_of: dict[str, str],
                classes: list[list[str]], refused: dict[str, float]) -> dict[str, frozenset[int]]:
    """For each group (by anchor): the classes of outputs that read what it computes, through any chain of
    intermediates; `SHARED` where a consumer is computed once for several classes (`refused`)."""
    class_of = {a: i for i, c in enumerate(classes) for a in c}
    order = list(spaces)
    sets: dict[str, frozenset[int]] = {}
    for anchor in sorted(groups, key=order.index, reverse=True):
        if anchor in class_of:
            sets[anchor] = frozenset([class_of[anchor]])
            continue
        owners = {member_of[c] for b in groups[anchor].blocks for c in _consumers(spaces, b)} - {anchor}
        found = frozenset().union(*(sets[o] for o in owners))
        if any(o in refused or SHARED in sets[o] for o in owners):
            found = frozenset([SHARED])
        sets[anchor] = found
    return sets


def _default_tiles(anchor: Space) -> list[int]:
    """1 for every spatial dimension but the last two, whole for those."""
    d = len(anchor.spatial)
    return [1] * max(d - 2, 0) + [e for _, e in anchor.spatial[max(d - 2, 0):]]


def _class_tiles(tiles: Sequence[int], lead: Space, anchor: Space) -> list[int]:
    """The tile sizes of a further class of outputs: the first class's where it has as many dimensions (each
    clipped to its extent: independent groups with equal tile sizes, sec. 5.4; a dimension the first class
    takes whole is whole here too), else the default."""
    if len(anchor.spatial) != len(lead.spatial):
        return _default_tiles(anchor)
    return [e if int(t) == le else min(int(t), e) for t, (_, le), (_, e) in zip(tiles, lead.spatial, anchor.spatial)]


@dataclass
class _Plan:
    """One class of equal output spaces: its tile loops and the intermediates placed under them."""

    outputs: list[str]
    tiles: list[int]
    order: list[int]
    decisions: list[Decision]
    collapsed: int = 0  # tile loops fused into the parallel one


def _place(spaces: dict[str, Space], groups: dict[str, Group], member_of: dict[str, str], outputs: list[str],
           tiles: list[int], intermediates: list[Group], placed: dict[str, int], threshold: float,
           analyzable: bool) -> _Plan:
    """Alg. 2 and 3 for one class of outputs: the tile-loop order, then each intermediate group placed at
    the deepest tile loop where the m > n rule holds and its recomputed fraction is within `threshold`;
    `placed` gets each placed block's depth."""
    lead = spaces[outputs[0]]
    d = len(lead.spatial)
    order_all = list(spaces)
    reverse_topo = sorted(intermediates, key=lambda g: order_all.index(g.anchor), reverse=True)
    all_members = [b for g in reverse_topo for b in reversed(g.blocks)]

    # tile-loop order: the dimensions that the footprints of the most intermediates follow come first (a
    # conv's output channels, which no input footprint follows, last), so that fusing under them recomputes least
    def followers(dim: int) -> int:
        var, extent = lead.spatial[dim]
        if extent == 1 or not intermediates:
            return len(intermediates)  # a unit loop costs nothing anywhere
        if not analyzable:  # a read without index forms: only the outputs' own reads tell
            return sum(1 for g in intermediates for b in g.blocks for a in lead.reads_of(spaces[b].writes.buffer)
                       if a.indices and any(var in dict(x.coeffs) for x in a.indices))
        out_boxes = {}
        for o in outputs:
            box = {v: (0, e - 1) for v, e in spaces[o].spatial}
            box[spaces[o].spatial[dim][0]] = (0, 0)
            out_boxes[o] = box
        boxes = Footprints(spaces, outputs).boxes(out_boxes, all_members)
        return sum(1 for g in intermediates
                   if boxes.get(g.anchor) is not None and _box_volume(boxes[g.anchor]) < spaces[g.anchor].spatial_volume)
    tile_order = sorted(range(d), key=lambda dim: (-followers(dim), dim))

    # place each intermediate group, closest to the outputs first
    for o in outputs:
        placed[o] = d
    members: list[str] = []  # fused blocks, reverse topological
    decisions: list[Decision] = []
    for group in reverse_topo:
        anchor = spaces[group.anchor]
        blocks_rev = list(reversed(group.blocks))
        consumers = {c for b in group.blocks for c in _consumers(spaces, b)} - set(group.blocks)
        owners = {member_of[c] for c in consumers}
        limit = min((placed.get(o, 0) for o in owners), default=0)
        reason = "consumer" if limit == 0 else ""
        if not all(a.indices is not None for c in consumers for a in spaces[c].reads_of(spaces[group.tail[-1] if group.tail else group.anchor].writes.buffer)) \
                or not all(spaces[b].identity_write for b in group.blocks):
            limit, reason = 0, "not affine"
        best, best_r = 0, 0.0
        for depth in range(limit, 0, -1):
            m = sum(1 for dim in tile_order[:depth] if tiles[dim] < lead.spatial[dim][1])
            if m > len(anchor.spatial):  # the paper's m > n: fewer parallel loops than the tile loops above
                reason = reason or "m > n"
                continue
            if m == 0:  # no loop above is tiled: fusing gains no locality and takes the outputs' parallel loops
                reason = reason or "no tiled loop above"
                break
            r = redundancy(spaces, outputs, tile_order, tiles, depth, [*members, *blocks_rev], group)
            n_tiles = math.prod(math.ceil(lead.spatial[dim][1] / tiles[dim]) for dim in tile_order[:depth])
            if n_tiles > 1 and r >= n_tiles - 1 - 1e-9:  # every tile needs all of it (a weight's conversion)
                reason = reason or "every tile needs all of it"
                break
            if r <= threshold + 1e-9:
                best, best_r = depth, r
                break
            reason = reason or f"threshold ({r:.2f} recomputed at depth {depth})"
        if best:
            for b in group.blocks:
                placed[b] = best
            members.extend(blocks_rev)
        decisions.append(Decision(group.anchor, best, best_r, reason if best < d else ""))
    return _Plan(list(outputs), list(tiles), tile_order, decisions)


# ---------------------------------------------------------------------------
# Fig. 11(b): a producer shared by outputs of different spaces, computed per class of outputs.


def _duplicate_shared(sch: Any, spaces: dict[str, Space], params: set[str],
                      threshold: float) -> tuple[Any, list[Duplication], dict[str, float]]:
    """Copies each intermediate group that outputs of several classes read, one copy per further class, when
    the parts the classes need intersect in at most `threshold` of its instances (sec. 5.3: disjoint parts
    cost nothing; 5.4: a threshold allows some redundancy); each class's consumers then read their own copy,
    which post-tiling fusion places under that class's tile loops. The groups closest to the outputs go
    first, so that a copied group's producers are shared by its copies in turn.

    Returns the new schedule, the copies made, and the groups left shared with the fraction that refused them.
    """
    duplications: list[Duplication] = []
    refused: dict[str, float] = {}
    if not all(a.indices is not None for s in spaces.values() for a in s.reads):
        return sch, duplications, refused  # a read without index forms: the parts cannot be told apart
    while True:
        groups, member_of = _groups(spaces, params)
        classes = _output_classes(spaces, groups, params)
        sets = _class_sets(spaces, groups, member_of, classes, refused)
        order = list(spaces)
        candidates = [a for a, s in sets.items() if len(s) > 1 and SHARED not in s and a not in refused]
        if not candidates:
            return sch, duplications, refused
        anchor = max(candidates, key=order.index)
        group = groups[anchor]
        in_classes = sorted(sets[anchor])
        output_blocks = {b for c in classes for a in c for b in groups[a].blocks}
        members = [b for b in reversed(order) if b not in output_blocks]
        parts = []
        for ci in in_classes:
            boxes = Footprints(spaces, classes[ci]).boxes(
                {o: {v: (0, e - 1) for v, e in spaces[o].spatial} for o in classes[ci]}, members)
            parts.append(boxes.get(anchor))
        overlap = sum(_box_volume(_intersect(a, b)) for a, b in itertools.combinations(parts, 2))
        overlap /= spaces[anchor].spatial_volume
        if overlap > threshold + 1e-9 or not all(spaces[b].identity_write for b in group.blocks):
            refused[anchor] = overlap
            continue
        func = sch.mod["main"]
        names = set(order)
        copies = []
        for ci in in_classes[1:]:
            readers = [c for b in group.blocks for c in _consumers(spaces, b)
                       if c not in group.blocks and sets[member_of[c]] == {ci}]
            suffix = next(f"_copy{k}" for k in itertools.count(ci) if not names & {b + f"_copy{k}" for b in group.blocks})
            try:
                func = _copy_blocks(func, group.blocks, readers, suffix)
            except BastelnError:  # a block that is not one store (the copy would have to understand it)
                break
            names |= {b + suffix for b in group.blocks}
            copies.append(anchor + suffix)
        else:
            sch = s_tir.Schedule(func)
            spaces = {s.name: s for s in spaces_of(sch)}
            duplications.append(Duplication(anchor, tuple(copies), overlap))
            continue
        refused[anchor] = overlap


def _intersect(a: dict[str, tuple[int, int]] | None, b: dict[str, tuple[int, int]] | None) -> dict | None:
    if a is None or b is None:
        return None
    out = {}
    for var, (lo, hi) in a.items():
        lo, hi = max(lo, b[var][0]), min(hi, b[var][1])
        if lo > hi:
            return None
        out[var] = (lo, hi)
    return out


def _block_of(stmt: Any) -> Any:
    """The block of a root-level loop nest."""
    while isinstance(stmt, tirx.For):
        stmt = stmt.body
    return stmt.block


def _copy_blocks(func: Any, blocks: Sequence[str], readers: Sequence[str], suffix: str) -> Any:
    """`func` with the root-level blocks `blocks` (a group, in order) copied: new loop and block variables,
    names with `suffix`, each writing a new buffer of its own; the blocks `readers` read the copies' buffers
    instead of the originals'. The copies come right after the last of `blocks`."""
    realize = func.body
    root = realize.block
    seq = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    names = [_block_of(s).name_hint for s in seq]
    buffers: dict[int, Any] = {}
    new_buffers = []
    for b in blocks:
        old = _block_of(seq[names.index(b)]).writes[0].source
        new = tirx.decl_buffer(old.shape, str(old.dtype), old.name + suffix, scope=old.scope())
        buffers[key(old)] = new
        new_buffers.append(new)
    copies = [_copy_nest(seq[names.index(b)], buffers, suffix) for b in blocks]
    out = []
    last = max(names.index(b) for b in blocks)
    for i, stmt in enumerate(seq):
        out.append(_copy_nest(stmt, buffers, None) if names[i] in readers else stmt)
        if i == last:
            out.extend(copies)
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, tirx.SeqStmt(out), root.init,
                            [*root.alloc_buffers, *new_buffers], root.match_buffers, root.annotations)
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_root))


def _copy_nest(stmt: Any, buffers: dict[int, Any], suffix: str | None) -> Any:
    """A root-level loop nest of one block with the buffers in `buffers` (by handle) replaced; with a
    `suffix`, a copy of it: new loop and block variables, the block renamed."""
    fresh = suffix is not None
    variables: dict[int, Any] = {}

    def fn(x: Any) -> Any | None:
        if isinstance(x, tvm.ir.expr.Var):
            return variables.get(key(x), x)
        if isinstance(x, tvm.ir.TensorLoad):
            source = buffers.get(key(x.source), x.source)
            return tirx.BufferLoad(source, [expr(i) for i in x.indices])
        return None

    def expr(e: Any) -> Any:
        return rewrite(e, fn)

    def var(v: Any) -> Any:
        if not fresh:
            return v
        variables[key(v)] = new = tirx.Var(v.name, v.ty)
        return new

    def region(r: Any) -> Any:
        return tirx.BufferRegion(buffers.get(key(r.source), r.source),
                                 [tvm.ir.Range.from_min_extent(expr(x.min), expr(x.extent)) for x in r.region])

    def store(s: Any) -> Any:
        if not isinstance(s, tirx.BufferStore):
            raise BastelnError(f"cannot copy a block whose body is a {type(s).__name__}")
        return tirx.BufferStore(buffers.get(key(s.buffer), s.buffer), expr(s.value), [expr(i) for i in s.indices])

    def go(x: Any) -> Any:
        if isinstance(x, tirx.For):
            loop_var = var(x.loop_var)
            return tirx.For(loop_var, expr(x.min), expr(x.extent), x.kind, go(x.body), x.thread_binding,
                            x.annotations, x.step)
        b = x.block
        values = [expr(v) for v in x.iter_values]
        iter_vars = [tirx.IterVar(tvm.ir.Range.from_min_extent(expr(iv.dom.min), expr(iv.dom.extent)), var(iv.var),
                                  iv.iter_type) for iv in b.iter_vars]
        block = s_tir.SBlock(iter_vars, [region(r) for r in b.reads], [region(r) for r in b.writes],
                             b.name_hint + (suffix or ""), store(b.body), None if b.init is None else store(b.init),
                             b.alloc_buffers, b.match_buffers, b.annotations)
        return s_tir.SBlockRealize(values, expr(x.predicate), block)

    return go(stmt)


def _nbytes(buffer: Any) -> int:
    return math.prod(int(d) for d in buffer.shape) * ((buffer.dtype.bits * buffer.dtype.lanes + 7) // 8)


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
    intermediate_bytes = sum(_nbytes(b) for b in root.alloc_buffers)
    spaces = {s.name: s for s in spaces_of(sch)}
    # the function's own buffers: everything the blocks write that the root does not allocate
    params = {s.writes.buffer for s in spaces.values() if "@" not in s.writes.buffer}

    # Alg. 5: element-wise inlining
    inlined: list[str] = []
    for name in list(spaces):
        space = spaces[name]
        if not space.elementwise or space.writes.buffer in params:
            continue
        consumers = _consumers(spaces, name)
        if not consumers or sum(_reuse(spaces[c], space.writes.buffer, space) for c in consumers) > 1.0 + 1e-9:
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
    if any([_rfactor_rows(sch, name, space, vector) for name, space in spaces.items() if _reduces_along_rows(space)]):
        spaces = {s.name: s for s in spaces_of(sch)}

    groups, member_of = _groups(spaces, params)
    duplications: list[Duplication] = []
    refused: dict[str, float] = {}
    if copies and len(_output_classes(spaces, groups, params)) > 1:  # Fig. 11b: a producer of several classes, per class
        sch, duplications, refused = _duplicate_shared(sch, spaces, params, threshold)
        spaces = {s.name: s for s in spaces_of(sch)}
        groups, member_of = _groups(spaces, params)
    order_all = list(spaces)  # topological
    output_groups = [g for g in groups.values() if any(spaces[b].writes.buffer in params for b in g.blocks)]
    outputs = [g.anchor for g in output_groups]
    classes = _output_classes(spaces, groups, params)
    sets = _class_sets(spaces, groups, member_of, classes, refused)

    # the first class of equal output spaces is tiled with the tuner's sizes (sec. 5.4: its outputs share tile
    # loops); a further class gets the same sizes where its extents allow (independent groups)
    lead = spaces[classes[0][0]]
    d = len(lead.spatial)
    if tiles is None:
        tiles = _default_tiles(lead)
    tiles = [int(t) for t in tiles]
    if len(tiles) != d or any(not 1 <= t <= e for t, (_, e) in zip(tiles, lead.spatial)):
        raise BastelnError(f"tiles {tiles} do not fit the output's spatial extents {[e for _, e in lead.spatial]}")

    intermediates = [g for g in groups.values() if g not in output_groups]
    analyzable = all(a.indices is not None for s in spaces.values() for a in s.reads)
    plans: list[_Plan] = []
    placed: dict[str, int] = {}
    decisions: list[Decision] = []
    for ci, outs in enumerate(classes):
        mine = [g for g in intermediates if sets[g.anchor] == {ci} or ci == 0 and not sets[g.anchor]]
        if ci and not mine:  # nothing to fuse: its outputs are scheduled on their own
            continue
        anchor = spaces[outs[0]]
        class_tiles = tiles if ci == 0 else _class_tiles(tiles, lead, anchor)
        plan = _place(spaces, groups, member_of, outs, class_tiles, mine, placed, threshold, analyzable)
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
            total += _nbytes(buf)
        for attr in ("body", "block", "then_case", "else_case", "init"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (int, float, str)):
                stack.append(child)
        stack.extend(getattr(node, "seq", ()))
    return total


def _schedule(sch: Any, spaces: dict[str, Space], groups: dict[str, Group], output_groups: list[Group],
              plans: list[_Plan], *, vector: int, register: int, register2: int, unroll: int,
              parallel: bool, tensorize: bool, lanes: int) -> None:
    plan_of: dict[str, _Plan] = {}  # every block under a plan's tile loops
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

    for name, space in spaces.items():
        try:
            block = sch.get_sblock(name)
        except Exception:  # inlined
            continue
        fused_depth = depth_of.get(name, 0)
        if fused_depth:
            fused_depth -= plan_of[name].collapsed
        _inner(sch, block, space, fused_depth, vector=vector, register=register, register2=register2,
               parallel=parallel and fused_depth == 0, tensorize=tensorize, lanes=lanes)


def _extent(loop: Any, sch: Any) -> int | None:
    ext = sch.get(loop).extent
    return int(ext.value) if hasattr(ext, "value") else None


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
        fit = _vector_fit(_extent(last, sch) or 0, vector)
        if fit:  # a row longer than a vector: its vectors are a loop outside the reduction (a register block's)
            outer, last = sch.split(last, [None, fit])
            pre.append(outer)
        bound = loop_feeds(sch, block, pre)
        at = _register_dim(space, bound)
        # a second register dimension, the innermost other loop: an outer product of both blocks
        at2 = next((i for i in range(len(pre) - 1, -1, -1) if i != at and bound[i] and (_extent(pre[i], sch) or 0) > 1),
                   None) if at is not None and register2 > 1 else None
        blocks: dict[int, Any] = {}
        for index, want in ((at, register), (at2, register2)):
            if index is None:
                continue
            extent = _extent(pre[index], sch) or 0
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
            reduce = sorted(reduce, key=lambda loop: _extent(loop, sch) or 0)
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


def _reduces_along_rows(space: Space) -> bool:
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


def _rfactor_rows(sch: Any, name: str, space: Space, vector: int) -> bool:
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
    extent = _extent(loop, sch)
    if extent is None or extent <= 1:
        return
    try:
        if extent > vector:
            _, loop = sch.split(loop, [None, _vector_fit(extent, vector) or vector])
        sch.vectorize(loop)
    except Exception:  # a loop with a predicate or a dependence TVM refuses to vectorize stays scalar
        pass
