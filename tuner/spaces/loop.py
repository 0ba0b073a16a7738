"""`LoopSpace`: the loop-only search space of one operator's program.

`LoopSpace` is the loop-only space over one operator's TIR: inline the
injective producers (padding, dilation, kernel transforms), tile the main
(reduction) block multi-level (spatial loops 4 levels, reduction loops 2, as
Ansor's SSRSRS), reorder, parallelize the fused outer spatial loops, vectorize
the innermost spatial loop, unroll, and place the epilogue (bias/relu) or a
write-back cache inside a tile level. A configuration is JSON-serializable, so
the service stores it as is and a later PPO actor can walk each knob up/down
over `Knob.choices`.

The space is this module (the knobs, validation, sampling, neighbours); what it learns about a program is
`loop_structure`, how a configuration is applied `loop_schedule`, and the known nests a search starts
from `loop_seeds`.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable

import numpy as np
import tvm

from compiler.target import VectorUnit, vector_unit

from .base import Config, InvalidConfig, Knob, SearchSpace, config_key, known_nests
from .divisors import divisors, prime_factors
from .loop_knobs import (
    LATER_KNOBS,
    MAX_INNERMOST_FACTOR,
    ORDERS,
    PLACEMENT_KNOBS,
    SPATIAL_LEVELS,
    TENSORIZE_ORDER,
    UNROLL_STEPS,
    UNTUNED_ORDER,
    placeable,
)
from .loop_schedule import LoopScheduling
from .loop_seeds import LoopSeeds
from .loop_structure import Axis, align_epilogue, analyze, as_module, main_reads, tensorizable, vector_block_axes


class LoopSpace(LoopSeeds, LoopScheduling, SearchSpace):
    """Multi-level tiling of a program's reduction block, with the knobs listed below.

    Knobs (all integers):
        tile.<axis>.<level>: tile factor of a main-block loop at level 1..3 (spatial)
            or 1 (reduction); level 0 takes the rest of the extent.
        order: index into `ORDERS` (where the reduction levels sit among the spatial ones;
            `UNTUNED_ORDER`, SSSSRR, puts them innermost and leaves nothing to vectorize).
        parallel: how many outer spatial levels (1 or 2) are fused into the parallel loop;
            0 runs on one thread (level 0 fused as for 1, not parallel): small and
            memory-bound programs can lose more to the thread pool than they gain.
        vectorize: 1 vectorizes the innermost spatial loop (level 3 of the last spatial axis).
        unroll: `pragma_auto_unroll_max_step` on the outer loop, one of `UNROLL_STEPS`
            (always with `pragma_unroll_explicit`: LLVM codegen ignores the implicit hint,
            so an unroll_explicit knob would be a no-op on CPU).
        write_at: where the output is written: 0 = by the main block, the epilogue (if
            any) at the root; L in {1, 2} = the epilogue (or a write-back cache of the
            main block when there is no epilogue) inside the last loop of spatial tile
            level L-1; must be 0 or >= parallel.
        inline: 1 inlines the injective producers into the main block (only where there are any).
        licm: 1 builds the program with our loop-invariant code motion (`compiler.passes.licm`), 0 without
            (the function is marked `without_licm`): on tuned loop nests LLVM already hoists most of it and
            the pass sometimes loses (bench.licm), so the search decides. A stored configuration without
            it (older than the knob) means 1.
        read_at: where the producers not inlined are computed (only where there are any): 0 = at the
            root, in a loop nest of their own; L in {1, 2} = `compute_at` the last loop of spatial
            tile level L-1, each tile computing the part it reads (padding, a layout conversion):
            no parallel loop of its own (a small operator loses more to the thread pool's fork/join
            than the halo costs) and the tile still in cache when read; must be 0 when inline is 1,
            and 0 or >= parallel. A stored configuration without it (older than the knob) means 0.
        tensorize: 1 marks the register block for a tensor instruction (`compiler.passes.tensorize`): the
            innermost loop of the inner reduction level that is not a unit loop (the last one where all are)
            gets the "outer_product" mark, so the build rewrites `for r / for rows / [for v] / for lanes`
            into the target's fp32 FMA micro-kernel (accumulators in registers across r) where the nest
            matches, and leaves it exactly as it was (vectorized as `vectorize` says) where it does not or
            the target has no instruction. Only under order SSRSRS (`TENSORIZE_ORDER`: elsewhere the register
            block is not directly under a reduction loop; `validate` turns it off there) and only offered
            for float32 programs (`tensorizable`). A stored configuration without it means 0.
        transpose: 1 schedules each layout conversion (the data's into the layout, the output's back, at the
            root or in a tile) for transposed tiles in registers (`compiler.passes.tensorize.schedule_transpose`:
            a 16 x 14 tile of `N H W/14 O/16 14 16` back to `N C H W` is 14 vector loads, the shuffles, 16 stores
            of 14 lanes, where the copy vectorized along the output loaded each lane on its own); a conversion
            that is no such copy (one fused with the padding) is vectorized as before. A stored configuration
            without it means 0.
    """

    def __init__(self, prim_func: tvm.tirx.PrimFunc | tvm.IRModule, unit: VectorUnit | None = None):
        """Analyzes `prim_func` (a TE-made program with one reduction block).

        `unit` is the vector unit the programs are for (`compiler.target.vector_unit`; this machine's when
        None): its lanes make `blocked_config`'s vectors, its registers bound the register block (a larger
        innermost tile than `unit.register_tile` values spills: 5-20x slower in our first runs).

        An epilogue that reads the main block's output re-indexed (a conversion from a tiled
        layout back to the user's) is first made to iterate over the main block's output
        (`align_epilogue`); one that cannot be (a layout with padding) stays at the root
        (`write_at` only 0).
        """
        mod = as_module(prim_func)
        self.unit = vector_unit() if unit is None else unit
        self.structure = analyze(mod)
        self.mod, self.fuse_epilogue = align_epilogue(mod, self.structure)
        knobs: list[Knob] = []
        for axis in self.structure.axes:
            if axis.extent == 1:
                continue
            for level in range(1, axis.levels):
                limit = MAX_INNERMOST_FACTOR if level == axis.levels - 1 else axis.extent
                knobs.append(Knob(axis.knob(level), tuple(d for d in divisors(axis.extent) if d <= limit)))
        knobs += [
            Knob("order", tuple(range(len(ORDERS)))),
            Knob("parallel", (0, 1, 2)),
            Knob("vectorize", (0, 1)),
            Knob("unroll", UNROLL_STEPS),
            Knob("write_at", (0, 1, 2) if self.fuse_epilogue else (0,)),
            Knob("licm", (0, 1)),
            Knob("transpose", (0, 1)),
        ]
        if self.structure.inlinable:
            knobs += [Knob("inline", (0, 1)), Knob("read_at", (0, 1, 2))]
        if tensorizable(self.mod, self.structure):
            knobs.append(Knob("tensorize", (0, 1)))
        self._knobs = tuple(knobs)
        self._by_name = {k.name: k for k in knobs}

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return self._knobs

    # -- configurations -------------------------------------------------------

    def factors(self, config: Config, axis: Axis) -> list[int]:
        """All tile factors of `axis` (outermost first; level 0 is the rest of the extent)."""
        inner = [config.get(axis.knob(level), 1) for level in range(1, axis.levels)]
        prod = math.prod(inner)
        assert axis.extent % prod == 0, f"{axis.name}: {inner=} do not divide {axis.extent=}"
        return [axis.extent // prod, *inner]

    def validate(self, config: Config) -> Config:
        if not isinstance(config, dict):
            raise InvalidConfig(f"a configuration is a dict of integer knobs, got {type(config).__name__}")
        unknown = sorted(set(config) - set(self._by_name))
        missing = sorted(set(self._by_name) - set(config) - set(LATER_KNOBS))
        if unknown or missing:
            raise InvalidConfig(f"configuration does not fit this space: unknown knobs {unknown}, missing {missing}")
        out: Config = {}
        for knob in self._knobs:
            value = config.get(knob.name, LATER_KNOBS.get(knob.name))
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise InvalidConfig(f"{knob.name}={value!r} is not an integer")
            value = int(value)
            if value not in knob.choices:
                raise InvalidConfig(f"{knob.name}={value} not in {list(knob.choices)}")
            out[knob.name] = value
        for axis in self.structure.axes:
            inner = math.prod(out.get(axis.knob(level), 1) for level in range(1, axis.levels))
            if axis.extent % inner:
                raise InvalidConfig(f"tiles of {axis.name} multiply to {inner}, which does not divide {axis.extent}")
        register = math.prod(out.get(a.knob(SPATIAL_LEVELS - 1), 1) for a in self.structure.spatial)
        if register > self.unit.register_tile:
            raise InvalidConfig(f"innermost spatial tiles multiply to {register} > {self.unit.register_tile} "
                                f"(the values {self.unit.registers} vector registers of {self.unit.lanes} lanes hold)")
        for name in ("write_at", "read_at"):
            if out.get(name) and out[name] not in placeable((out[name],), out["parallel"]):
                raise InvalidConfig(f"{name}={out[name]} lies inside the fused parallel loop (parallel={out['parallel']})")
        if out.get("read_at") and out["inline"]:
            raise InvalidConfig(f"read_at={out['read_at']} places producers that inline=1 inlines")
        if out.get("tensorize") and out["order"] != TENSORIZE_ORDER:
            out["tensorize"] = 0  # no register block directly under a reduction loop: nothing to mark
        return out

    def untuned_config(self) -> Config:
        """The configuration nearest the untransformed program: no tiling, the reduction innermost,
        one thread, no vectorization or unrolling, producers and epilogue at the root. Small
        memory-bound operators (depthwise conv) can run faster so than any parallel tiling."""
        config: Config = {k.name: 1 for k in self._knobs if k.name.startswith("tile.")}
        config.update(order=UNTUNED_ORDER, parallel=0, vectorize=0, unroll=0, write_at=0, licm=1, transpose=0)
        if "inline" in self._by_name:
            config.update(inline=0, read_at=0)
        return self.validate(config)

    @functools.cached_property
    def _vector_block_axes(self) -> tuple[Axis, ...]:
        """The spatial axes besides the lanes that index the weight (`loop_structure.vector_block_axes`)."""
        return vector_block_axes(self.structure, *self._main_reads)

    @functools.cached_property
    def _main_reads(self) -> tuple[list[list], Callable[[list, Axis], bool]]:
        """What the main block reads and `uses(indices, axis)` (`loop_structure.main_reads`)."""
        return main_reads(self.mod, self.structure)

    def sample(self, rng: np.random.Generator, n: int) -> list[Config]:
        return [self._sample_one(rng) for _ in range(n)]

    def _sample_one(self, rng: np.random.Generator) -> Config:
        config: Config = {}
        register = self.unit.register_tile  # what the innermost spatial tiles may still multiply by
        axes = [a for a in self.structure.axes if a.extent > 1]
        vector_axis = self.structure.spatial[-1]
        for i in rng.permutation(len(axes)):  # no axis always gets the register budget first
            axis = axes[int(i)]
            rest = axis.extent
            # innermost first, each a divisor of what is left, so the product always divides
            for level in range(axis.levels - 1, 0, -1):
                limit = MAX_INNERMOST_FACTOR if level == axis.levels - 1 else rest
                if axis.kind == "S" and level == axis.levels - 1:
                    limit = min(limit, register)
                choices = [d for d in divisors(rest) if d <= limit]
                if axis == vector_axis and level == axis.levels - 1 and rng.random() < 0.5:
                    factor = choices[-1]  # half the samples: the whole innermost (vector) axis in registers
                else:
                    factor = choices[int(rng.integers(len(choices)))]
                config[axis.knob(level)] = factor
                rest //= factor
                if axis.kind == "S" and level == axis.levels - 1:
                    register //= factor
        config["order"] = int(rng.integers(len(ORDERS)))
        config["parallel"] = int(rng.choice(3, p=(0.2, 0.4, 0.4)))
        config["vectorize"] = int(rng.random() < 0.8)
        config["unroll"] = UNROLL_STEPS[int(rng.integers(len(UNROLL_STEPS)))]
        config["licm"] = int(rng.random() < 0.75)
        config["transpose"] = int(rng.random() < 0.5)
        if "tensorize" in self._by_name:
            config["tensorize"] = int(config["order"] == TENSORIZE_ORDER and rng.random() < 0.5)
        places = self._by_name["write_at"].choices
        config["write_at"] = int(rng.choice(placeable(places, config["parallel"])))
        if self.structure.inlinable:
            config["inline"] = int(rng.random() < 0.6)
            places = (0,) if config["inline"] else self._by_name["read_at"].choices
            config["read_at"] = int(rng.choice(placeable(places, config["parallel"])))
        return self.validate(config)

    def placements(self, config: Config) -> list[Config]:
        """Where else `config`'s producers and epilogue could be computed: every valid configuration that
        differs from it in one placement knob (read_at, inline, write_at; inlining drops read_at)."""
        config = self.validate(config)
        out: list[Config] = []
        for name in PLACEMENT_KNOBS:
            if name not in self._by_name:
                continue
            for value in self._by_name[name].choices:
                if value == config[name]:
                    continue
                candidate = {**config, name: value}
                if name == "inline" and value:
                    candidate["read_at"] = 0
                try:
                    candidate = self.validate(candidate)
                except InvalidConfig:
                    continue
                if candidate not in out:
                    out.append(candidate)
        return out

    def neighbors(self, config: Config) -> list[Config]:
        config = self.validate(config)
        out: list[Config] = []
        seen = {config_key(config)}

        def add(candidate: Config) -> None:
            try:
                candidate = self.validate(candidate)
            except InvalidConfig:
                return
            key = config_key(candidate)
            if key not in seen:
                seen.add(key)
                out.append(candidate)

        for axis in self.structure.axes:
            if axis.extent == 1:
                continue
            factors = self.factors(config, axis)
            # move one prime factor from one level to another (level 0 absorbs the rest)
            for src in range(axis.levels):
                for p in prime_factors(factors[src]) if factors[src] > 1 else ():
                    for dst in range(axis.levels):
                        if dst == src:
                            continue
                        moved = list(factors)
                        moved[src] //= p
                        moved[dst] *= p
                        candidate = dict(config)
                        for level in range(1, axis.levels):
                            candidate[axis.knob(level)] = moved[level]
                        add(candidate)
        for knob in self._knobs:
            if knob.name.startswith("tile."):
                continue
            i = knob.choices.index(config[knob.name])
            for j in (i - 1, i + 1):
                if 0 <= j < len(knob.choices):
                    add({**config, knob.name: knob.choices[j]})
        return out

    def seed_configs(self) -> list[tuple[Config, str]]:
        """The untuned nest and oneDNN-like register blocking (`blocked_config`)."""
        blocked = [self.blocked_config()]
        return known_nests(self.untuned_config(), blocked)

    @property
    def feature_module(self) -> tvm.IRModule:
        return self.mod

    def knob_features(self, config: Config) -> list[float]:
        """log2 of every tile factor at every level (level 0 included), the other knobs as numbers, and derived
        sizes (log2 of the parallel extent, of the register tile, of the level-2+3 tile, of the inner reduction
        tile, of the vector length), then `tensorize` and `transpose`."""
        st = self.structure
        out: list[float] = []
        spatial_factors = [self.factors(config, a) for a in st.spatial]
        reduce_factors = [self.factors(config, a) for a in st.reduce]
        for factors in spatial_factors + reduce_factors:
            out += [math.log2(f) for f in factors]
        for name in ("order", "parallel", "vectorize", "write_at", "inline", "read_at"):
            out.append(float(config.get(name, 0)))
        out.append(float(config.get("licm", 1)))
        out += [float(config["order"] == i) for i in range(len(ORDERS))]
        out.append(math.log2(1 + config["unroll"]))

        def level_volume(levels: range, factors: list[list[int]]) -> float:
            return float(sum(math.log2(f[level]) for f in factors for level in levels))

        parallel = level_volume(range(config["parallel"]), spatial_factors)
        out += [
            parallel,
            level_volume(range(SPATIAL_LEVELS - 1, SPATIAL_LEVELS), spatial_factors),  # register tile
            level_volume(range(SPATIAL_LEVELS - 2, SPATIAL_LEVELS), spatial_factors),  # levels 2+3
            level_volume(range(1, 2), reduce_factors),  # inner reduction tile
            math.log2(spatial_factors[-1][-1]) * config["vectorize"],  # vector length
            float(config.get("tensorize", 0)),  # the register block marked for a tensor instruction
            float(config.get("transpose", 0)),  # layout conversions as register transposes
        ]
        return out


@functools.lru_cache(maxsize=64)
def loop_space(prim_func: tvm.tirx.PrimFunc, unit: VectorUnit | None = None) -> LoopSpace:
    """`LoopSpace(prim_func, unit)`, built once per program and vector unit (the analysis applies schedules)."""
    return LoopSpace(prim_func, unit)
