"""Search spaces: a configuration (a dict of named integer knobs) -> a scheduled program.

`LoopSpace` is the loop-only space over one operator's TIR: inline the
injective producers (padding, dilation, kernel transforms), tile the main
(reduction) block multi-level (spatial loops 4 levels, reduction loops 2, as
Ansor's SSRSRS), reorder, parallelize the fused outer spatial loops, vectorize
the innermost spatial loop, unroll, and place the epilogue (bias/relu) or a
write-back cache inside a tile level. A configuration is JSON-serializable, so
the service stores it as is and a later PPO actor can walk each knob up/down
over `Knob.choices`.

Layering: `tuner` never imports `service`. TVM is imported inside functions.
"""

from __future__ import annotations

import abc
import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from compiler.target import VectorUnit, vector_unit

if TYPE_CHECKING:
    import numpy as np
    import tvm

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

Config = dict[str, int]


class InvalidConfig(ValueError):
    """A configuration that names unknown knobs, misses knobs, or breaks a constraint."""


class ScheduleFailed(RuntimeError):
    """A valid-looking configuration that TVM refused to apply (a schedule error)."""


@dataclass(frozen=True)
class Knob:
    """One integer knob of a space and the values it may take (sorted ascending).

    Values of tile knobs are tile factors; a joint constraint (the inner factors'
    product divides the loop extent) is checked by `SearchSpace.validate`.
    """

    name: str
    choices: tuple[int, ...]


class SearchSpace(abc.ABC):
    """A space of configurations for one program."""

    @property
    @abc.abstractmethod
    def knobs(self) -> tuple[Knob, ...]:
        """Every knob, in a fixed order (the order of feature vectors)."""

    @abc.abstractmethod
    def untuned_config(self) -> Config:
        """The configuration nearest the untransformed program (where a search may start)."""

    @abc.abstractmethod
    def sample(self, rng: np.random.Generator, n: int) -> list[Config]:
        """`n` random valid configurations (may repeat)."""

    @abc.abstractmethod
    def validate(self, config: Config) -> Config:
        """The canonical form of `config`; raises `InvalidConfig` if it is not in the space."""

    @abc.abstractmethod
    def apply(self, config: Config) -> tvm.s_tir.Schedule:
        """The schedule of `config`; raises `InvalidConfig` or `ScheduleFailed`."""

    @abc.abstractmethod
    def neighbors(self, config: Config) -> list[Config]:
        """Valid configurations one step away from `config` (one knob changed)."""

    def mutate(self, config: Config, rng: np.random.Generator) -> Config:
        """A random neighbor of `config` (itself if it has none)."""
        near = self.neighbors(config)
        return near[int(rng.integers(len(near)))] if near else dict(config)


def config_key(config: Config) -> str:
    """A canonical string of a configuration (for de-duplication)."""
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


@functools.cache
def divisors(n: int) -> tuple[int, ...]:
    """Divisors of `n` ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


@functools.cache
def prime_factors(n: int) -> tuple[int, ...]:
    """Distinct prime factors of `n`."""
    out, p = [], 2
    while p * p <= n:
        if n % p == 0:
            out.append(p)
            while n % p == 0:
                n //= p
        p += 1
    if n > 1:
        out.append(n)
    return tuple(out)


@dataclass(frozen=True)
class Axis:
    """A loop of the main block: its knob name, extent and kind ("S" spatial, "R" reduction, "G" the group of
    a dot-product instruction: a reduction kept whole, never tiled)."""

    name: str
    extent: int
    kind: Literal["S", "R", "G"]

    @property
    def levels(self) -> int:
        return {"S": SPATIAL_LEVELS, "R": REDUCE_LEVELS, "G": 1}[self.kind]

    def knob(self, level: int) -> str:
        return f"tile.{self.name}.{level}"


@dataclass(frozen=True)
class Structure:
    """What `LoopSpace` learned about a program once: the blocks it schedules and its loops."""

    main: str  # the reduction block
    axes: tuple[Axis, ...]  # in the main block's loop order
    inlinable: tuple[str, ...]  # injective producers that compute_inline accepts, nearest first
    epilogue_inline: tuple[str, ...]  # consumers inlined into the last consumer
    epilogue: str | None  # the output block after main (relu / bias_add), None: main writes the output

    @property
    def spatial(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == "S")

    @property
    def reduce(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == "R")

    @property
    def group(self) -> Axis | None:
        """The dot-product group axis (`compiler.passes.tensorize.DOT_GROUP`), if the block has one."""
        return next((a for a in self.axes if a.kind == "G"), None)


def _as_module(prim_func: tvm.tirx.PrimFunc | tvm.IRModule) -> tvm.IRModule:
    import tvm

    if isinstance(prim_func, tvm.IRModule):
        return prim_func
    return tvm.IRModule({"main": prim_func.with_attr("global_symbol", "main")})


def analyze(prim_func: tvm.tirx.PrimFunc | tvm.IRModule) -> Structure:
    """Finds the main block, its loops, and which producers/consumers can be inlined.

    Raises:
        ValueError: if the program has no reduction block, or its loops do not
            match the block's iterators one to one (not a TE-made program).
    """
    from tvm import s_tir, tirx

    mod = _as_module(prim_func)
    sch = s_tir.Schedule(mod)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    names = [sch.get(b).name_hint for b in blocks]

    def volume(b) -> int:
        return math.prod(int(iv.dom.extent) for iv in sch.get(b).iter_vars)

    reductions = [
        b for b in blocks if any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(b).iter_vars)
    ]
    if not reductions:
        raise ValueError(f"no reduction block among {names}: nothing for LoopSpace to tile")
    main_rv = max(reductions, key=volume)
    main = sch.get(main_rv).name_hint
    block = sch.get(main_rv)
    loops = sch.get_loops(main_rv)
    assert len(loops) == len(block.iter_vars), f"{main}: {len(loops)=} != {len(block.iter_vars)=}"
    from compiler.passes.tensorize.mark import DOT_GROUP

    group = int(block.annotations[DOT_GROUP]) if DOT_GROUP in block.annotations else 0
    axes, seen = [], set()
    for k, (loop, iv) in enumerate(zip(loops, block.iter_vars)):
        extent = int(sch.get(loop).extent)
        assert extent == int(iv.dom.extent), f"{main}: loop extent {extent} != iterator extent {iv.dom.extent}"
        name = str(iv.var.name)
        name = name[2:] if name.startswith("v_") else name
        while name in seen:
            name += "_"
        seen.add(name)
        kind = "R" if iv.iter_type == tirx.IterVar.CommReduce else "S"
        if kind == "R" and k == len(loops) - 1 and extent == group:  # the instruction's group: innermost, whole
            kind = "G"
        axes.append(Axis(name, extent, kind))

    index = names.index(main)
    # Producers, nearest first: inlining the padding first leaves the dilation feeding main directly.
    inlinable = []
    trial = s_tir.Schedule(mod)
    for name in reversed(names[:index]):
        try:
            trial.compute_inline(trial.get_sblock(name))
            inlinable.append(name)
        except (s_tir.ScheduleError, tvm_error()):
            pass
    consumers = names[index + 1 :]
    epilogue_inline: list[str] = []
    epilogue = consumers[-1] if consumers else None
    trial = s_tir.Schedule(mod)
    for name in consumers[:-1]:
        try:
            trial.compute_inline(trial.get_sblock(name))
            epilogue_inline.append(name)
        except (s_tir.ScheduleError, tvm_error()):
            epilogue = None  # several epilogue blocks left: keep them all at the root
    if epilogue is not None and len(epilogue_inline) != len(consumers) - 1:
        epilogue = None
    return Structure(main, tuple(axes), tuple(inlinable), tuple(epilogue_inline), epilogue)


def align_epilogue(mod: tvm.IRModule, st: Structure) -> tuple[tvm.IRModule, bool]:
    """`mod` with its epilogue iterating over the coordinates of the main block's output, and whether
    the epilogue may be placed inside a tile.

    A conversion from a tiled layout back to the user's (`compiler.layout`'s `layout_convert_*_out`)
    iterates over the user's coordinates v and reads the tile at u = f(v): a gather whose region
    inside a tile TVM over-approximates, and which at the root visits each tile's cache lines once
    per channel (on a conv3d with a 12.8 MB output, half the run time). Re-indexed by f
    (`transform_block_layout`) it iterates over u and writes `user[f^-1(u)]`: it reads exactly what
    the main block wrote, so `reverse_compute_at` can place it in a tile, and its loops visit each
    tile once. An element-wise epilogue (bias, relu) is already aligned; one whose f is not a
    bijection (a layout that pads) is left as it is, at the root.
    """
    from tvm import s_tir, sym, tirx

    if st.epilogue is None:
        return mod, True
    sch = s_tir.Schedule(mod)
    block_rv = sch.get_sblock(st.epilogue)
    block = sch.get(block_rv)
    produced = {sch.get(sch.get_sblock(name)).writes[0].source.name for name in (st.main, *st.epilogue_inline)}
    reads = [r for r in block.reads if r.source.name in produced]
    iters = [iv.var for iv in block.iter_vars]
    if len(reads) != 1 or any(int(rng.extent) != 1 for rng in reads[0].region if isinstance(rng.extent, tirx.IntImm)):
        return mod, False
    index = [rng.min for rng in reads[0].region]
    if len(index) == len(iters) and all(i.same_as(v) for i, v in zip(index, iters)):
        return mod, True  # element-wise
    # The coordinate of u along which the user's innermost dimension advances by one goes last: the
    # innermost (vectorized) loop then stores a contiguous run of a row, gathering from one tile in
    # cache (on a 12.8 MB conversion 2.5x faster than at first; storing whole rows, from several
    # tiles, or the tile's own order, which scatters the stores, were slower).
    analyzer = sym.Analyzer()
    imap = tirx.IndexMap(iters, index, None)

    def at(last: int) -> list[int | None]:
        point = [tirx.const(0, v.ty.dtype) for v in iters[:-1]] + [tirx.const(last, iters[-1].ty.dtype)]
        return [int(e) if isinstance(e, tirx.IntImm) else None for e in map(analyzer.simplify, imap.map_indices(point))]

    origin, step = at(0), at(1)
    unit = [k for k, (a, b) in enumerate(zip(origin, step)) if a is not None and b is not None and b - a == 1]
    if len(unit) == 1:
        index = [e for k, e in enumerate(index) if k != unit[0]] + [index[unit[0]]]
    try:
        sch.transform_block_layout(block_rv, tirx.IndexMap(iters, index, None))
    except (s_tir.ScheduleError, tvm_error()):
        return mod, False
    return sch.mod, True


def tvm_error() -> type[Exception]:
    """The base class of the errors TVM's C++ side raises: `RuntimeError` (TVM 0.27 has no `TVMError`;
    `ScheduleError` and `tvm.error.InternalError`, a failed check, both derive from it)."""
    return RuntimeError


class LoopSpace(SearchSpace):
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
        mod = _as_module(prim_func)
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
            if out.get(name) and out[name] not in _placeable((out[name],), out["parallel"]):
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

    def blocked_config(self, lanes: int | None = None, column: bool | None = None, wide: bool = False) -> Config:
        """A oneDNN-like loop nest: a register block of the two innermost spatial loops at the innermost
        level -- columns of the last: one or two whole vectors (a layout's channel tile: one), else the
        widest narrower vector (8 of 56), else what divides; rows of the one before up to `REGISTER_ROWS`
        and the unit's `accumulators` vector registers in all, as large as divisors allow -- with its last loop
        vectorized; the first reduction loop split by `lanes` (the input's channel tile) and the others (the
        kernel window) whole in the inner reduction level, as oneDNN's direct convolution (each channel of
        the tile, each kernel tap: broadcast, multiply-add; 1.2-1.7x faster than the window outside the
        block on the quick suite's convolutions); the reduction between the parallel outer loops and the
        block (order SSRSRS), unrolled whole.

        A last loop that no vector fits, not even half of one (7 of a 7x7 depthwise conv: a 7-lane vector
        ran 2x slower than scalar code there) takes a column of scalar accumulators instead: rows of
        the loop before innermost, not vectorized (LLVM's SLP vectorizer packs the unrolled rows), the last
        loop whole in the second tile level, each column written back from a cache there (`write_at` 2,
        3x faster than writing the output in place) and the producers computed in each parallel tile
        (`read_at` 1), as MetaSchedule's best program for that conv. `column` True takes the column
        anyway (where the last loop is read with a stride, a stride-2 depthwise conv: 0.38 ms, the vector
        nest 1.75 ms), False never; None decides as above.

        `wide`: columns of several vectors where they hold more sums than one vector's rows do, within the
        accumulators less two (each column's weight vector): the output block of a template's layout (the axis
        besides the lanes that indexes the weight but not an input broadcast to the lanes) at the innermost level
        too, so each broadcast feeds several FMAs (a depthwise conv broadcasts nothing: not widened). A GEMM in
        `M/8 N/16 8 16` holds 8 x 1 sums of AVX-512's 28, 8 x 2 wide: 1.50-1.73 ms against 1.74-1.89 (cascadelake,
        512^3); a conv's 14-row block is not widened (7 x 2 holds no more), and 14 x 2 in
        all 28 accumulators ran 1.95 ms against 1.04. Otherwise the same as the narrow block.

        A program in the dot-product form (a `G` axis) gets `_dot_config(wide)` instead."""
        if self.structure.group is not None:
            return self._dot_config(wide)
        lanes = self.unit.lanes if lanes is None else lanes
        config: Config = {k.name: 1 for k in self._knobs if k.name.startswith("tile.")}
        spatial = [a for a in self.structure.axes if a.kind == "S" and a.extent > 1]
        if len(spatial) < 2:
            column = False
        if spatial:
            fits = [d for d in divisors(spatial[-1].extent) if d <= 2 * lanes]
            whole = [d for d in fits if d % lanes == 0]
            narrower = [d for d in fits if d >= 4 and lanes % d == 0]
            if column is None:
                column = not (whole or narrower) and max(fits) < lanes // 2
            if column:
                cols, config[spatial[-1].knob(1)] = 1, spatial[-1].extent
            else:
                cols = config[spatial[-1].knob(SPATIAL_LEVELS - 1)] = max(whole or narrower or fits)
            if len(spatial) > 1:
                vectors = -(-cols // lanes)

                def rows(blocks: int, room: int) -> int:
                    return max(d for d in divisors(spatial[-2].extent)
                               if d <= REGISTER_ROWS and d * blocks * vectors <= room)

                narrow = config[spatial[-2].knob(SPATIAL_LEVELS - 1)] = rows(1, self.unit.accumulators)
                lanes_last = spatial[-1] == self.structure.spatial[-1]  # the weight's lanes: the block's columns
                block = self._wide_block_axis(spatial[-2]) if wide and not column and lanes_last else None
                if block is not None:
                    room = self.unit.accumulators - 2  # each block's vector of the weight besides its sums
                    r, v = max(((rows(v, room), v) for v in divisors(block.extent) if 1 < v <= 4),
                               key=lambda rv: (rv[0] * rv[1], rv[0]), default=(0, 1))
                    if r * v > narrow:
                        config[spatial[-2].knob(SPATIAL_LEVELS - 1)], config[block.knob(SPATIAL_LEVELS - 1)] = r, v
        reduction = [a for a in self.structure.axes if a.kind == "R" and a.extent > 1]
        if reduction:
            config[reduction[0].knob(1)] = max(d for d in divisors(reduction[0].extent) if d <= lanes)
        if not column:  # the vector block's inner reduction: the channel tile by the whole kernel window (a long
            # reduction, a mean over 112 rows, by the largest inner tile the space has)
            config.update({a.knob(1): max(self._by_name[a.knob(1)].choices) for a in reduction[1:]})
        config.update(order=0, parallel=1, vectorize=int(not column), unroll=UNROLL_STEPS[-1], write_at=0, licm=1,
                      transpose=1)
        if column and 2 in self._by_name["write_at"].choices:
            config["write_at"] = 2
        if "inline" in self._by_name:
            config.update(inline=0, read_at=int(column))
        return self.validate(config)

    def _dot_config(self, wide: bool = False) -> Config:
        """`blocked_config` of the dot-product form (`compiler.workloads.model.layouts.conv2d_nhwc_dot`: spatial
        axes ..., row, output block, lanes; reductions ..., channel chunks; the group): the instruction's
        register block -- the lanes whole, one or two output blocks (one vector each), rows of the axis before
        them up to `REGISTER_ROWS`, the most accumulators the unit holds -- the kernel window and up to 16 channel
        chunks in the inner reduction level, marked for the instruction (order SSRSRS), unrolled whole.

        A layout template's dot-product form (`compiler.layout.templates`: spatial axes ..., output block, ...,
        the spatial tiles, lanes) has rows, not an output block, before the lanes (the axis before the lanes does
        not index the weight): one vector, rows of that axis; `wide`: also up to 4 vectors of its output block
        (`_vector_block_axes`, which `_apply` puts under the rows), the most accumulators the unit holds. On
        znver5 a bf16 255^3 GEMM ran 0.066 ms with 8 rows x 2 vectors against 0.084 with one vector, an int8
        127x1000x127 0.048 against 0.095 with 8 x 3; an int8 conv's 11 rows x 2 vectors tied with one (1.12 ms)
        or spilled (1.64 against 1.15 as seeds), so both are seeds (`tuner.alt`). Where blocks tie in
        accumulators, the wide one takes more rows (8 x 2 rather than 4 x 4: 0.066 against 0.086 ms)."""
        config: Config = {k.name: 1 for k in self._knobs if k.name.startswith("tile.")}
        *outer, block, lane = self.structure.spatial  # (a unit block or rows axis has no knob)
        widths: tuple[int, ...] = (2, 1) if block.extent % 2 == 0 else (1,)
        prefer = 1  # where two blocks hold as many accumulators: the one of more vectors (-1: of more rows)
        if block not in self._vector_block_axes:  # the weight does not depend on `block`: a template's form,
            outer = [block]  # `block` holds the rows, one vector (or `wide`)
            wider = [a for a in self._vector_block_axes if a.extent > 1] if wide else []
            block = wider[-1] if wider else None
            # several vectors (one only where no other divides): where one vector of more rows holds as many
            # accumulators (AVX2's 12: 12 x 1 against 4 x 3), the narrow seed is that block already
            widths = tuple(sorted((d for d in divisors(block.extent) if 1 < d <= 4), reverse=True) or (1,)) \
                if block else (1,)
            prefer = -1  # 8 rows x 2 vectors ran 0.066 ms where 4 x 4 ran 0.086 (the bf16 255^3 GEMM)
        outer = [a for a in outer if a.extent > 1]
        if lane.extent > 1:
            config[lane.knob(SPATIAL_LEVELS - 1)] = lane.extent
        vectors = widths[0]
        if outer:
            # the block of most accumulators (two vectors before one where they tie): 7 rows of one vector
            # where 7 x 2 is more than the unit holds (AVX2's 12) and one row of two would leave no rows loop
            rows, vectors = max(((max(d for d in divisors(outer[-1].extent)
                                      if d <= REGISTER_ROWS and d * v <= self.unit.accumulators), v) for v in widths),
                                key=lambda rv: (rv[0] * rv[1], prefer * rv[1]))
            config[outer[-1].knob(SPATIAL_LEVELS - 1)] = rows
        if block is not None and block.extent > 1:
            config[block.knob(SPATIAL_LEVELS - 1)] = vectors
        chunks = self._chunk_axis(*self._main_reads)
        # the kernel window whole, up to 16 channel chunks
        config.update({a.knob(1): a.extent for a in self.structure.reduce if a.extent > 1 and a != chunks})
        if chunks is not None and chunks.extent > 1:
            config[chunks.knob(1)] = max(d for d in divisors(chunks.extent) if d <= 16)
        config.update(order=TENSORIZE_ORDER, parallel=1, vectorize=1, unroll=UNROLL_STEPS[-1], write_at=0, licm=1,
                      tensorize=1, transpose=1)
        if "inline" in self._by_name:
            config.update(inline=0, read_at=0)
        try:
            return self.validate(config)
        except InvalidConfig:  # a register block over the unit's limit: one vector
            if block is not None and block.extent > 1:
                config[block.knob(SPATIAL_LEVELS - 1)] = 1
            return self.validate(config)

    def _wide_block_axis(self, rows: Axis) -> Axis | None:
        """The axis a wide register block takes several vectors of (`blocked_config(wide=True)`): the last output
        block besides `rows` that indexes the weight but not an input broadcast to the lanes; None where none does
        (a depthwise conv broadcasts nothing)."""
        reads, uses = self._main_reads
        broadcast = [r for r in reads if not uses(r, self.structure.spatial[-1])]  # read once for all lanes
        return next((a for a in reversed(self._vector_block_axes) if a.extent > 1 and a != rows
                     and any(not uses(r, a) for r in broadcast)), None)

    @functools.cached_property
    def _vector_block_axes(self) -> tuple[Axis, ...]:
        """The spatial axes besides the lanes that index the operand the lanes index (the weight): a register
        block's columns of whole vectors. The instruction's pattern (`compiler.passes.tensorize.select`) takes
        them under the rows; a layout template's output block comes before its rows in axis order."""
        reads, uses = self._main_reads
        *rest, lane = self.structure.spatial
        weight = [r for r in reads if uses(r, lane)]
        return tuple(a for a in rest if any(uses(r, a) for r in weight))

    @functools.cached_property
    def _main_reads(self) -> tuple[list[list], Any]:
        """The index expressions of each region the main block reads, and `uses(indices, axis)`: whether any of
        them uses the axis's iterator."""
        from tvm import s_tir, tirx

        sch = s_tir.Schedule(self.mod)
        block = sch.get(sch.get_sblock(self.structure.main))
        var = {a.name: iv.var for a, iv in zip(self.structure.axes, block.iter_vars)}

        def uses(indices: list, axis: Axis) -> bool:
            return any(u.same_as(var[axis.name]) for e in indices for u in tirx.analysis.undefined_vars(e))

        return [[r.min for r in read.region] for read in block.reads], uses

    def _chunk_axis(self, reads: list[list], uses: Any) -> Axis | None:
        """The reduction over channel chunks of the dot-product form: the reduce axis (not the group) that indexes
        the data (the operand the lanes do not index) where no spatial axis does -- its channel dims (`rc * G +
        g`; `ko` and `g` apart in a GEMM's `M/mt K/G mt G`), not the kernel window's (`y + kh`). It comes last in
        `conv2d_nhwc_dot`, first in a template's conv."""
        st = self.structure
        for indices in reads:
            if uses(indices, st.spatial[-1]):
                continue  # the weight
            for e in indices:
                if not any(uses([e], a) for a in st.spatial):
                    found = [a for a in st.reduce if uses([e], a)]
                    if found:
                        return found[0]
        return None

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
        config["write_at"] = int(rng.choice(_placeable(places, config["parallel"])))
        if self.structure.inlinable:
            config["inline"] = int(rng.random() < 0.6)
            places = (0,) if config["inline"] else self._by_name["read_at"].choices
            config["read_at"] = int(rng.choice(_placeable(places, config["parallel"])))
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

    # -- scheduling ----------------------------------------------------------

    def apply(self, config: Config) -> tvm.s_tir.Schedule:
        config = self.validate(config)
        from tvm import s_tir

        try:
            sch = self._apply(config)
        except (s_tir.ScheduleError, tvm_error()) as e:
            text = str(e).strip().splitlines()
            raise ScheduleFailed(f"schedule failed: {type(e).__name__}: {text[-1] if text else ''}") from e
        if config.get("licm", 1):
            return sch
        import tvm

        from compiler.passes.licm import without_licm

        mod = sch.mod
        return s_tir.Schedule(tvm.IRModule({**{gv: f for gv, f in mod.functions.items()},
                                            mod.get_global_var("main"): without_licm(mod["main"])}))

    def _apply(self, config: Config) -> tvm.s_tir.Schedule:
        from tvm import s_tir

        st = self.structure
        sch = s_tir.Schedule(self.mod)
        if config.get("inline", 0):
            for name in st.inlinable:
                sch.compute_inline(sch.get_sblock(name))
        for name in st.epilogue_inline:
            sch.compute_inline(sch.get_sblock(name))
        main = sch.get_sblock(st.main)
        write_at = config["write_at"]
        epilogue = sch.get_sblock(st.epilogue) if st.epilogue is not None else None
        if epilogue is None and write_at:
            epilogue = sch.cache_write(main, 0, "global")

        loops = sch.get_loops(main)
        assert len(loops) == len(st.axes), f"{len(loops)=} != {len(st.axes)=}"
        levels: dict[tuple[str, int], list] = {}
        for loop, axis in zip(loops, st.axes):
            parts = sch.split(loop, factors=self.factors(config, axis), preserve_unit_iters=True)
            for level, part in enumerate(parts):
                levels.setdefault((axis.kind, level), []).append(part)
        if config.get("tensorize", 0):  # the register block as the instruction's pattern takes it: rows, then the
            inner = levels[("S", SPATIAL_LEVELS - 1)]  # output vectors (the weight's axes), then the lanes
            block = self._vector_block_axes
            levels[("S", SPATIAL_LEVELS - 1)] = (
                [loop for loop, a in zip(inner[:-1], st.spatial) if a not in block]
                + [loop for loop, a in zip(inner[:-1], st.spatial) if a in block] + inner[-1:])
        order = ORDERS[config["order"]]
        ordered = [loop for token in order for loop in levels.get(token, [])]
        if st.group is not None:  # the group loop: innermost under a tensorized register block, else with R0
            group = levels[("G", 0)]
            at = len(ordered) if config.get("tensorize", 0) else ordered.index(levels[("R", 0)][-1]) + 1
            ordered[at:at] = group
        sch.reorder(*ordered)

        threaded = config["parallel"] > 0
        outer_levels = max(config["parallel"], 1)
        outer = [loop for level in range(outer_levels) for loop in levels[("S", level)]]
        if threaded:
            fused = last = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        else:
            # one thread: the outer loops stay apart -- a fused loop's div/mod indices keep LLVM from
            # vectorizing the rows on its own (the untuned depthwise nest ran 10x slower fused)
            fused, last = outer[0], outer[-1]
        def anchor(level: int):  # the last loop of spatial tile level `level` - 1 (the fused one if parallel)
            return last if level == outer_levels else levels[("S", level - 1)][-1]

        read_at = config.get("read_at", 0)
        if read_at:
            for name in st.inlinable:  # nearest first: each one's consumer is already under the anchor
                producer = sch.get_sblock(name)
                sch.compute_at(producer, anchor(read_at), preserve_unit_loops=True)
                self._vectorize_tail(sch, producer, config)
        if epilogue is not None:
            if write_at:
                sch.reverse_compute_at(epilogue, anchor(write_at), preserve_unit_loops=True)
                self._vectorize_tail(sch, epilogue, config)
            else:
                self._schedule_root(sch, epilogue, config)
        if threaded:
            sch.parallel(fused)
        if config["vectorize"] and order[-1][0] == "S" and self.factors(config, st.spatial[-1])[-1] > 1:
            sch.vectorize(levels[("S", SPATIAL_LEVELS - 1)][-1])
        if config["unroll"]:
            sch.annotate(fused, "pragma_auto_unroll_max_step", config["unroll"])
            # explicit: LLVM codegen ignores the implicit unroll hint
            sch.annotate(fused, "pragma_unroll_explicit", 1)
        if config.get("tensorize", 0):
            from compiler.passes.tensorize import mark

            mark(sch, self._tensorize_loop(config, levels[("R", REDUCE_LEVELS - 1)]), "outer_product")
        first_reduce = levels[("R", 0)][0]
        sch.decompose_reduction(main, first_reduce)
        if not config.get("inline", 0) and not read_at:
            for name in st.inlinable:
                self._schedule_root(sch, sch.get_sblock(name), config)
        return sch

    def _tensorize_loop(self, config: Config, inner_reduce: list):
        """The loop `tensorize` marks: of the inner reduction level (one loop per reduction axis, in axis
        order, directly above the register block), the last that is no unit loop; TVM's lowering drops the
        unit loops after it, so the mark holds the register block. The last one where all are unit loops
        (the mark keeps it)."""
        factors = [self.factors(config, a)[-1] for a in self.structure.reduce]
        assert len(factors) == len(inner_reduce), f"{len(factors)=} != {len(inner_reduce)=}"
        wide = [k for k, f in enumerate(factors) if f > 1]
        return inner_reduce[wide[-1] if wide else -1]

    def _transposed(self, sch: tvm.s_tir.Schedule, block, config: Config) -> bool:
        """With `transpose`, a layout conversion (a copy whose input and output are contiguous along different
        loops) scheduled for transposed tiles in registers (`compiler.passes.tensorize.schedule_transpose`)."""
        if not (config.get("transpose", 0) and config["vectorize"]):
            return False
        from compiler.passes.tensorize import schedule_transpose

        return schedule_transpose(sch, block, list(sch.get_loops(block)), self.unit.lanes)

    def _vectorize_tail(self, sch: tvm.s_tir.Schedule, block, config: Config) -> None:
        """Vectorizes the innermost loop of a block placed in a tile (if short enough, and of a constant
        extent: a producer computed in a tile of a strided access may span a loop-dependent region); a layout
        conversion with `transpose`: transposed tiles."""
        from tvm import tirx

        if not config["vectorize"] or self._transposed(sch, block, config):
            return
        inner = sch.get_loops(block)[-1]
        extent = sch.get(inner).extent
        if isinstance(extent, tirx.IntImm) and 1 < int(extent) <= MAX_EPILOGUE_VECTOR:
            sch.vectorize(inner)

    def _schedule_root(self, sch: tvm.s_tir.Schedule, block, config: Config) -> None:
        """A block left at the root (a producer, a layout conversion, an epilogue): the fewest outer loops
        that make `MIN_PARALLEL_CHUNKS` chunks fused and parallel, the most inner loops that make at most
        `MAX_EPILOGUE_VECTOR` lanes fused and vectorized, the loops between them serial.

        Fusing every loop but the last into the parallel loop made a GEMM's data conversion (`M K/2 2`) 387,200
        parallel chunks of 2 lanes, each with its div/mod indices: rows in parallel and the rest serial took
        a bf16 3025x127x255 GEMM from 0.40 to 0.36 ms, and the 55x55 convs of the dot suite 3% down (znver5).

        A layout conversion with `transpose`: transposed tiles (`_transposed`), the loops outside the tile's two
        parallel as above."""
        if self._transposed(sch, block, config):
            if config["parallel"]:
                loops = sch.get_loops(block)[:-2]
                outer, chunks = 0, 1
                while outer < len(loops) and chunks < MIN_PARALLEL_CHUNKS:
                    chunks *= int(sch.get(loops[outer]).extent)
                    outer += 1
                if outer:
                    sch.parallel(sch.fuse(*loops[:outer]) if outer > 1 else loops[0])
            return
        loops = sch.get_loops(block)
        extents = [int(sch.get(loop).extent) for loop in loops]
        inner, lanes = len(loops), 1  # loops[inner:] are vectorized
        while inner > 1 and lanes * extents[inner - 1] <= MAX_EPILOGUE_VECTOR:
            inner -= 1
            lanes *= extents[inner]
        if config["parallel"] and len(loops) > 1:
            outer, chunks = 0, 1  # loops[:outer] are parallel
            while outer < min(inner, len(loops) - 1) and chunks < MIN_PARALLEL_CHUNKS:
                chunks *= extents[outer]
                outer += 1
            sch.parallel(sch.fuse(*loops[:outer]) if outer > 1 else loops[0])
        if config["vectorize"] and inner < len(loops) and lanes > 1:
            sch.vectorize(sch.fuse(*loops[inner:]) if len(loops) - inner > 1 else loops[inner])


def tensorizable(mod: tvm.IRModule, st: Structure) -> bool:
    """Whether `tensorize` is offered: the main block computes in float32 from float32 operands, the form of the
    fp32 FMA micro-kernels, or it is in the dot-product form (a `G` axis: a model's quantized or bf16 conv,
    `compiler.workloads.model.layouts.conv2d_nhwc_dot`, or a catalog int8 / bf16 operator in its layout
    template's dot-product form, `compiler.layout.templates`), whose group loop `_apply` then puts innermost,
    below the lanes, as the instructions take it. Another int8 (u8 x s8 -> s32) or bf16 (-> fp32) program (the
    catalog's own layouts) is not offered it: their dot-product instructions take groups of 4 (2) consecutive
    reduction elements of weights packed `[N/L, K/G, L, G]`; marked, their nests would never match."""
    from tvm import s_tir

    if st.group is not None:
        return True
    sch = s_tir.Schedule(mod)
    block = sch.get(sch.get_sblock(st.main))
    buffers = [block.writes[0].source, *(r.source for r in block.reads)]
    return all(str(b.dtype) == "float32" for b in buffers)


def _placeable(levels: Sequence[int], parallel: int) -> list[int]:
    """The placements (write_at / read_at) among `levels` that do not lie inside the fused parallel loop."""
    return [level for level in levels if level == 0 or level >= max(parallel, 1)]


@functools.lru_cache(maxsize=64)
def loop_space(prim_func: tvm.tirx.PrimFunc, unit: VectorUnit | None = None) -> LoopSpace:
    """`LoopSpace(prim_func, unit)`, built once per program and vector unit (the analysis applies schedules)."""
    return LoopSpace(prim_func, unit)


SpaceKind = Literal["loop", "fusion"]


def make_space(kind: SpaceKind, prim_func: tvm.tirx.PrimFunc | tvm.IRModule, workload: Any = None,
               unit: VectorUnit | None = None) -> SearchSpace:
    """The search space called `kind` over `prim_func` ("fusion": `tuner.fusion_space.FusionSpace`, which
    offers a catalog subgraph's `workload` in blocked layouts too), for the vector unit `unit` (the task's
    target's, `compiler.target.vector_unit`; this machine's when None)."""
    if kind == "loop":
        return LoopSpace(prim_func, unit)
    if kind == "fusion":
        from .fusion_space import FusionSpace

        return FusionSpace(prim_func, unit, workload=workload)
    raise ValueError(f"unknown search space: {kind}")


def sample_unique(space: SearchSpace, rng: np.random.Generator, n: int, exclude: Sequence[str] = ()) -> list[Config]:
    """Up to `n` distinct configurations whose keys are not in `exclude` (gives up after 8n draws)."""
    seen = set(exclude)
    out: list[Config] = []
    for _ in range(8):
        for config in space.sample(rng, n):
            key = config_key(config)
            if key not in seen:
                seen.add(key)
                out.append(config)
                if len(out) == n:
                    return out
    return out
