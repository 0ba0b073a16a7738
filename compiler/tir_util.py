"""Small helpers over TVM 0.27's TIR that its Python API does not expose, written once for every pass: the
identity of a node (`key`), the operands of an expression and rebuilding it from new ones (`expr_shape`,
`children`, `rebuild`), the rewriter built on them (`rewrite`), substitution of variables in expressions and
statements (`subst`, `subst_stmt`, and `substitute` for TE expressions with their tensor loads), a statement
walk, constant extents, and the linear coefficient of a variable in an index.

Layering: the bottom of `compiler` (imports only TVM); `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import tvm
from tvm import tirx
from tvm.ir import expr as ir_expr
from tvm.ir.prim import expr as prim


class UnsupportedExpr(TypeError):
    """An expression node the rewriters do not know how to rebuild (or, for `substitute`, a nested reduction)."""


def key(node: Any) -> int:
    """Identity of a TVM object (te ops, vars): Python wrappers differ, handles do not."""
    return node.__chandle__()


def subst(e: Any, vmap: dict[int, Any]) -> Any:
    """`e` with every variable whose handle is in `vmap` replaced (the same object where nothing changed)."""
    if not vmap:
        return e
    return rewrite(e, lambda x: vmap.get(key(x), x) if isinstance(x, ir_expr.Var) else None)


_SHAPES: dict[type, str] = {}  # expression class -> how its operands are held (found once per class)


def expr_shape(e: Any) -> str:
    """How expression `e` holds its operands: "var", "const", "binary" (a, b), "unary" (a), "select", "cast", "ramp", "broadcast", "call", "load" or "leaf"."""
    cls = type(e)
    shape = _SHAPES.get(cls)
    if shape is None:
        shape = ("var" if issubclass(cls, tvm.ir.Var) else
                 "const" if issubclass(cls, (tirx.IntImm, tirx.FloatImm)) else
                 "binary" if issubclass(cls, (prim.BinaryOpExpr, prim.CmpExpr, tirx.And, tirx.Or)) else
                 "unary" if issubclass(cls, (tirx.Not, tirx.BitwiseNot)) else
                 "select" if issubclass(cls, tirx.Select) else
                 "cast" if issubclass(cls, tirx.Cast) else
                 "ramp" if issubclass(cls, tirx.Ramp) else
                 "broadcast" if issubclass(cls, tirx.Broadcast) else
                 "call" if issubclass(cls, tvm.ir.Call) else
                 "load" if issubclass(cls, tvm.ir.TensorLoad) else "leaf")
        _SHAPES[cls] = shape
    return shape


def children(e: Any) -> list[Any]:
    """The operands of expression `e`, by its `expr_shape` (none for a name, a constant or a leaf)."""
    shape = expr_shape(e)
    if shape == "binary":
        return [e.a, e.b]
    if shape in ("var", "const", "leaf"):
        return []
    if shape in ("unary",):
        return [e.a]
    if shape in ("cast", "broadcast"):
        return [e.value]
    if shape == "select":
        return [e.condition, e.true_value, e.false_value]
    if shape == "ramp":
        return [e.base, e.stride]
    return list(e.args if shape == "call" else e.indices)


def rebuild(e: Any, operands: list[Any]) -> Any:
    """`e` with new operands, in the order `children` gives them (the same object where none changed)."""
    old = children(e)
    if all(a.same_as(b) for a, b in zip(old, operands, strict=True)):
        return e

    shape = expr_shape(e)
    if shape == "binary":
        return type(e)(*operands)
    if shape == "unary":
        return type(e)(operands[0])
    if shape == "select":
        return tirx.Select(*operands)
    if shape == "cast":
        return tirx.Cast(dtype_of(e), operands[0])
    if shape == "ramp":
        return tirx.Ramp(operands[0], operands[1], e.lanes)
    if shape == "broadcast":
        return tirx.Broadcast(operands[0], e.lanes)
    if shape == "call":
        return tvm.ir.Call(e.op, operands, e.attrs, e.ty_args, ret_ty=e.ty)
    assert shape == "load", f"cannot rebuild a {type(e).__name__}"
    return tirx.BufferLoad(e.source, operands)


def dtype_of(e: Any) -> str:
    """The element type of expression `e` ("float32", "int32x16" for a vector)."""
    return str(e.ty.dtype) if hasattr(e.ty, "dtype") else str(e.ty)


def rewrite(e: Any, fn: Callable[[Any], Any | None]) -> Any:
    """`e` rebuilt with `fn(x)` in place of each sub-expression `x` where it is not None (pre-order: what `fn`
    returns is not visited again); the same object where nothing changed.

    Raises:
        UnsupportedExpr: for a node it cannot rebuild (not an operand shape of `expr_shape`, a `Let`, a
            string or a shuffle).
    """

    def go(x: Any) -> Any:
        done = fn(x)
        if done is not None:
            return done
        shape = expr_shape(x)
        if shape in ("var", "const"):
            return x
        if shape != "leaf":
            return rebuild(x, [go(c) for c in children(x)])
        if isinstance(x, prim.Let):
            v, body = go(x.value), go(x.body)
            return x if v.same_as(x.value) and body.same_as(x.body) else prim.Let(x.var, v, body)
        if not isinstance(x, tvm.ir.Expr) or type(x).__name__ in ("StringImm", "Shuffle"):
            return x  # no loop variable in a string; a shuffle only appears after our rewrites
        raise UnsupportedExpr(f"cannot rewrite in a {type(x).__name__}: {x}")

    return go(e)


def substitute(expr: Any, vmap: dict[int, Any], load: Callable[[Any, list, list], Any] | None = None) -> Any:
    """Rebuilds a TE expression with variables replaced (`vmap`: var handle -> expr).

    `load(tensor, new_indices, old_indices)` replaces every `te.tensor_load`; by default the load is kept on
    the same tensor with substituted indices.

    Raises:
        UnsupportedExpr: for a reduction inside the expression, or a node `rewrite` does not know.
    """

    def fn(e: Any) -> Any | None:
        if isinstance(e, ir_expr.Var):
            return vmap.get(key(e), e)
        if isinstance(e, ir_expr.Call) and getattr(e.op, "name", "") == "te.tensor_load":
            tensor, old = e.args[0], list(e.args[1:])
            new = [rewrite(i, fn) for i in old]
            return load(tensor, new, old) if load is not None else tensor(*new)
        if isinstance(e, tirx.Reduce):
            raise UnsupportedExpr("nested reductions are not supported")
        return None

    return rewrite(expr, fn)


def subst_stmt(s: Any, vmap: dict[int, Any]) -> Any:
    """`s` with every variable whose handle is in `vmap` replaced in every expression it holds."""
    return map_stmt(s, lambda e: subst(e, vmap))


def map_stmt(s: Any, fexpr: Callable[[Any], Any], fstmt: Callable[[Any], Any | None] | None = None) -> Any:
    """Rebuilds `s` bottom-up with `fexpr` applied to the expressions of each node; `fstmt(node)`, where given,
    may replace a node before its children are visited (return None to go on)."""

    def go(x: Any) -> Any:
        if fstmt is not None:
            done = fstmt(x)
            if done is not None:
                return done
        if isinstance(x, tirx.SeqStmt):
            return tirx.SeqStmt([go(c) for c in x.seq])
        if isinstance(x, tirx.For):
            return tirx.For(x.loop_var, fexpr(x.min), fexpr(x.extent), x.kind, go(x.body), x.thread_binding,
                            x.annotations, x.step)
        if isinstance(x, tirx.IfThenElse):
            return tirx.IfThenElse(fexpr(x.condition), go(x.then_case),
                                   None if x.else_case is None else go(x.else_case))
        if isinstance(x, tirx.AttrStmt):
            return tirx.AttrStmt(x.node, x.attr_key, fexpr(x.value), go(x.body))
        if isinstance(x, tirx.BufferStore):
            return tirx.BufferStore(x.buffer, fexpr(x.value), [fexpr(i) for i in x.indices])
        if isinstance(x, tirx.Evaluate):
            return tirx.Evaluate(fexpr(x.value))
        if isinstance(x, tirx.Bind):
            return tirx.Bind(x.var, fexpr(x.value))
        if isinstance(x, tirx.While):
            return tirx.While(fexpr(x.condition), go(x.body))
        return x  # AllocBuffer, DeclBuffer, ...: nothing of a loop variable in them

    return go(s)


def walk(s: Any) -> Iterator[Any]:
    """Every statement of `s`, pre-order."""
    yield s
    if isinstance(s, tirx.SeqStmt):
        for c in s.seq:
            yield from walk(c)
    elif isinstance(s, tirx.For | tirx.AttrStmt | tirx.While):
        yield from walk(s.body)
    elif isinstance(s, tirx.IfThenElse):
        yield from walk(s.then_case)
        if s.else_case is not None:
            yield from walk(s.else_case)


def exprs(s: Any) -> Iterator[Any]:
    """The top-level expressions of the statements of `s` (store values and indices, conditions, bounds)."""
    for x in walk(s):
        if isinstance(x, tirx.BufferStore):
            yield x.value
            yield from x.indices
        elif isinstance(x, tirx.IfThenElse):
            yield x.condition
        elif isinstance(x, tirx.For):
            yield x.min
            yield x.extent
        elif isinstance(x, tirx.Evaluate | tirx.Bind):
            yield x.value


def is_if_then_else(e: Any) -> bool:
    """Whether `e` is a call of `if_then_else(cond, then, else)` (a conditional expression: padding)."""
    return isinstance(e, ir_expr.Call) and str(getattr(e.op, "name", "")).endswith(".if_then_else")


def conditionals(e: Any) -> list[Any]:
    """The `if_then_else` calls in expression `e`, outermost first."""
    found: list[Any] = []

    def fn(x: Any) -> None:
        if is_if_then_else(x):
            found.append(x)

    rewrite(e, fn)
    return found


def uses(e: Any, var: Any) -> bool:
    """Whether expression `e` mentions `var`."""
    probe = tirx.Var("probe", str(var.ty.dtype))
    return not subst(e, {key(var): probe}).same_as(e)


def is_noop(s: Any) -> bool:
    """Whether `s` does nothing (an empty sequence, `Evaluate(0)`, a loop or branch of nothing)."""
    if isinstance(s, tirx.SeqStmt):
        return all(is_noop(c) for c in s.seq)
    if isinstance(s, tirx.Evaluate):
        return isinstance(s.value, prim.IntImm)
    if isinstance(s, tirx.For):
        return is_noop(s.body)
    if isinstance(s, tirx.IfThenElse):
        return is_noop(s.then_case) and (s.else_case is None or is_noop(s.else_case))
    return False


def noop() -> Any:

    return tirx.Evaluate(0)


def seq(stmts: list[Any]) -> Any:
    """One statement of `stmts` (no-ops dropped; a single statement as it is)."""
    flat: list[Any] = []
    for s in stmts:
        if is_noop(s):
            continue
        flat.extend(s.seq if isinstance(s, tirx.SeqStmt) else [s])
    if not flat:
        return noop()
    return flat[0] if len(flat) == 1 else tirx.SeqStmt(flat)


def const_int(e: Any) -> int | None:
    """The value of an integer constant, else None."""
    return int(e.value) if isinstance(e, prim.IntImm) else None


def const_extent(node: Any) -> int | None:
    """The constant extent of a loop (`tirx.For`) or an iteration variable's domain (`IterVar`), else None."""
    return const_int(node.dom.extent if hasattr(node, "dom") else node.extent)


def coefficient(analyzer: Any, e: Any, var: Any) -> int | None:
    """The constant `c` with `e(var + 1) - e(var) == c` for every `var` (None where it is not a constant):
    the stride of an affine index in `var`."""
    step = analyzer.simplify(subst(e, {key(var): var + tirx.const(1, str(var.ty.dtype))}) - e)
    return const_int(step)


def flat_offset(buffer: Any, indices: list[Any]) -> Any:
    """The row-major element offset of `buffer[indices]` (a buffer without strides)."""
    offset = indices[0]
    for extent, index in zip(list(buffer.shape)[1:], indices[1:]):
        offset = offset * extent + index
    return offset


def var_names(e: Any) -> set[str]:
    """The names of the variables in expression `e`."""
    names: set[str] = set()

    def fn(x: Any) -> None:
        if isinstance(x, ir_expr.Var):
            names.add(x.name)
        return None

    rewrite(e, fn)
    return names


def loop_feeds(sch: Any, block: Any, loops: Any) -> list[set[str]]:
    """The block variables each of `loops` (loop random variables of schedule `sch`) feeds through `block`'s
    bindings (a loop `compute_at` made binds what its region needs)."""
    realize = sch.get(sch.get_loops(block)[-1]).body
    while not hasattr(realize, "iter_values"):  # a loop body of several statements: the block's own
        realize = next(s for s in realize.seq if hasattr(s, "iter_values") and s.block.same_as(sch.get(block)))
    used_by: dict[str, set[str]] = {}
    for iv, value in zip(realize.block.iter_vars, realize.iter_values):
        for name in var_names(value):
            used_by.setdefault(name, set()).add(iv.var.name)
    return [used_by.get(sch.get(loop).loop_var.name, set()) for loop in loops]
