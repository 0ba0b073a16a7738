"""basteln's view of a program: every block of the root a `Space` (an iteration space) with its access
relations (`Access`: the block's read and write regions, each index `Affine` in the block's iteration
variables, or `Nonlinear` for a blocked layout's `//` and `%`), as the paper's isl relations; and the
producer/consumer queries on them.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import sym, tirx


class BastelnError(ValueError):
    """A program the pass cannot tile (no output block, a non-affine access it must analyze, bad tile sizes)."""


@dataclass(frozen=True)
class Affine:
    """One index of an access region: sum(coeffs[v] * v) + const, covering `extent` consecutive values."""

    coeffs: tuple[tuple[str, int], ...]
    const: int
    extent: int

    def interval(self, box: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """The values this index takes while each variable ranges over `box` (inclusive bounds)."""
        lo = hi = self.const
        for var, c in self.coeffs:
            a, b = box[var]
            lo, hi = (lo + c * a, hi + c * b) if c >= 0 else (lo + c * b, hi + c * a)
        return lo, hi + self.extent - 1


@dataclass(frozen=True, eq=False)
class Nonlinear:
    """An index that is not affine (`ic // 16`, `ic % 16` of a blocked layout): its values over a box come
    from TVM's integer-set analysis (a hull, as for the affine ones). `coeffs` names the variables it uses
    (coefficient 0: not a plain variable)."""

    expr: Any
    variables: tuple[Any, ...]
    extent: int

    @property
    def coeffs(self) -> tuple[tuple[str, int], ...]:
        used: set[str] = set()
        _vars_of(self.expr, used)
        return tuple((v.name, 0) for v in self.variables if v.name in used)

    @property
    def const(self) -> int:
        return 0

    def interval(self, box: dict[str, tuple[int, int]]) -> tuple[int, int]:
        dom = {v: sym.IntervalSet(box[v.name][0], box[v.name][1]) for v in self.variables if v.name in box}
        found = sym.Analyzer().int_set(self.expr, dom)
        return int(found.min_value), int(found.max_value) + self.extent - 1


def _vars_of(expr: Any, out: set[str]) -> None:
    """The names of the variables in `expr` (a walk over its operands)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, tirx.Var):
            out.add(e.name)
            continue
        for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
            child = getattr(e, attr, None)
            if child is not None and not isinstance(child, (int, float, str)):
                stack.append(child)
        stack.extend(getattr(e, "args", ()) or ())


@dataclass(frozen=True)
class Access:
    """A read or write of `buffer`: one `Affine` per buffer dimension, or None where one is not affine."""

    buffer: str
    indices: tuple[Affine, ...] | None


@dataclass(frozen=True)
class Space:
    """One iteration space (a block of the root): its variables, accesses and role."""

    name: str
    spatial: tuple[tuple[str, int], ...]  # (variable, extent) in block order
    reduce: tuple[tuple[str, int], ...]
    writes: Access
    reads: tuple[Access, ...]

    @property
    def volume(self) -> int:
        """Instances of the space, reductions included."""
        return math.prod(e for _, e in self.spatial) * math.prod(e for _, e in self.reduce)

    @property
    def spatial_volume(self) -> int:
        return math.prod(e for _, e in self.spatial)

    @property
    def identity_write(self) -> bool:
        """Writes buffer[v0, v1, ...] with its spatial variables in order: a producer whose instances a
        footprint of its buffer names one for one (every block TE creates)."""
        idx = self.writes.indices
        return idx is not None and len(idx) == len(self.spatial) and all(
            a.coeffs == ((v, 1),) and a.const == 0 and a.extent == 1 for a, (v, _) in zip(idx, self.spatial))

    @property
    def elementwise(self) -> bool:
        """No reduction, an identity write, and reads indexed by plain variables (or constants)."""
        if self.reduce or not self.identity_write:
            return False
        for access in self.reads:
            if access.indices is None:
                return False
            for a in access.indices:
                if a.extent != 1 or a.const != 0 and a.coeffs or len(a.coeffs) > 1 or any(c != 1 for _, c in a.coeffs):
                    return False
        return True

    def reads_of(self, buffer: str) -> list[Access]:
        return [a for a in self.reads if a.buffer == buffer]

    def quasi_identity(self, buffer: str) -> bool:
        """Reads `buffer` exactly at its own spatial variables, in order (Definition 4.1)."""
        reads = self.reads_of(buffer)
        return bool(reads) and not self.reduce and all(
            r.indices is not None and len(r.indices) == len(self.spatial)
            and all(a.coeffs == ((v, 1),) and a.const == 0 and a.extent == 1 for a, (v, _) in zip(r.indices, self.spatial))
            for r in reads)


def _affine(region: Any, variables: list[Any]) -> tuple[Affine | Nonlinear, ...] | None:
    names = [v.name for v in variables]
    out = []
    for rng in region:
        extent = rng.extent
        if not isinstance(extent, int) and not hasattr(extent, "value"):
            return None
        coeffs = sym.detect_linear_equation(rng.min, variables)
        if len(coeffs) != len(variables) + 1 or not all(hasattr(c, "value") for c in coeffs):
            out.append(Nonlinear(rng.min, tuple(variables), int(extent if isinstance(extent, int) else extent.value)))
            continue
        terms = tuple((n, int(c.value)) for n, c in zip(names, coeffs[:-1]) if int(c.value) != 0)
        out.append(Affine(terms, int(coeffs[-1].value), int(extent if isinstance(extent, int) else extent.value)))
    return tuple(out)


def spaces_of(sch: tvm.s_tir.Schedule) -> list[Space]:
    """The iteration spaces of the root's child blocks, in program (topological) order."""
    allocated = list(sch.get(sch.get_sblock("root")).alloc_buffers)

    def label(buf: Any) -> str:  # TE reuses names (two convs' "pad_temp"): intermediates are told apart by slot
        return next((f"{buf.name}@{i}" for i, a in enumerate(allocated) if a.same_as(buf)), buf.name)

    out = []
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        variables = [iv.var for iv in block.iter_vars]
        spatial, reduce = [], []
        for iv in block.iter_vars:
            extent = iv.dom.extent
            if not hasattr(extent, "value"):
                raise BastelnError(f"block {block.name_hint}: iteration variable {iv.var} has a symbolic extent")
            kind = reduce if iv.iter_type == tirx.IterVar.CommReduce else spatial
            kind.append((iv.var.name, int(extent.value)))
        if len(block.writes) != 1:
            raise BastelnError(f"block {block.name_hint} writes {len(block.writes)} buffers; one is expected")
        w = block.writes[0]
        reads = tuple(Access(label(r.source), _affine(r.region, variables)) for r in block.reads)
        write = Access(label(w.source), _affine(w.region, variables))
        # a block whose variables come in another order than the dimensions it writes (`rfactor`'s partial
        # block puts the lanes first): its spatial variables in the order of what it writes
        named = [a.coeffs[0][0] if a.coeffs and len(a.coeffs) == 1 and a.coeffs[0][1] == 1 and not a.const
                 and a.extent == 1 else None for a in write.indices or ()]
        if sorted(filter(None, named)) == sorted(v for v, _ in spatial) and len(named) == len(spatial):
            spatial = sorted(spatial, key=lambda ve: named.index(ve[0]))
        out.append(Space(block.name_hint, tuple(spatial), tuple(reduce), write, reads))
    return out


def consumers_of(spaces: dict[str, Space], name: str) -> list[str]:
    buf = spaces[name].writes.buffer
    return [s.name for s in spaces.values() if s.name != name and any(r.buffer == buf for r in s.reads)]


def producer_of(spaces: dict[str, Space], buffer: str) -> str | None:
    return next((s.name for s in spaces.values() if s.writes.buffer == buffer), None)


def reuse(consumer: Space, buffer: str, producer: Space) -> float:
    """How many times `consumer` reads each element of `buffer` on average (1: once)."""
    return len(consumer.reads_of(buffer)) * consumer.volume / max(producer.spatial_volume, 1)


@dataclass
class Group:
    """Spaces scheduled together (Alg. 1): an anchor and the element-wise blocks that follow it."""

    anchor: str
    tail: list[str] = field(default_factory=list)

    @property
    def blocks(self) -> list[str]:
        return [self.anchor, *self.tail]
