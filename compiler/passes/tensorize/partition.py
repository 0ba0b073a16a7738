"""Loop partitioning (the paper's Alg. 2, `PartitionBranchLoop`): for each loop, the intervals of its variable
where every condition in its body is provably true or provably false, the loop split there, the decided
conditions removed in each piece, recursively.

A schedule that splits a loop by a factor that does not divide it leaves `if i_0 * 16 + i_1 < 55` inside the
nest; TVM's `tensorize` and our pattern matcher (`select.py`) cannot match a nest with a branch. After the
partition, the main part of the loop (`i_0 < 3`) has no branch and matches; only the remainder (`i_0 == 3`,
where the inner loop shrinks to `i_1 < 7`) stays scalar.

How the intervals are found (`FindPartition`): every condition of an `if` in the body, and of an `if_then_else`
in a value stored in a transpose's tile (a padding's: `pad[h, w] = if_then_else(1 <= h && h <= 56 && ...,
data[h - 1, w - 1], 0)`; other marked nests, an outer product reading a padded input, are not split on them),
is split into its atoms (`&&`, `||`, `!`); for each atom that mentions the loop variable, TVM's bound deduction
(`tvm.sym.deduce_bound`, the integer solver TVM's own `LoopPartition` uses) gives the values of the
variable where the atom holds for *all* values of the loops inside the body (relaxed over their ranges) and,
for the negated atom, where it fails for all of them, given the ranges of the enclosing loops (the
constraint map C). The ends of these intervals cut the loop's range into pieces (TSet, FSet and what lies
between, BSet); each piece gets a copy of the body with a fresh loop variable (and fresh buffers for
the ones the body allocates), in which
`EliminateCondition` replaces every `if` (and `if_then_else`) whose condition the analyzer proves true or false
under the piece's ranges by the branch taken (so a padded conversion's inner part is a plain copy that
`transpose.py` matches, and its border pieces stores of the padding value); pieces whose body becomes empty
are dropped; then the body is partitioned recursively with the piece's range in C.

A thread (`AttrStmt "thread_extent"`, the paper's `thread(tid, 4)`) is partitioned like a loop over
`[0, extent)`, the pieces becoming an `if tid < a ... else ...` chain, as in the paper's MEMCPY example.

Only loops on the way to a marked loop (`mark.ANNOTATION`) and the loops inside it are partitioned
(`marked_only`): partitioning everything would copy unmarked code for nothing.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import s_tir, tirx

from ... import tir_util
from .mark import ANNOTATION

MAX_PIECES = 8  # a loop cut into more pieces than this is left whole (code size)


def partition(func: tvm.tirx.PrimFunc, marked_only: bool = True) -> tvm.tirx.PrimFunc:
    """Partitions the loops of a lowered PrimFunc (after `LowerOpaqueBlock`) as the module docstring says.

    Args:
        func: the function; its loops must have constant ranges to be partitioned (others are recursed into).
        marked_only: partition only the loops that hold a marked loop, or lie inside one.

    Returns:
        The function with its loops partitioned (the same object where nothing changed).
    """
    body = _Partitioner(marked_only).stmt(func.body, inside=not marked_only)
    return func if body.same_as(func.body) else func.with_body(body)


def partition_stmt(stmt: Any, marked_only: bool = True) -> Any:
    """`partition` of one statement."""
    return _Partitioner(marked_only).stmt(stmt, inside=not marked_only)


def eliminate_conditions(stmt: Any, ranges: dict[int, tuple[Any, int, int]]) -> Any:
    """`EliminateCondition`: every `if` in `stmt`, and every `if_then_else` in a stored value, whose condition is
    provably true or false, given the variable ranges `ranges` (handle -> (var, lo, hi), inclusive) and those of
    the loops inside `stmt`, replaced by the branch it takes; a loop whose body becomes empty is removed."""
    analyzer = tvm.sym.Analyzer()
    for var, lo, hi in ranges.values():
        analyzer.bind(var, tvm.ir.Range.from_min_extent(lo, hi - lo + 1), allow_override=True)

    def decide(x: Any) -> Any | None:
        if not tir_util.is_if_then_else(x):
            return None
        cond = analyzer.simplify(x.args[0])
        if analyzer.can_prove(cond):
            return tir_util.rewrite(x.args[1], decide)
        if analyzer.can_prove(tirx.Not(cond)):
            return tir_util.rewrite(x.args[2], decide)
        return None

    def go(s: Any) -> Any:
        if isinstance(s, tirx.SeqStmt):
            return tir_util.seq([go(c) for c in s.seq])
        if isinstance(s, tirx.BufferStore):
            value = tir_util.rewrite(s.value, decide)
            return s if value.same_as(s.value) else tirx.BufferStore(s.buffer, value, s.indices)
        if isinstance(s, tirx.For):
            lo, ext = tir_util.const_int(s.min), tir_util.const_int(s.extent)
            if lo is not None and ext is not None:
                if ext <= 0:
                    return tir_util.noop()
                analyzer.bind(s.loop_var, tvm.ir.Range.from_min_extent(lo, ext), allow_override=True)
            body = go(s.body)
            if tir_util.is_noop(body):
                return tir_util.noop()
            return s if body.same_as(s.body) else tirx.For(s.loop_var, s.min, s.extent, s.kind, body,
                                                            s.thread_binding, s.annotations, s.step)
        if isinstance(s, tirx.AttrStmt):
            if s.attr_key == "thread_extent" and tir_util.const_int(s.value) is not None:
                analyzer.bind(s.node.var, tvm.ir.Range.from_min_extent(0, tir_util.const_int(s.value)),
                              allow_override=True)
            body = go(s.body)
            return s if body.same_as(s.body) else tirx.AttrStmt(s.node, s.attr_key, s.value, body)
        if isinstance(s, tirx.IfThenElse):
            cond = analyzer.simplify(s.condition)
            if analyzer.can_prove(cond):
                return go(s.then_case)
            if analyzer.can_prove(tirx.Not(cond)):
                return tir_util.noop() if s.else_case is None else go(s.else_case)
            then = go(s.then_case)
            other = None if s.else_case is None else go(s.else_case)
            if other is not None and tir_util.is_noop(other):
                other = None
            if tir_util.is_noop(then) and other is None:
                return tir_util.noop()
            return tirx.IfThenElse(s.condition, then, other)
        return s

    return go(stmt)


def find_partition(body: Any, var: Any, lo: int, hi: int, ranges: dict[int, tuple[Any, int, int]],
                   in_transpose: bool = False) -> list[int]:
    """`FindPartition` for TSet and FSet at once: the points in `(lo, hi]` where a piece of `var`'s range begins,
    at the ends of the intervals on which some condition of `body` is decided (true or false for every
    iteration of the loops inside `body`): of its `if`s, and of the `if_then_else`s its transpose tiles store
    (all of them where `body` lies in one: `in_transpose`)."""
    conditions = [s.condition for s in tir_util.walk(body) if isinstance(s, tirx.IfThenElse)]
    tiles = [body] if in_transpose else [s.body for s in tir_util.walk(body) if _is_transpose(s)]
    conditions += [c.args[0] for tile in tiles for s in tir_util.walk(tile) if isinstance(s, tirx.BufferStore)
                   for c in tir_util.conditionals(s.value)]
    atoms = [a for c in conditions for a in _atoms(c) if tir_util.uses(a, var)]
    if not atoms:
        return []
    hint = {v: tvm.sym.IntervalSet(a, b) for v, a, b in ranges.values()}
    relax = {s.loop_var: tvm.sym.IntervalSet(tir_util.const_int(s.min), tir_util.const_int(s.min) + tir_util.const_int(s.extent) - 1)
             for s in tir_util.walk(body) if isinstance(s, tirx.For)
             and tir_util.const_int(s.min) is not None and tir_util.const_int(s.extent) is not None}
    analyzer = tvm.sym.Analyzer()
    points = {k: tirx.const(a, str(v.ty.dtype)) for k, (v, a, b) in ranges.items() if a == b}
    cuts: set[int] = set()
    for atom in atoms:
        for cond in (atom, tirx.Not(atom)):
            bound = tvm.sym.deduce_bound(var, analyzer.simplify(tir_util.subst(cond, points)), hint, relax)
            if bound.is_nothing():
                continue
            a = _bound_value(analyzer, bound.min_value, lo)
            b = _bound_value(analyzer, bound.max_value, hi)
            if a is None or b is None:
                continue
            a, b = max(a, lo), min(b, hi)
            if a > b:
                continue
            cuts.update(p for p in (a, b + 1) if lo < p <= hi)
    return sorted(cuts)


def _bound_value(analyzer: Any, e: Any, default: int) -> int | None:
    """A bound's constant value; `default` for an infinite end; None for a symbolic one."""
    text = str(e)
    if "pos_inf" in text or "neg_inf" in text:
        return default
    return tir_util.const_int(analyzer.simplify(e))


def _atoms(cond: Any) -> list[Any]:
    if isinstance(cond, tirx.And | tirx.Or):
        return _atoms(cond.a) + _atoms(cond.b)
    if isinstance(cond, tirx.Not):
        return _atoms(cond.a)
    return [cond]


class _Partitioner:
    """`PartitionBranchLoop` with the constraint map C (`ranges`: var handle -> (var, lo, hi))."""

    def __init__(self, marked_only: bool) -> None:
        self.marked_only = marked_only
        self.ranges: dict[int, tuple[Any, int, int]] = {}
        self.in_transpose = False  # inside a loop marked "transpose"

    def stmt(self, s: Any, inside: bool) -> Any:
        if isinstance(s, tirx.SeqStmt):
            parts = [self.stmt(c, inside) for c in s.seq]
            return s if all(a.same_as(b) for a, b in zip(parts, s.seq)) else tir_util.seq(parts)
        if isinstance(s, tirx.For):
            marked = ANNOTATION in s.annotations
            if not (inside or marked or _holds_mark(s.body)):
                return s
            return self.loop(s, inside or marked)
        if isinstance(s, tirx.AttrStmt):
            if s.attr_key == "thread_extent" and tir_util.const_int(s.value) is not None \
                    and (inside or _holds_mark(s.body)):
                return self.thread(s, inside)
            body = self.stmt(s.body, inside)
            return s if body.same_as(s.body) else tirx.AttrStmt(s.node, s.attr_key, s.value, body)
        if isinstance(s, tirx.IfThenElse):
            then = self.stmt(s.then_case, inside)
            other = None if s.else_case is None else self.stmt(s.else_case, inside)
            if then.same_as(s.then_case) and (other is None or other.same_as(s.else_case)):
                return s
            return tirx.IfThenElse(s.condition, then, other)
        return s

    def _pieces(self, body: Any, var: Any, lo: int, hi: int) -> list[tuple[int, int]]:
        self.ranges[tir_util.key(var)] = (var, lo, hi)
        try:
            cuts = find_partition(body, var, lo, hi, {k: v for k, v in self.ranges.items() if k != tir_util.key(var)},
                                  self.in_transpose)
        finally:
            del self.ranges[tir_util.key(var)]
        if len(cuts) + 1 > MAX_PIECES:
            cuts = []
        starts = [lo, *cuts]
        return [(a, b - 1) for a, b in zip(starts, [*cuts, hi + 1])]

    def _piece_body(self, body: Any, var: Any, lo: int, hi: int, inside: bool) -> Any:
        self.ranges[tir_util.key(var)] = (var, lo, hi)
        try:
            body = eliminate_conditions(body, self.ranges)
            return self.stmt(body, inside)
        finally:
            del self.ranges[tir_util.key(var)]

    def loop(self, s: Any, inside: bool) -> Any:
        lo, ext = tir_util.const_int(s.min), tir_util.const_int(s.extent)
        if lo is None or ext is None or ext <= 0 or (s.step is not None and tir_util.const_int(s.step) not in (None, 1)):
            body = self.stmt(s.body, inside)
            return s if body.same_as(s.body) else tirx.For(s.loop_var, s.min, s.extent, s.kind, body,
                                                            s.thread_binding, s.annotations, s.step)
        outside, self.in_transpose = self.in_transpose, self.in_transpose or _is_transpose(s)
        try:
            return self._partition_loop(s, lo, ext, inside)
        finally:
            self.in_transpose = outside

    def _partition_loop(self, s: Any, lo: int, ext: int, inside: bool) -> Any:
        pieces = self._pieces(s.body, s.loop_var, lo, lo + ext - 1)
        out = []
        for n, (a, b) in enumerate(pieces):
            var = s.loop_var if len(pieces) == 1 else tirx.Var(s.loop_var.name, str(s.loop_var.ty.dtype))
            body = s.body if len(pieces) == 1 else tir_util.subst_stmt(s.body, {tir_util.key(s.loop_var): var})
            if n and any(isinstance(x, tirx.AllocBuffer) for x in tir_util.walk(body)):
                body = _fresh_allocations(body)  # a copy may not define the first piece's buffers again
            body = self._piece_body(body, var, a, b, inside)
            if tir_util.is_noop(body):
                continue
            dtype = str(s.loop_var.ty.dtype)
            out.append(tirx.For(var, tirx.const(a, dtype), tirx.const(b - a + 1, dtype), s.kind, body,
                                s.thread_binding, s.annotations))
        if len(pieces) == 1 and out and out[0].body.same_as(s.body):
            return s
        return tir_util.seq(out)

    def thread(self, s: Any, inside: bool) -> Any:
        var, ext = s.node.var, tir_util.const_int(s.value)
        pieces = self._pieces(s.body, var, 0, ext - 1)
        bodies = [(a, b, self._piece_body(s.body, var, a, b, inside)) for a, b in pieces]
        chain = None
        for a, b, body in reversed(bodies):
            if chain is None:
                chain = body
            else:
                chain = tirx.IfThenElse(var < tirx.const(b + 1, str(var.ty.dtype)), body,
                                        None if tir_util.is_noop(chain) else chain)
        if len(bodies) == 1 and chain.same_as(s.body):
            return s
        return tirx.AttrStmt(s.node, s.attr_key, s.value, chain)


def _fresh_allocations(body: Any) -> Any:
    """`body` with every buffer (and variable) it defines itself renewed (TVM's `renew_defs`); what it reads from
    outside stays."""
    return s_tir.renew_defs(tirx.PrimFunc([], body)).body


def _is_transpose(s: Any) -> bool:
    return isinstance(s, tirx.For) and str(s.annotations.get(ANNOTATION, "")) == "transpose"


def _holds_mark(s: Any) -> bool:
    return any(isinstance(x, tirx.For) and ANNOTATION in x.annotations for x in tir_util.walk(s))
