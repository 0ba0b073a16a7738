"""Loop-invariant code motion for tensor programs (Liang and Hua, "A Loop Invariant Code Motion Technique
for Deep Learning Compiler"): normalize, then hoist what pays.

The loop transformations a schedule applies (split, tile, ALT's unfold and split layouts) leave index
arithmetic of every loop variable in the innermost loop: `xo * 32768 + xi * 1024 + yo * 32 + yi`,
div/mod chains of a layout, and padding conditions `3 <= h && h < 59 && 3 <= w && w < 59`. The pass:

1. normalizes (the paper's Alg. 2): every sub-expression gets a rank (constants and names bound
   outside all loops 0, a loop variable its loop depth, an expression the max of its operands', a
   load or an impure call "varies everywhere"); chains of an associative and commutative operator
   (integer `+`/`-`, `*`, `min`, `max`; `&&`, `||`) are flattened, stable-sorted by rank, grouped
   by equal rank and rebuilt left to right, so that every prefix is invariant in the loops deeper
   than its rank; nested conditionals with the same result collapse into one condition (expressions
   (3) -> (4) of the paper, for `Select`, `if_then_else` and nested `if` statements); adjacent `if`
   statements on the same load-free condition merge;
2. hoists (Alg. 1): a maximal sub-expression whose rank is below the depth where it is evaluated is
   bound once (`Bind`) right before the outermost loop it does not depend on, and its operands are
   considered again there (so parts of it move further out); a `Bind` inside a loop whose value is
   invariant (a single invariant definition) moves out as a whole when that pays (below); equal
   expressions bound at the same place share one name; constants of a chain join its lowest-ranked
   group (`cse_v1 - 57` hoisted together);
3. gates each hoist by cost (Sec. III-D): cost(e) = cost of its operator + the costs of its operands
   (names and constants 0, `+ - * min max`, comparisons and logic 1, `/ %` 3, other pure calls 3);
   only expressions of cost >= K (default 1) without side effects are hoisted, and hoisting out of
   loops that LLVM unrolls completely (constant extent <= `unrolled_extent`) counts for nothing.

Where it runs: at the end of TVM's default TIR pipeline, after its last `StmtSimplify` and
`CommonSubexprElim`, so nothing substitutes our integer `Bind`s back (the paper had to patch TVM's
simplifier for that) and the CSE names are hoisted too. `compiler.pipeline.compile_module` selects the
pipeline; every build of operator candidates, model tasks and artifacts goes through it.

Only scalar expressions move (a vector `Ramp` stays, its base is hoisted); integer `+`/`*` are
reassociated, floating-point ones never (rounding would change); loads are never hoisted (a store in
the loop may change them), nor divisions by a non-constant (a guard may protect them).

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx

from compiler.tir_util import children, dtype_of, expr_shape, rebuild

HOIST_THRESHOLD = 1
UNROLLED_EXTENT = 8
VARIES = 1 << 30  # the rank of loads and impure calls: never invariant
OPERATOR_COST = {"Add": 1, "Sub": 1, "Mul": 1, "Min": 1, "Max": 1, "Div": 3, "Mod": 3, "FloorDiv": 3, "FloorMod": 3,
                 "EQ": 1, "NE": 1, "LT": 1, "LE": 1, "GT": 1, "GE": 1, "And": 1, "Or": 1, "Not": 1, "Select": 1,
                 "LShift": 1, "RShift": 1, "BitwiseAnd": 1, "BitwiseOr": 1, "BitwiseXor": 1, "BitwiseNot": 1,
                 "Cast": 0}
CALL_COST = 3
PURE_EFFECTS = (0, 1)  # CallEffectKind ExprAnnotation, Pure
_ASSOCIATIVE = ("Add", "Mul", "Min", "Max", "And", "Or")  # Sub joins Add's chains with a sign


def licm_pass(threshold: int = HOIST_THRESHOLD, unrolled_extent: int = UNROLLED_EXTENT) -> tvm.transform.Pass:
    """The pass over every PrimFunc of a module (see the module docstring).

    Args:
        threshold: K, the least cost an expression must have to be hoisted.
        unrolled_extent: loops of a constant extent up to this are taken as unrolled by LLVM:
            hoisting out of them alone saves nothing.
    """
    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="altune.LICM")
    def _licm(func: Any, _mod: Any, _ctx: Any) -> Any:
        return licm(func, threshold, unrolled_extent)

    return _licm


def licm(func: tvm.tirx.PrimFunc, threshold: int = HOIST_THRESHOLD,
         unrolled_extent: int = UNROLLED_EXTENT) -> tvm.tirx.PrimFunc:
    """Normalizes and hoists the loop invariants of one PrimFunc (lowered TIR, after `FlattenBuffer`).

    A function marked `"altune.licm": False` (`without_licm`) is returned as it is.
    """
    if func.attrs is not None and "altune.licm" in func.attrs and not bool(func.attrs["altune.licm"]):
        return func
    body = _Motion(threshold, unrolled_extent).stmt(func.body)
    return func if body.same_as(func.body) else func.with_body(body)


def without_licm(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` marked so that the pass leaves it alone in a pipeline that runs it (one program of a model,
    one candidate of a search); the mark survives TVM's lowering."""
    return func.with_attr("altune.licm", False)


def cost(e: Any) -> int:
    """The paper's cost: 0 for names and constants, else its operator's cost plus its operands'."""
    shape = expr_shape(e)
    if shape in ("var", "const", "leaf", "load"):
        return 0
    own = CALL_COST if shape == "call" else OPERATOR_COST.get(type(e).__name__, 1)
    return own + sum(cost(c) for c in children(e))


# ---------------------------------------------------------------------------
# Expressions: what they are (their operands and rebuilding them: `compiler.tir_util`)


@functools.cache
def _dtype_kind(dtype: str) -> str:
    """"int" (integers, booleans), "float", or "other" (vectors, handles) for a scalar dtype string."""
    t = tvm.DataType(dtype)
    if t.lanes != 1:
        return "other"
    if t.type_code in (tvm.DataTypeCode.INT, tvm.DataTypeCode.UINT, tvm.DataTypeCode.BOOL):
        return "int"
    return "float" if t.type_code == tvm.DataTypeCode.FLOAT else "other"


def _scalar(e: Any) -> bool:
    ty = getattr(e, "ty", None)
    return ty is not None and hasattr(ty, "dtype") and _dtype_kind(str(ty.dtype)) != "other"


def _integer_or_bool(e: Any) -> bool:
    ty = getattr(e, "ty", None)
    return ty is not None and hasattr(ty, "dtype") and _dtype_kind(str(ty.dtype)) == "int"


def _op_name(call: Any) -> str:
    return call.op.name if isinstance(call.op, tvm.ir.Op) else ""


def _is_leaf(e: Any) -> bool:
    return expr_shape(e) in ("var", "const", "leaf", "load")


_PURE_OPS: dict[str, bool] = {}


def _pure_call(e: Any) -> bool:
    op = e.op
    if not isinstance(op, tvm.ir.Op):
        return False
    pure = _PURE_OPS.get(op.name)
    if pure is None:
        effect = op.get_attr("TCallEffectKind")
        pure = _PURE_OPS[op.name] = effect is not None and int(effect) in PURE_EFFECTS
    return pure


def _kind(e: Any) -> str:
    return type(e).__name__


# ---------------------------------------------------------------------------


@dataclass
class _Level:
    """One enclosing loop: what moves to just before it."""

    loop: Any
    binds: list[Any] = field(default_factory=list)
    names: dict[Any, Any] = field(default_factory=dict)  # StructuralKey(expr) -> the Var bound to it


class _Motion:
    """One pass over a function body (normalize and hoist in one walk, loop by loop)."""

    def __init__(self, threshold: int, unrolled_extent: int):
        self.threshold = threshold
        self.unrolled_extent = unrolled_extent
        self.ranks: dict[int, int] = {}  # Var.id_ -> rank (loop variables: their depth; names: their value's)
        self.levels: list[_Level] = []
        self.count = 0
        self._ranks_of: dict[int, tuple[Any, int]] = {}  # expression address -> (expression, rank)

    @property
    def depth(self) -> int:
        return len(self.levels)

    # -- ranks ----------------------------------------------------------------------

    def rank(self, e: Any) -> int:
        shape = expr_shape(e)
        if shape == "var":
            return self.ranks.get(e.id_, 0)
        if shape == "const":
            return 0
        if shape in ("load", "leaf") or shape == "call" and not _pure_call(e):
            return VARIES  # a store in the loop may change what a load reads; a Let, a Shuffle stay
        known = self._ranks_of.get(e.id_)
        if known is not None:
            return known[1]
        if type(e).__name__ in ("Div", "Mod", "FloorDiv", "FloorMod") and expr_shape(e.b) != "const":
            rank = VARIES  # a guard in the loop may be what keeps its divisor from 0
        else:
            rank = max((self.rank(c) for c in children(e)), default=0)
        self._ranks_of[e.id_] = (e, rank)  # e kept alive: its address is the key
        return rank

    # -- normalization (Alg. 2) --------------------------------------------------------

    def normalize(self, e: Any) -> Any:
        """Operands first, then this node: conditional collapse, then reassociation by rank."""
        e = rebuild(e, [self.normalize(c) for c in children(e)])
        e = self.collapse(e)
        kind = _kind(e)
        if kind in _ASSOCIATIVE or kind == "Sub":
            e = self.reassociate(e)
        return e

    def collapse(self, e: Any) -> Any:
        """c1 ? (c2 ? a : b) : b -> (c1 && c2) ? a : b; c1 ? a : (c2 ? a : b) -> (c1 || c2) ? a : b."""
        cond, then, other = self._conditional(e)
        if cond is None:
            return e
        inner = self._conditional(then)
        if inner[0] is not None and self.rank(inner[0]) < VARIES and tvm_ffi.structural_equal(inner[2], other):
            return self.collapse(self._make_conditional(e, self.normalize(tirx.And(cond, inner[0])), inner[1], other))
        inner = self._conditional(other)
        if inner[0] is not None and self.rank(inner[0]) < VARIES and tvm_ffi.structural_equal(inner[1], then):
            return self.collapse(self._make_conditional(e, self.normalize(tirx.Or(cond, inner[0])), then, inner[2]))
        return e

    @staticmethod
    def _conditional(e: Any) -> tuple[Any, Any, Any]:
        shape = expr_shape(e)
        if shape == "select":
            return e.condition, e.true_value, e.false_value
        if shape == "call" and _op_name(e).endswith(".if_then_else"):
            return e.args[0], e.args[1], e.args[2]
        return None, None, None

    @staticmethod
    def _make_conditional(like: Any, cond: Any, then: Any, other: Any) -> Any:
        if isinstance(like, tirx.Select):
            return tirx.Select(cond, then, other)
        return tvm.ir.Call(like.op, [cond, then, other], like.attrs, like.ty_args, ret_ty=like.ty)

    def reassociate(self, e: Any) -> Any:
        """Flatten a chain of one associative operator, stable-sort by rank, group equal ranks, rebuild."""
        kind = "Add" if _kind(e) == "Sub" else _kind(e)
        if not _integer_or_bool(e):
            return e  # floating point: reassociation changes rounding
        terms = self._flatten(e, kind, positive=True)
        if len(terms) < 3:
            return e
        ranks = [self.rank(t) for _, t in terms]
        # constants join the lowest-ranked group of names (x + 3 hoisted together, not a group "0 - 57" alone)
        low = min((r for r, (_, t) in zip(ranks, terms) if expr_shape(t) != "const"), default=0)
        ranks = [low if expr_shape(t) == "const" else r for r, (_, t) in zip(ranks, terms)]
        ranked = sorted(((r, i, sign, t) for i, (r, (sign, t)) in enumerate(zip(ranks, terms))),
                        key=lambda r: (r[0], r[1]))
        groups: list[list[tuple[bool, Any]]] = []
        last = None
        for rank, _, sign, t in ranked:
            if rank != last:
                groups.append([])
                last = rank
            groups[-1].append((sign, t))
        out = None
        for group in groups:
            out = self._join(kind, out, group)
        return e if tvm_ffi.structural_equal(out, e) else out

    def _flatten(self, e: Any, kind: str, positive: bool) -> list[tuple[bool, Any]]:
        k = _kind(e)
        if k == kind:
            return self._flatten(e.a, kind, positive) + self._flatten(e.b, kind, positive)
        if kind == "Add" and k == "Sub" and _integer_or_bool(e):
            return self._flatten(e.a, kind, positive) + self._flatten(e.b, kind, not positive)
        return [(positive, e)]

    @staticmethod
    def _join(kind: str, acc: Any, group: list[tuple[bool, Any]]) -> Any:
        """acc op (the group's terms joined), or the group alone when acc is None."""
        op = {"Add": tirx.Add, "Mul": tirx.Mul, "Min": tirx.Min, "Max": tirx.Max, "And": tirx.And, "Or": tirx.Or}[kind]
        plus = [t for sign, t in group if sign]
        minus = [t for sign, t in group if not sign]
        part = None
        for t in plus:
            part = t if part is None else op(part, t)
        if acc is None:
            if part is None:
                part = tirx.const(0, dtype_of(minus[0]))
            for t in minus:
                part = tirx.Sub(part, t)
            return part
        if part is None:  # only subtrahends of this rank: acc - (t1 + t2 ...)
            neg = minus[0]
            for t in minus[1:]:
                neg = tirx.Add(neg, t)
            return tirx.Sub(acc, neg)
        for t in minus:
            part = tirx.Sub(part, t)
        return op(acc, part)

    # -- hoisting (Alg. 1) ------------------------------------------------------------

    def pays(self, e: Any, rank: int) -> bool:
        """cost(e) >= K, and among the loops e leaves, one that LLVM does not unroll."""
        if cost(e) < self.threshold:
            return False
        for level in self.levels[rank:]:
            extent = level.loop.extent
            unrolled = isinstance(extent, tvm.tirx.IntImm) and extent.value <= self.unrolled_extent
            if not unrolled and int(level.loop.kind) != int(tvm.tirx.ForKind.UNROLLED):
                return True
        return False

    def hoist(self, e: Any, depth: int) -> Any:
        """e evaluated at `depth` loops, its invariant parts replaced by names bound further out."""
        rank = self.rank(e)
        if rank < depth and _scalar(e) and not _is_leaf(e) and self.pays_between(e, rank, depth):
            inner = rebuild(e, [self.hoist(c, rank) for c in children(e)])
            return self.bind(inner, rank)
        return rebuild(e, [self.hoist(c, depth) for c in children(e)])

    def pays_between(self, e: Any, rank: int, depth: int) -> bool:
        saved = self.levels
        self.levels = saved[:depth]
        try:
            return self.pays(e, rank)
        finally:
            self.levels = saved

    def bind(self, e: Any, rank: int) -> Any:
        """The name of e, bound just before the loop at depth rank + 1."""
        level = self.levels[rank]
        key = tvm_ffi.StructuralKey(e)
        if key in level.names:
            return level.names[key]
        self.count += 1
        var = tirx.Var(f"licm{self.count}", dtype_of(e))
        self.ranks[var.id_] = rank
        level.binds.append(tirx.Bind(var, e))
        level.names[key] = var
        return var

    def expr(self, e: Any) -> Any:
        if self.depth == 0:
            return e
        return self.hoist(self.normalize(e), self.depth)

    # -- statements --------------------------------------------------------------------

    def stmt(self, s: Any) -> Any:
        if isinstance(s, tirx.SeqStmt):
            return self.seq(s)
        if isinstance(s, tirx.For):
            return self.loop(s)
        if isinstance(s, tirx.Bind):
            return self.let(s)
        if isinstance(s, tirx.IfThenElse):
            return self.branch(s)
        if isinstance(s, tirx.BufferStore):
            indices = [self.expr(i) for i in s.indices]
            value = self.expr(s.value)
            if value.same_as(s.value) and all(a.same_as(b) for a, b in zip(indices, s.indices, strict=True)):
                return s
            return tirx.BufferStore(s.buffer, value, indices)
        if isinstance(s, tirx.Evaluate):
            value = self.expr(s.value)
            return s if value.same_as(s.value) else tirx.Evaluate(value)
        if isinstance(s, tirx.AttrStmt):
            body = self.stmt(s.body)
            return s if body.same_as(s.body) else tirx.AttrStmt(s.node, s.attr_key, s.value, body)
        return s  # While, AssertStmt, buffer declarations: left as they are

    def body(self, s: Any) -> Any:
        """`stmt` for a statement that must stay one (a loop's or a branch's body)."""
        new = self.stmt(s)
        return tirx.Evaluate(0) if new is None else new

    def seq(self, s: Any) -> Any:
        parts: list[Any] = []
        for child in self.if_concat(list(s.seq)):
            new = self.stmt(child)
            if new is None:
                continue
            parts.extend(new.seq if isinstance(new, tirx.SeqStmt) else [new])
        if len(parts) == len(s.seq) and all(a.same_as(b) for a, b in zip(parts, s.seq, strict=True)):
            return s
        return tirx.SeqStmt(parts) if len(parts) != 1 else parts[0]

    def if_concat(self, stmts: list[Any]) -> list[Any]:
        """Adjacent `if`s on one load-free condition become one (inside loops only)."""
        if self.depth == 0:
            return stmts
        out: list[Any] = []
        for s in stmts:
            prev = out[-1] if out else None
            if (isinstance(s, tirx.IfThenElse) and isinstance(prev, tirx.IfThenElse)
                    and self.rank(s.condition) < VARIES and tvm_ffi.structural_equal(s.condition, prev.condition)):
                then = tirx.SeqStmt([prev.then_case, s.then_case])
                other = (None if prev.else_case is None and s.else_case is None else
                         tirx.SeqStmt([c for c in (prev.else_case, s.else_case) if c is not None]))
                out[-1] = tirx.IfThenElse(prev.condition, then, other)
            else:
                out.append(s)
        return out

    def loop(self, s: Any) -> Any:
        self.ranks[s.loop_var.id_] = self.depth + 1
        self.levels.append(_Level(s))
        try:
            body = self.body(s.body)
        finally:
            level = self.levels.pop()
        new = s if body.same_as(s.body) else tirx.For(s.loop_var, s.min, s.extent, s.kind, body, s.thread_binding,
                                                          s.annotations, s.step)
        return tirx.SeqStmt([*level.binds, new]) if level.binds else new

    def let(self, s: Any) -> Any:
        """A name with a single invariant definition moves out with it; others stay, ranked where they are."""
        if self.depth == 0:
            return s
        value = self.normalize(s.value)
        rank = self.rank(value)
        if rank < self.depth and self.pays_between(value, rank, self.depth):
            value = rebuild(value, [self.hoist(c, rank) for c in children(value)])
            self.ranks[s.var.id_] = rank
            self.levels[rank].binds.append(tirx.Bind(s.var, value))
            return None
        value = self.hoist(value, self.depth)
        self.ranks[s.var.id_] = self.depth
        return s if value.same_as(s.value) else tirx.Bind(s.var, value)

    def branch(self, s: Any) -> Any:
        cond, then, other = s.condition, s.then_case, s.else_case
        # if (c1) { if (c2) S } -> if (c1 && c2) S: one condition to normalize and hoist
        while (self.depth > 0 and other is None and isinstance(then, tirx.IfThenElse) and then.else_case is None
               and self.rank(then.condition) < VARIES):
            cond, then = tirx.And(cond, then.condition), then.then_case
        new_cond = self.expr(cond)
        new_then = self.body(then)
        new_other = None if other is None else self.body(other)
        if (new_cond.same_as(s.condition) and new_then.same_as(s.then_case)
                and (other is None or new_other.same_as(s.else_case))):
            return s
        return tirx.IfThenElse(new_cond, new_then, new_other)
