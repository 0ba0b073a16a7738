"""Where ALT's search starts, beyond the paper: a oneDNN-like first layout (`first_layout`) and, in a
layout's first round, known loop nests (`loop_seeds`: the untuned nest, register blocking). The paper's
search starts from its agents' draws; these seeds are ours, and `ALTSearch(seeds=False)` turns them off.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import logging
from typing import Any

from compiler.layout import GROUP_PARAM, OUTER_SUFFIX
from compiler.target import VectorUnit, vector_unit

from ..spaces.base import Config, InvalidConfig
from ..spaces.divisors import divisors
from ..spaces.layout import TIED
from ..spaces.loop_knobs import REGISTER_ROWS
from .alt_points import LayoutPoint

log = logging.getLogger("tuner.searches.alt")


def first_layout(template: Any, unit: VectorUnit | None = None) -> dict[str, int]:
    """A oneDNN-like starting point for a vector `unit` (this machine's when None): channel tiles of one
    vector, a short tile of the last spatial axis whose register row the unit's accumulators hold.

    The row tile is the one of 4-16 outputs whose `blocked_config` register block holds the most rows (the
    largest divisor within `REGISTER_ROWS` and the accumulators), the longer tile where they tie: 14 with
    AVX-512's 28 accumulators, but 8 of a 56-wide row with AVX2's 12, where 14 holds only 7 rows (conv2d_resnet's
    seed on znver3: 1.5-1.7 ms in `N H W/8 O/8 8 8`, 1.9-2.5 ms in `N H W/14 O/8 14 8`; 7 accumulators are fewer
    than two FMA pipes of 4 cycles' latency keep busy).

    A GEMM's weight is packed as BLAS packs it, in panels of `nt` columns each contiguous along the whole
    reduction (`kt` = K: `K/K N/16 K 16`); with `kt` 1 (`K N/16 16`) a panel's rows lie a whole row of the
    weight apart, 2 KiB on the 512^3 GEMM, all in two of L1's 64 sets: its blocked seed ran 3.4 ms there
    against 1.8 ms with the panels contiguous (cascadelake). The dot-product form packs its own panels.
    """
    unit = vector_unit() if unit is None else unit
    dot = any(p.name == GROUP_PARAM for p in template.params)
    choice = {}
    for p in template.params:
        if p.name in TIED:
            continue
        if p.name == GROUP_PARAM:  # the dot-product form's one group
            choice[p.name] = max(p.candidates)
            continue
        if p.name in ("ot", "it", "nt"):
            limit = unit.lanes
        elif p.name == "mt":
            limit = 8
        elif p.name == "kt" and template.kind == "gemm" and not dot:
            limit = p.extent
        else:
            limit = 1
        choice[p.name] = max((c for c in p.candidates if c <= limit), default=min(p.candidates))
    spatial = [p for p in template.params if p.tensor == "output" and p.name not in ("ot", "mt", "nt")
               and not p.name.endswith(OUTER_SUFFIX)]  # second-level factors start at 1
    if spatial:  # the innermost spatial axis: a register row of 4-16 outputs
        last = spatial[-1]
        rows = min(REGISTER_ROWS, unit.accumulators)

        def held(tile: int) -> tuple[int, int]:
            return max(d for d in divisors(tile) if d <= rows), tile

        fits = [c for c in last.candidates if 4 <= c <= 16] or [1]
        choice[last.name] = max(fits, key=held)
    return choice


def loop_seeds(p: LayoutPoint, blocked: bool) -> list[tuple[Config, str]]:
    """The known loop nests of a layout's first round, with their sources: in the user's layouts
    `untuned_config` ("untuned": small memory-bound operators run fastest so); where `blocked`,
    `blocked_config` ("blocked"): in the user's layouts both ways, vectors and a column of scalars (register
    blocking of the rows, as a depthwise conv wants), in a tiled layout with one output vector and, where it
    differs, with several."""
    seeds = [(p.space.untuned_config(), "untuned")] if p.identity else []
    if blocked:
        try:
            seeds.append((p.space.blocked_config(), "blocked"))
            # in the user's layouts also the other register block (a column of scalar accumulators, or
            # vectors): the layout has one round to show what it can do before the joint stage moves
            # on, and a strided depthwise conv runs 4.6x faster in the column (0.38 vs 1.75 ms)
            if p.identity:
                other = p.space.blocked_config(column=bool(seeds[-1][0]["vectorize"]))
                if other != seeds[-1][0]:
                    seeds.append((other, "blocked"))
            else:  # and the register block of several output vectors, where it holds more sums (a GEMM's)
                wide = p.space.blocked_config(wide=True)
                if wide != seeds[-1][0]:
                    seeds.append((wide, "blocked"))
        except InvalidConfig as e:
            log.info("no blocked loop nest in %s: %s", p.name, e)
    return seeds
