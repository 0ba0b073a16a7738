"""The plan of basteln's tiling and fusion: groups of spaces (Alg. 1, pre-tiling fusion), classes of outputs
(Alg. 4, sec. 5.3-5.4), the tile sizes of each class, and where each intermediate group is fused (Alg. 3,
post-tiling fusion: the deepest tile loop where the m > n rule and the redundancy threshold hold);
`Fused` is the pass's result.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm

from .footprints import Footprints, box_volume, redundancy
from .spaces import Group, Space, consumers_of


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


def group_spaces(spaces: dict[str, Space], params: set[str]) -> tuple[dict[str, Group], dict[str, str]]:
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
            consumers = consumers_of(spaces, last)
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


def output_classes(spaces: dict[str, Space], groups: dict[str, Group], params: set[str]) -> list[list[str]]:
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


def class_sets(spaces: dict[str, Space], groups: dict[str, Group], member_of: dict[str, str],
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
        owners = {member_of[c] for b in groups[anchor].blocks for c in consumers_of(spaces, b)} - {anchor}
        found = frozenset().union(*(sets[o] for o in owners))
        if any(o in refused or SHARED in sets[o] for o in owners):
            found = frozenset([SHARED])
        sets[anchor] = found
    return sets


def default_tiles(anchor: Space) -> list[int]:
    """1 for every spatial dimension but the last two, whole for those."""
    d = len(anchor.spatial)
    return [1] * max(d - 2, 0) + [e for _, e in anchor.spatial[max(d - 2, 0):]]


def tiles_of_class(tiles: Sequence[int], lead: Space, anchor: Space) -> list[int]:
    """The tile sizes of a further class of outputs: the first class's where it has as many dimensions (each
    clipped to its extent: independent groups with equal tile sizes, sec. 5.4; a dimension the first class
    takes whole is whole here too), else the default."""
    if len(anchor.spatial) != len(lead.spatial):
        return default_tiles(anchor)
    return [e if int(t) == le else min(int(t), e) for t, (_, le), (_, e) in zip(tiles, lead.spatial, anchor.spatial)]


@dataclass
class Plan:
    """One class of equal output spaces: its tile loops and the intermediates placed under them."""

    outputs: list[str]
    tiles: list[int]
    order: list[int]
    decisions: list[Decision]
    collapsed: int = 0  # tile loops fused into the parallel one


def place_groups(spaces: dict[str, Space], groups: dict[str, Group], member_of: dict[str, str], outputs: list[str],
           tiles: list[int], intermediates: list[Group], placed: dict[str, int], threshold: float,
           analyzable: bool) -> Plan:
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
                   if boxes.get(g.anchor) is not None and box_volume(boxes[g.anchor]) < spaces[g.anchor].spatial_volume)
    tile_order = sorted(range(d), key=lambda dim: (-followers(dim), dim))

    # place each intermediate group, closest to the outputs first
    for o in outputs:
        placed[o] = d
    members: list[str] = []  # fused blocks, reverse topological
    decisions: list[Decision] = []
    for group in reverse_topo:
        anchor = spaces[group.anchor]
        blocks_rev = list(reversed(group.blocks))
        consumers = {c for b in group.blocks for c in consumers_of(spaces, b)} - set(group.blocks)
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
    return Plan(list(outputs), list(tiles), tile_order, decisions)
