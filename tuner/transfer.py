"""Schedule transfer (issue 61): a stored schedule of the most similar workload on this target, adapted to a new
task's shapes, for a search to measure before anything else.

The schedules table keeps the best configuration per exact workload key, so another ResNet's conv, or the same
conv at another batch, gets nothing from it. Here a task's loop space gets a `TransferKey`: a `signature` that is
equal for two workloads whose configurations carry over one to the other (the same operator form, fused epilogue
and layout form, on the same vector unit) and the main block's axis `extents`. Stored schedules of the same
signature are ranked by `distance` between extents (`rank`), and each is carried to the task's space (`adapt`):
its tile factors moved to the nearest divisors of the new extents, its other knobs kept. `transferred` is what a
search starts from.

Only `LoopSpace` tasks (one reduction) have a key: a configuration of ALT's joint space (`layout.*` knobs) or of
basteln's fusion space describes another program, and is not carried. The model tuner's tasks (searched in their
loop space) are what this is for; a catalog operator's stored schedule is mostly ALT's, a layout configuration.

Layering: `tuner` imports `compiler`, never `service` or `bench`.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Integral

from tvm import s_tir

from compiler.target import vector_unit
from compiler.workloads.subgraphs import Subgraph

from .spaces import Config, InvalidConfig, LoopSpace, config_key, has_layout, is_fusion_config, loop_space, reductions
from .spaces.divisors import divisors
from .spaces.loop_knobs import SPATIAL_LEVELS
from .spaces.loop_structure import Axis, main_reads
from .task import Task
from .version import SPACE_VERSION

# the scheme of `signature`: bump it when what the signature covers changes, so stored signatures stop matching
SIGNATURE_VERSION = 1
SIGNATURE_CHARS = 16  # hex digits of sha256 kept: 64 bits, collisions out of reach for any schedules table


@dataclass(frozen=True)
class TransferKey:
    """What a task's schedules are found by: `signature` (equal where configurations carry over) and the main
    block's axis extents, in the signature's axis order."""

    signature: str
    extents: tuple[int, ...]


@dataclass(frozen=True)
class StoredSchedule:
    """A schedules-table row as transfer reads it: the workload it was tuned for, its axis extents (its `TransferKey`'s,
    stored with it when it was tuned), its configuration and latency, and its signature: None where the caller
    already selected the rows by the task's signature (a query on the stored column), else `rank` keeps only those
    of the key's."""

    workload_key: str
    extents: tuple[int, ...]
    config: Config
    latency_ms: float
    signature: str | None = None


def space_of(task: Task) -> LoopSpace | None:
    """`task`'s loop space for its target's vector unit; None where it has none (no reduction), or where `tune`
    searches basteln's `FusionSpace` instead (several reductions, a catalog subgraph), whose configurations are not
    carried."""
    if isinstance(task.workload, Subgraph):
        return None
    try:
        if reductions(task.prim_func) != 1:
            return None
        return loop_space(task.prim_func, vector_unit(task.target))
    except (ValueError, AssertionError):  # no reduction block, not a TE-made program, a target with no vector unit
        return None


def signature(task: Task) -> TransferKey | None:
    """The key `task`'s schedules are stored and found by; None for a task without a loop space.

    The signature (a sha256 prefix) covers what makes a configuration of one workload a configuration of another,
    and nothing that depends on the shapes:

    - the space's version and the vector unit's lanes and registers (a schedule is carried within one target);
    - the main block's axes in order, each as (name, kind, levels): the operator's loop nest and layout form
      (`n oc_chunk oh ow oc_block ic kh kw` of an NCHWc conv, `nn ff yy xx rc ry rx` of an NCHW one);
    - which axes each region the main block reads is indexed by, dimension by dimension (a conv, a grouped conv and
      a depthwise conv differ there where their axis names may not) and the element types it reads and writes;
    - the blocks around it: the producers it may inline (padding), the epilogue blocks (bias, relu, a residual add,
      a layout conversion back), whether the epilogue can be placed in a tile, and how many parameters the
      program takes (a residual input besides the bias);
    - the non-tile knobs with their choices (`write_at`'s depend on the epilogue, `inline`/`read_at` and
      `tensorize` exist or not).

    Axes of extent 1: a spatial one does not change the signature (a batch of 1, one output channel chunk, a
    1-wide output are smaller instances of the same nest, and batch is what changes most between jobs); a
    reduction of extent 1 does, and which one (a 1x1 conv's kernel window, a 1xk kernel, a matmul with k = 1, a
    mean over a 1x1 map): a reduction of one element is none, and the best nest of what is left differs -- a 1x1
    conv is a GEMM over channels, whose inner reduction level holds the channel tile, where a 3x3 conv's holds the
    window (`LoopSpace.blocked_config`). Tile knob names are left out for the same reason: they exist only for
    axes of extent > 1.
    """
    space = space_of(task)
    if space is None:
        return None
    st = space.structure
    reads, uses = main_reads(space.mod, st)
    axes = st.axes
    read_forms = tuple(tuple(tuple(a.name for a in axes if uses([e], a)) for e in indices) for indices in reads)
    main = space.mod["main"]
    parts = (
        ("version", SIGNATURE_VERSION, SPACE_VERSION),
        ("space", "loop"),
        ("unit", space.unit.lanes, space.unit.registers),
        ("axes", tuple((a.name, a.kind, a.levels) for a in axes)),
        ("unit_reductions", tuple(a.name for a in axes if a.kind != "S" and a.extent == 1)),
        ("reads", read_forms),
        ("dtypes", _main_dtypes(space)),
        ("blocks", st.inlinable, st.epilogue_inline, st.epilogue, space.fuse_epilogue, len(main.params)),
        ("knobs", tuple((k.name, k.choices) for k in space.knobs if not k.name.startswith("tile."))),
    )
    digest = hashlib.sha256(repr(parts).encode()).hexdigest()[:SIGNATURE_CHARS]
    return TransferKey(digest, tuple(a.extent for a in axes))


def _main_dtypes(space: LoopSpace) -> tuple[str, ...]:
    """The element types the main block writes, then reads (in its read order)."""
    sch = s_tir.Schedule(space.mod)
    block = sch.get(sch.get_sblock(space.structure.main))
    return tuple(str(region.source.dtype) for region in (*block.writes, *block.reads))


def distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """How far apart two workloads of one signature are: the sum over axes of |log2(a_i / b_i)| (a conv of twice
    the channels is 1 away, of twice the channels and half the width 2)."""
    assert len(a) == len(b), f"{len(a)=} != {len(b)=}: extents of different signatures"
    return sum(abs(math.log2(x / y)) for x, y in zip(a, b))


def adapt(config: Config, task: Task) -> Config | None:
    """`config` carried to `task`'s loop space; None where it cannot be.

    Each axis's tile factors are chosen from the innermost level outward, each the divisor of what is left of the
    axis's extent nearest (in log2) to the source's factor at that level (1 where the source has none: an axis it
    lacks or had of extent 1) among the knob's choices; ties take the smaller factor. The other knobs are copied
    where their value is among the new knob's choices, else the nearest choice; knobs the source lacks take the
    space's untuned value. A register block over the unit's registers is shrunk (`_fit_registers`). Carried to
    the space it came from, a valid configuration comes back as it was (its canonical form, `validate`).

    Returns None (never raises) for a task without a loop space, a configuration of another space (`layout.*` or
    fusion knobs), a value that is not an integer, or a result that does not validate (placements that were not
    valid at the source either).
    """
    space = space_of(task)
    if space is None or not isinstance(config, dict) or has_layout(config) or is_fusion_config(config):
        return None
    if any(isinstance(v, bool) or not isinstance(v, Integral) for v in config.values()):
        return None
    choices = {k.name: k.choices for k in space.knobs}
    out: Config = dict(space.untuned_config())
    for axis in space.structure.axes:
        if axis.extent == 1:
            continue
        rest = axis.extent
        for level in range(axis.levels - 1, 0, -1):
            fits = [d for d in divisors(rest) if d in choices[axis.knob(level)]]
            factor = _nearest_log(fits, int(config.get(axis.knob(level), 1)))
            out[axis.knob(level)] = factor
            rest //= factor
    for name, values in choices.items():
        if name.startswith("tile.") or name not in config:
            continue
        value = int(config[name])
        out[name] = value if value in values else min(values, key=lambda c: (abs(c - value), c))
    out = _fit_registers(space, out)
    try:
        return space.validate(out)
    except InvalidConfig:
        return None


def _nearest_log(choices: list[int], want: int) -> int:
    """The choice nearest `want` in log2 (the smaller on a tie); `want` below 1 counts as 1."""
    target = math.log2(max(want, 1))
    return min(choices, key=lambda d: (abs(math.log2(d) - target), d))


def _fit_registers(space: LoopSpace, config: Config) -> Config:
    """`config` with its innermost spatial tiles shrunk until their product fits the unit's registers
    (`VectorUnit.register_tile`): the largest factor of the rows (the spatial axes before the last) first, each time
    to its largest proper divisor, the vector axis (the last) only when the rows are all 1; a smaller inner factor
    still divides the axis, so the tiles stay valid."""
    config = dict(config)
    spatial = [a for a in space.structure.spatial if a.extent > 1]
    innermost = SPATIAL_LEVELS - 1

    def register() -> int:
        return math.prod(config[a.knob(innermost)] for a in spatial)

    while register() > space.unit.register_tile:
        rows = [a for a in spatial[:-1] if config[a.knob(innermost)] > 1]
        axis: Axis = max(rows, key=lambda a: config[a.knob(innermost)]) if rows else spatial[-1]
        factor = config[axis.knob(innermost)]
        config[axis.knob(innermost)] = max(d for d in divisors(factor) if d < factor)
    return config


def rank(candidates: Iterable[StoredSchedule], key: TransferKey, limit: int = 3) -> list[StoredSchedule]:
    """The stored schedules of `key`'s signature (those without one: all, as selected by it) nearest `key.extents`
    first (on a tie the faster first), at most `limit`. A schedule of the very workload (distance 0) comes first: the
    caller may already have measured it."""
    same = [c for c in candidates
            if c.signature in (None, key.signature) and len(c.extents) == len(key.extents)]
    # rounded: equal distances summed in another order (log2 6 against log2 2 + log2 3) tie, and the faster wins
    same.sort(key=lambda c: (round(distance(tuple(c.extents), key.extents), 9), c.latency_ms, c.workload_key))
    return same[:max(limit, 0)]


def transferred(task: Task, candidates: Iterable[StoredSchedule], limit: int = 3) -> list[tuple[Config, str]]:
    """What a search of `task` measures first: the configurations of the nearest stored schedules of its signature
    (`rank`), carried to its space (`adapt`), each with the workload key it came from; distinct ones only (two
    sources that adapt alike count once, and the next nearest takes the place), at most `limit`. Empty for a task
    without a loop space or with no schedule of its signature."""
    key = signature(task)
    if key is None or limit <= 0:
        return []
    ranked = rank(candidates, key, limit=sys.maxsize)  # all of them: a source that adapts as a nearer one did
    out: list[tuple[Config, str]] = []
    seen: set[str] = set()
    for stored in ranked:
        config = adapt(stored.config, task)
        if config is None or config_key(config) in seen:
            continue
        seen.add(config_key(config))
        out.append((config, stored.workload_key))
        if len(out) == limit:
            break
    return out
