"""Footprints (the paper's Alg. 2, lines 6-25): a tile box of an output -> the upward-exposed data each
buffer must hold for it (the image of the box through the consumers' read relations, a rectangular hull
as isl's box over-approximation) -> the producer instances that compute it; summed over the tiles, what a
fusion recomputes (`redundancy`).

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from .spaces import Group, Space

MAX_EXACT_TILES = 512  # footprints are summed over every tile up to this many; beyond, over a regular sample


def _clip(box: dict[str, tuple[int, int]], space: Space) -> dict[str, tuple[int, int]] | None:
    out = {}
    for var, extent in space.spatial:
        lo, hi = box[var]
        lo, hi = max(lo, 0), min(hi, extent - 1)
        if lo > hi:
            return None
        out[var] = (lo, hi)
    return out


def box_volume(box: dict[str, tuple[int, int]] | None) -> int:
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
        computed += weight * box_volume(fp.boxes(out_boxes, members).get(group.anchor))
    return max(computed / spaces[group.anchor].spatial_volume - 1.0, 0.0)
