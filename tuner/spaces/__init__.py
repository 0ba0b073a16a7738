"""Search spaces: a configuration (a dict of named integer knobs) -> a scheduled program.

`base.py` holds the interface (`SearchSpace`, `Knob`, `Config`, the errors); each space is one file:
`loop.py` (`LoopSpace`: the loops of one operator; what it reads of the program in `loop_structure.py`,
how it schedules in `loop_schedule.py`, its known nests in `loop_seeds.py`), `fusion.py` (`FusionSpace`:
basteln's tiling and fusion of several operators), `layout.py` (`LayoutSpace`: ALT's layouts and the
loops in each, made from a task by `tuner.tune`). A new space over a program is one new file and one
line in `SPACES`.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import tvm

from compiler.target import VectorUnit

from .base import Config, InvalidConfig, Knob, ScheduleFailed, SearchSpace, config_key, sample_unique
from .fusion import FusionSpace, is_fusion_config, reductions
from .layout import (
    LayoutSpace,
    apply_layout_config,
    has_layout,
    interface_space,
    join_config,
    layout_of_config,
    split_config,
)
from .loop import LoopSpace, loop_space

SpaceKind = Literal["loop", "fusion"]

Program = tvm.tirx.PrimFunc | tvm.IRModule

# kind -> (program, the task's catalog workload or None, vector unit or None: this machine's) -> the space
SPACES: dict[str, Callable[[Program, Any, VectorUnit | None], SearchSpace]] = {
    "loop": lambda prim_func, workload, unit: LoopSpace(prim_func, unit),
    "fusion": lambda prim_func, workload, unit: FusionSpace(prim_func, unit, workload=workload),
}


def make_space(kind: SpaceKind, prim_func: Program, workload: Any = None,
               unit: VectorUnit | None = None) -> SearchSpace:
    """The search space called `kind` over `prim_func` ("fusion": `FusionSpace`, which offers a catalog subgraph's
    `workload` in blocked layouts too), for the vector unit `unit` (the task's target's,
    `compiler.target.vector_unit`; this machine's when None).

    Raises:
        ValueError: no space is called `kind`.
    """
    if kind not in SPACES:
        raise ValueError(f"unknown search space: {kind}")
    return SPACES[kind](prim_func, workload, unit)


__all__ = [
    "SPACES",
    "Config",
    "FusionSpace",
    "InvalidConfig",
    "Knob",
    "LayoutSpace",
    "LoopSpace",
    "ScheduleFailed",
    "SearchSpace",
    "SpaceKind",
    "apply_layout_config",
    "config_key",
    "has_layout",
    "interface_space",
    "is_fusion_config",
    "join_config",
    "layout_of_config",
    "loop_space",
    "make_space",
    "reductions",
    "sample_unique",
    "split_config",
]
