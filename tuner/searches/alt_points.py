"""What ALT's search keeps per layout (`LayoutPoint`) and the helpers of its rounds: the feature rows the
shared cost model ranks a layout's loop configurations by, and the loop actor's walks.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.layout import LayoutProgram

from ..features import MSFeatures
from ..ppo import LoopActor
from ..spaces.base import Config, InvalidConfig
from ..spaces.loop import LoopSpace
from ..task import Task

GENERIC_KNOB_FEATURES = 17  # the layout-independent tail of a loop space's `knob_features` (order, parallel, ...)
IDENTITY = "as-given"  # key of the user's own layouts (the untransformed program, no conversion)


@dataclass
class LayoutPoint:
    """One layout tried: its program, loop space, measuring task and what was learned there."""

    choice: dict[str, int]
    prog: LayoutProgram | None  # None: the user's own layouts
    space: LoopSpace
    task: Task
    ms: MSFeatures | None
    name: str
    identity: bool = False  # the user's own layouts: the untransformed program
    best: list[tuple[float, Config]] = field(default_factory=list)  # (latency, loop config), best first
    trials: int = 0
    actor: LoopActor | None = None  # made on first use
    swept: set[str] = field(default_factory=set)  # keys of the best configs whose placements were tried
    joint_ms: float | None = None  # best latency measured in the joint stage
    loop_trials: int = 0  # trials measured in the loop stage

    @property
    def best_ms(self) -> float | None:
        return self.best[0][0] if self.best else None


def point_features(p: LayoutPoint, params: Sequence[Any], configs: Sequence[Config],
                   schedules: Sequence[Any] | None = None) -> np.ndarray:
    """Feature rows of loop configurations in layout `p`, comparable across layouts: whether it is the user's
    own, log2 of each template parameter `params`' factor, the layout-independent knob features, and
    MetaSchedule's per-store features where the point has them (`schedules`: the configurations' applied
    schedules, which spare re-applying)."""
    lay = [float(p.identity)] + [math.log2(p.choice.get(q.name, 1)) for q in params]
    rows = [lay + p.space.knob_features(c)[-GENERIC_KNOB_FEATURES:] for c in configs]
    out = np.asarray(rows, dtype=np.float32)
    if p.ms is None:
        return out
    if schedules is None:
        schedules = []
        for c in configs:
            try:
                schedules.append(p.space.apply(c))
            except Exception:  # noqa: BLE001
                schedules.append(None)
    return np.concatenate([out, p.ms.extract(schedules)], axis=1)


def random_directions(rng: np.random.Generator, n_knobs: int, n: int) -> list[list[int]]:
    """`n` walks' directions at random, with the untrained loop actor's odds (the ablation of the agents)."""
    still = math.exp(3.0) / (math.exp(3.0) + 2)  # LoopActor starts with the "keep" logit 3 above the others
    draws = rng.random((n, n_knobs))
    signs = rng.choice((-1, 1), size=(n, n_knobs))
    return [[0 if u < still else int(sg) for u, sg in zip(row, srow)] for row, srow in zip(draws, signs)]


def walk(space: LoopSpace, config: Config, directions: Sequence[int], rng: np.random.Generator) -> Config:
    """One step per knob in its direction, in random order, keeping each step that stays valid."""
    out = dict(config)
    knobs = space.knobs
    for i in rng.permutation(len(knobs)):
        d = directions[int(i)]
        if not d:
            continue
        knob = knobs[int(i)]
        j = knob.choices.index(out[knob.name]) + d
        if not 0 <= j < len(knob.choices):
            continue
        candidate = {**out, knob.name: knob.choices[j]}
        try:
            out = space.validate(candidate)
        except InvalidConfig:
            continue
    return out
