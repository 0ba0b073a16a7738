"""`FusionSpace`: the search space of a program of several operators, scheduled by basteln tiling and
fusion (`compiler.passes.basteln`).

Knobs: the output's tile size per spatial dimension (`tile.<i>`, divisors of its extent), the
redundancy threshold in percent (`threshold`: 0 = never recompute, 100 = fuse whatever the footprint
allows, the paper's sec. 5.4), the register blocks of every reduction (`register`, `register2`: an
outer product of two loops), the vector length (`vector`, multiples of the target's lanes), the unroll
step of the tile loops (`unroll`) and, for a catalog subgraph, its operators' layouts (`layout`: 0 =
as the user wrote it, else the channel block of `compiler.layout.subgraph_layout`). The pass decides
the rest (which spaces fuse where, the intermediate tiles) from these.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tvm
from tvm import s_tir, tirx

from compiler.layout import LayoutError, subgraph_layout
from compiler.passes.basteln import BastelnError, Fused, basteln, spaces_of
from compiler.target import VectorUnit, vector_unit
from compiler.workloads.subgraphs import Subgraph

from .base import Config, InvalidConfig, Knob, ScheduleFailed, SearchSpace, config_key, known_nests, tvm_error
from .divisors import divisors

THRESHOLDS = (0, 25, 100)
REGISTERS = (1, 2, 4, 8)
REGISTERS2 = (1, 2, 4)
UNROLLS = (0, 16, 64)
# knobs a configuration stored before they existed lacks: the value that schedules as it did then
LATER_KNOBS = {"register2": 1, "layout": 0, "tensorize": 0}


def reductions(prim_func: tvm.tirx.PrimFunc) -> int:
    """How many reduction blocks (complex operators) `prim_func`'s root holds."""
    sch = s_tir.Schedule(prim_func)
    return sum(1 for rv in sch.get_child_blocks(sch.get_sblock("root"))
               if any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(rv).iter_vars))


class FusionSpace(SearchSpace):
    """Configurations of `basteln` over one program (its output anchor's tiles and the pass's knobs)."""

    def __init__(self, prim_func: tvm.tirx.PrimFunc | tvm.IRModule, unit: VectorUnit | None = None,
                 workload: Any = None):
        """`workload`: the task's catalog subgraph, if it is one (it offers the `layout` knob)."""
        self.prim_func = prim_func["main"] if isinstance(prim_func, tvm.IRModule) else prim_func
        self.workload = workload if isinstance(workload, Subgraph) else None
        self._programs: dict[int, Any] = {0: self.prim_func}
        unit = self.unit = unit or vector_unit()
        probe = basteln(self.prim_func)  # the output anchor's spatial extents, from the pass's own analysis
        spaces = {s.name: s for s in spaces_of(s_tir.Schedule(self.prim_func))}
        self.extents = [e for _, e in spaces[probe.outputs[0]].spatial]
        lanes = unit.lanes
        self._knobs = (
            *(Knob(f"tile.{i}", divisors(e)) for i, e in enumerate(self.extents)),
            Knob("threshold", THRESHOLDS),
            Knob("register", REGISTERS),
            Knob("register2", REGISTERS2),
            Knob("vector", (lanes, 2 * lanes, 4 * lanes)),
            Knob("unroll", UNROLLS),
            Knob("layout", (0, lanes) if self.workload is not None else (0,)),
            Knob("tensorize", (0, 1)),
        )

    def program(self, layout: int) -> tvm.tirx.PrimFunc:
        """The program basteln schedules: the task's own (0) or its operators in blocked layouts."""
        if layout not in self._programs:
            self._programs[layout] = subgraph_layout(self.workload, layout)
        return self._programs[layout]

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return self._knobs

    def validate(self, config: Config) -> Config:
        config = {**{k: v for k, v in LATER_KNOBS.items() if k not in config}, **config}
        names = {k.name for k in self._knobs}
        if set(config) != names:
            raise InvalidConfig(f"knobs {sorted(set(config) ^ names)} missing or unknown; expected {sorted(names)}")
        for knob in self._knobs:
            if config[knob.name] not in knob.choices:
                raise InvalidConfig(f"{knob.name}={config[knob.name]} is not one of {knob.choices}")
        return {k.name: int(config[k.name]) for k in self._knobs}

    def untuned_config(self) -> Config:
        """Tiles of one row of the output (the last two dimensions whole), recompute freely: the pass's default."""
        d = len(self.extents)
        tiles = [1] * max(d - 2, 0) + self.extents[max(d - 2, 0):]
        return {**{f"tile.{i}": t for i, t in enumerate(tiles)}, "threshold": 100, "register": 1, "register2": 1,
                "vector": self._knob("vector").choices[0], "unroll": 0, "layout": 0, "tensorize": 0}

    def blocked_configs(self) -> list[Config]:
        """basteln with oneDNN-like blocking, in each layout the space offers (the channel-blocked one first):
        tiles of every output channel and a few whole rows (of the third dimension), an outer-product register
        block of output columns x channel blocks within the vector unit's accumulators, the unit's lanes."""
        d = len(self.extents)
        tiles = list(self.extents)
        if d >= 4:  # N C H W (N C/c H W c in a model): one image, every channel, rows of about 4, whole rows
            tiles[0] = 1
            tiles[2] = max(f for f in divisors(self.extents[2]) if f <= 4)
        elif d >= 2:  # [B] M N: one batch, rows of about 16
            tiles[:-2] = [1] * (d - 2)
            tiles[-2] = max(f for f in divisors(self.extents[-2]) if f <= 16)
        base = {**{f"tile.{i}": t for i, t in enumerate(tiles)}, "threshold": 100, "vector": self.unit.lanes,
                "unroll": 0, "tensorize": 1}
        # blocked: columns (rows of a GEMM) x 2 channel blocks; as written (NCHW: the vectors run along a row),
        # 4 channels (rows) x as many of the row's vectors as the accumulators hold
        acc = self.unit.accumulators
        columns = max(r for r in REGISTERS if 2 * r <= acc) if d >= 4 else 4
        blocked = {"register": columns, "register2": 2}
        plain = {"register": 4, "register2": max(r for r in REGISTERS2 if 4 * r <= acc)}
        return [{**base, **(blocked if layout else plain), "layout": layout}
                for layout in reversed(self._knob("layout").choices)]

    def seed_configs(self) -> list[tuple[Config, str]]:
        """The pass's default (`untuned_config`) and oneDNN-like blocking in each layout (`blocked_configs`)."""
        blocked = self.blocked_configs()
        return known_nests(self.untuned_config(), blocked)

    def _knob(self, name: str) -> Knob:
        return next(k for k in self._knobs if k.name == name)

    def sample(self, rng: np.random.Generator, n: int) -> list[Config]:
        return [{k.name: int(k.choices[int(rng.integers(len(k.choices)))]) for k in self._knobs} for _ in range(n)]

    def neighbors(self, config: Config) -> list[Config]:
        config = self.validate(config)
        out, seen = [], {config_key(config)}
        for knob in self._knobs:
            i = knob.choices.index(config[knob.name])
            for j in (i - 1, i + 1):
                if 0 <= j < len(knob.choices):
                    candidate = {**config, knob.name: knob.choices[j]}
                    if config_key(candidate) not in seen:
                        seen.add(config_key(candidate))
                        out.append(candidate)
        return out

    def apply(self, config: Config) -> tvm.s_tir.Schedule:
        return self.fused(config).sch

    def fused(self, config: Config) -> Fused:
        """basteln's result for `config` (`compiler.passes.basteln.Fused`: the schedule and its decisions)."""
        config = self.validate(config)
        try:
            return basteln(self.program(config["layout"]), [config[f"tile.{i}"] for i in range(len(self.extents))],
                           config["threshold"] / 100, vector=config["vector"], register=config["register"],
                           register2=config["register2"], unroll=config["unroll"],
                           tensorize=bool(config["tensorize"]), lanes=self.unit.lanes)
        except (BastelnError, LayoutError) as e:
            raise InvalidConfig(str(e)) from e
        except (s_tir.ScheduleError, tvm_error()) as e:
            text = str(e).strip().splitlines()
            raise ScheduleFailed(f"schedule failed: {type(e).__name__}: {text[-1] if text else ''}") from e

    @property
    def feature_module(self) -> tvm.IRModule:
        """The task's program (a blocked layout's has other buffers, not another signature for the features)."""
        return tvm.IRModule({"main": self.prim_func})

    def volume(self) -> int:
        """How many configurations the space holds."""
        return math.prod(len(k.choices) for k in self._knobs)


def is_fusion_config(config: Config) -> bool:
    """A `FusionSpace` configuration (its `threshold` knob), as stored with a trial."""
    return "threshold" in config and "order" not in config
