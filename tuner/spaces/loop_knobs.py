"""The loop space's knob constants: tile levels, loop orders, unroll steps, placements, and the limits of a
register block (`tuner.spaces.loop.LoopSpace` documents each knob).

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_INNERMOST_FACTOR = 64  # innermost spatial and reduction tiles, as MetaSchedule's default
SPATIAL_LEVELS = 4
REDUCE_LEVELS = 2
UNROLL_STEPS = (0, 16, 64, 512)
# Loop orders, outermost first: (kind, level) tokens; every order starts with the
# spatial levels 0 and 1 (parallel loop and epilogue anchors) and ends with spatial level 3
# (vectorized).
ORDERS: tuple[tuple[tuple[str, int], ...], ...] = (
    (("S", 0), ("S", 1), ("R", 0), ("S", 2), ("R", 1), ("S", 3)),  # SSRSRS (Ansor)
    (("S", 0), ("S", 1), ("S", 2), ("R", 0), ("R", 1), ("S", 3)),  # SSSRRS
    (("S", 0), ("S", 1), ("R", 0), ("R", 1), ("S", 2), ("S", 3)),  # SSRRSS
    # reduction innermost, as TE's own loop nest: small reductions (depthwise 3x3) unrolled by LLVM;
    # level 3 is then not innermost, so `vectorize` does nothing under this order
    (("S", 0), ("S", 1), ("S", 2), ("S", 3), ("R", 0), ("R", 1)),  # SSSSRR
)
UNTUNED_ORDER = 3  # the index of SSSSRR
MAX_EPILOGUE_VECTOR = 64
MIN_PARALLEL_CHUNKS = 256  # a root block's parallel loop: outer loops fused until they make this many chunks
# where producers and the epilogue are computed: discrete choices whose effect (a fork/join less, a tile
# still in cache, a halo recomputed) the cost model learns late, so a search tries them on its best
PLACEMENT_KNOBS = ("read_at", "inline", "write_at")
# knobs added after configurations were stored: the value a configuration without one means
LATER_KNOBS: dict[str, int] = {"read_at": 0, "licm": 1, "tensorize": 0, "transpose": 0}
TENSORIZE_ORDER = 0  # SSRSRS: the only order whose inner reduction level directly holds the register block
REGISTER_ROWS = 16  # `blocked_config`'s register block: at most this many rows (and the unit's accumulators)


def placeable(levels: Sequence[int], parallel: int) -> list[int]:
    """The placements (write_at / read_at) among `levels` that do not lie inside the fused parallel loop."""
    return [level for level in levels if level == 0 or level >= max(parallel, 1)]
