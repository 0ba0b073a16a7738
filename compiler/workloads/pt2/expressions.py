"""Strings of a .pt2 program that torch evaluates: symbolic expressions (`sympy.sympify` evals them), guards
(`exec`), operator names (`getattr` chains on torch) and pytree specs (they import by name). Each is parsed
with `ast`, never evaluated, and refused unless it is of the plain form torch itself writes.

Layering: imports nothing from `compiler` but its own package; torch is imported inside the functions that
load or inspect a program (see the comment at each).
"""

from __future__ import annotations

import ast
import keyword
import math
import re
from typing import TYPE_CHECKING, Any

from .rules import (
    ATEN,
    DENIED_OPS,
    GUARD_KEY,
    IDENT,
    MAX_EXPRESSION_CHARS,
    MAX_INT,
    MAX_NAME,
    QUANTIZED_OPS,
    SYMBOL,
    TREESPEC_TYPES,
    check_namedtuple_name,
    parse_json,
    refusal,
    short_error,
)

if TYPE_CHECKING:
    pass


# sympy's srepr of torch's shape expressions; with them, sympify's eval can only build sympy numbers
_SYMPY_CALLS = frozenset({
    "Symbol", "Integer", "Float", "Rational", "Add", "Mul", "Pow", "Max", "Min", "Abs",
    "Eq", "Ne", "LessThan", "StrictLessThan", "GreaterThan", "StrictGreaterThan", "And", "Or", "Not",
    # torch.utils._sympy.functions, as `GraphModuleDeserializer` names them
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
    "ToFloat", "Identity",
})


_BOUNDED_SECOND = frozenset({"Pow", "PowByNatural", "FloatPow", "LShift"})  # exponent or shift: a literal <= 64


_SYMPY_NAMES = frozenset({"true", "false", "oo"})


_ASSUMPTIONS = frozenset({"integer", "positive", "nonnegative", "negative", "nonpositive", "real", "finite",
                          "nonzero", "zero", "commutative", "rational", "even", "odd"})


_FLOAT_TEXT = re.compile(r"-?\d{1,40}(\.\d{0,40})?(e[-+]?\d{1,4})?", re.ASCII)


_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _parse(text: Any, at: str, what: str) -> ast.expr:
    if not isinstance(text, str) or len(text) > MAX_EXPRESSION_CHARS or not text.isascii() or not text.isprintable():
        raise refusal(at, f"{what} {short_error(repr(text), 120)} is not short printable ASCII")
    try:
        return ast.parse(text, mode="eval").body  # parsing runs nothing
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise refusal(at, f"{what} {short_error(repr(text), 120)} does not parse") from e


def check_sym_expr(text: Any, at: str = "expr_str") -> None:
    """Refuses a symbolic expression (`expr_str`) that is more than shape arithmetic (what sympify may eval).

    Raises:
        ModelError: field "file", naming the expression.
    """
    what = "symbolic expression (expr_str)"
    bad = _sym_expr_error(_parse(text, at, what))
    if bad:
        raise refusal(at, f"{what} {short_error(repr(text), 120)} is not plain arithmetic on shape symbols ({bad})")


def _literal_int(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _literal_int(node.operand)
        return None if value is None else -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Integer" and (
            len(node.args) == 1 and not node.keywords):
        return _literal_int(node.args[0])
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _sym_expr_error(node: ast.expr) -> str | None:
    """What in the expression is not allowed, or None."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Constant):
            if type(n.value) is int and abs(n.value) <= MAX_INT:
                continue
            if type(n.value) is float and math.isfinite(n.value):
                continue
            return f"literal {short_error(repr(n.value), 40)}"
        if isinstance(n, ast.Name):
            if not (SYMBOL.fullmatch(n.id) or n.id in _SYMPY_NAMES):
                return f"name {n.id!r}"
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub | ast.UAdd):
            stack.append(n.operand)
        elif isinstance(n, ast.BinOp) and isinstance(n.op, _ARITHMETIC):
            if isinstance(n.op, ast.Pow) and not (_literal_int(n.right) is not None and
                                                  abs(_literal_int(n.right)) <= 64):
                return "a power whose exponent is not a literal up to 64"
            stack += [n.left, n.right]
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _SYMPY_CALLS:
            name = n.func.id
            if name == "Symbol":
                if len(n.args) != 1 or not (isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
                                            and SYMBOL.fullmatch(n.args[0].value)):
                    return "a Symbol that is not named like s0 or u1"
                if any(k.arg not in _ASSUMPTIONS or not (isinstance(k.value, ast.Constant)
                                                         and type(k.value.value) is bool) for k in n.keywords):
                    return "a Symbol assumption other than integer=True, positive=True, ..."
                continue
            if name == "Float":
                text = n.args[0].value if n.args and isinstance(n.args[0], ast.Constant) else None
                if len(n.args) != 1 or not (type(text) in (int, float) or
                                            (isinstance(text, str) and _FLOAT_TEXT.fullmatch(text))) or any(
                        k.arg != "precision" or _literal_int(k.value) is None for k in n.keywords):
                    return "a Float that is not a number literal"
                continue
            if n.keywords:
                return f"keyword arguments to {name}"
            if name in _BOUNDED_SECOND and not (len(n.args) == 2 and _literal_int(n.args[1]) is not None
                                                and abs(_literal_int(n.args[1])) <= 64):
                return f"{name} whose second argument is not a literal up to 64"
            stack += n.args
        else:
            what = f"call of {ast.unparse(n.func)!r}" if isinstance(n, ast.Call) else type(n).__name__
            return short_error(what, 80)
    return None


def check_guard(text: Any, at: str = "guards_code") -> None:
    """Refuses a `guards_code` entry that is more than a comparison of input sizes (torch `exec`s them).

    Accepted: `L['x'].size()[0] <= 4*L['y'].size()[1] + 2`, `.stride()[i]`, `.storage_offset()`,
    integers, + - * / // % (and ** by a literal), comparisons, and/or/not.

    Raises:
        ModelError: field "file", naming the entry.
    """
    what = "guards_code entry"
    bad = _guard_error(_parse(text, at, what))
    if bad:
        raise refusal(at, f"{what} {short_error(repr(text), 120)} is not a shape guard ({bad})")


def _is_input(node: ast.expr) -> bool:
    """`L['x']`, `L['x'][0]`, `L['kw']['y']`: an input by its path (identifier keys, integer indices)."""
    while isinstance(node, ast.Subscript):
        key = node.slice
        if not isinstance(key, ast.Constant) or not (
                (isinstance(key.value, str) and GUARD_KEY.fullmatch(key.value))
                or (type(key.value) is int and 0 <= key.value < 1 << 16)):
            return False
        if isinstance(node.value, ast.Name):
            return node.value.id == "L" and isinstance(key.value, str)
        node = node.value
    return False


def _is_size(node: ast.expr) -> bool:
    """`<input>.size()[i]`, `<input>.stride()[i]` or `<input>.storage_offset()`."""
    if isinstance(node, ast.Subscript):
        call, index = node.value, node.slice
        if not (isinstance(index, ast.Constant) and type(index.value) is int and 0 <= index.value < 64):
            return False
        methods = ("size", "stride")
    else:
        call, methods = node, ("storage_offset",)
    return (isinstance(call, ast.Call) and not call.args and not call.keywords
            and isinstance(call.func, ast.Attribute) and call.func.attr in methods and _is_input(call.func.value))


def _guard_error(node: ast.expr) -> str | None:
    stack = [node]
    while stack:
        n = stack.pop()
        if _is_size(n):
            continue
        if isinstance(n, ast.Constant):
            if type(n.value) in (int, bool) and abs(n.value) <= MAX_INT:
                continue
            return f"literal {short_error(repr(n.value), 40)}"
        if isinstance(n, ast.BoolOp):
            stack += n.values
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not | ast.USub | ast.UAdd):
            stack.append(n.operand)
        elif isinstance(n, ast.Compare) and all(isinstance(op, _COMPARISONS) for op in n.ops):
            stack += [n.left, *n.comparators]
        elif isinstance(n, ast.BinOp) and isinstance(n.op, _ARITHMETIC):
            if isinstance(n.op, ast.Pow) and not (isinstance(n.right, ast.Constant) and type(n.right.value) is int
                                                  and abs(n.right.value) <= 64):
                return "a power whose exponent is not a literal up to 64"
            stack += [n.left, n.right]
        else:
            return short_error(f"{type(n).__name__} {ast.unparse(n)!r}", 100)
    return None


def _sym_op_names() -> frozenset[str]:
    """How torch writes its symbolic-int operators (`_operator.add`, `torch.sym_max`, `math.trunc`)."""
    # heavy: torch only after the archive is checked (the API loads pt2 without it)
    from torch._export.serde.serialize import _SYM_OPS

    return frozenset(f"{op.__module__}.{op.__name__}" for op in _SYM_OPS)


def check_target(target: Any, at: str = "target") -> None:
    """Refuses a node target that is not an `aten` operator or one of torch's symbolic-int operators.

    torch resolves the name with `getattr` on `torch`, `operator` or `math`, so any callable they reach
    (`torch.os.system`) would otherwise become a node of the graph, called when it is traced again.

    Raises:
        ModelError: field "file", naming the target.
    """
    if isinstance(target, str) and ATEN.fullmatch(target):
        if target.split(".")[3] in DENIED_OPS:
            raise refusal(at, f"operator {target!r} reads outside its tensors")
        return
    if isinstance(target, str) and (target in _sym_op_names() or target in QUANTIZED_OPS):
        return
    if isinstance(target, str) and target.startswith("torch.ops.higher_order."):
        raise refusal(at, f"higher-order operator {short_error(target, 80)!r} is not supported")
    raise refusal(at, f"node target {short_error(repr(target), 120)} is not an aten operator "
                      "(targets are resolved by name; only torch.ops.aten.<op>.<overload> and the "
                      "quantized_decomposed (de)quantization operators are accepted)")


def check_treespec(text: Any, at: str = "in_spec", *, inputs: bool = False) -> None:
    """Refuses a pytree spec with a node type or a context outside the allowlist.

    torch's `treespec_loads` imports modules by name for enums in a context (`enum_object_hook`) and for
    `defaultdict` factories; FX pastes the keys of the keyword-argument dict of an input spec into the source of
    `ep.module()` (`'{key}':{arg}` in `_PyTreeCodeGen.gen_var_bindings`, and as `forward`'s parameter names
    when the program names none). Accepted, per node: a leaf (no type, context or children); a tuple or list
    (context `null`); a dict or OrderedDict (context: a list of one key per child, each a string of printable
    characters up to 1024, an integer, a finite float, a bool or null: torch uses them as data only); a
    namedtuple (context: its registered type name, printable). In an input spec `(args, kwargs)` the
    kwargs dict's keys must be Python names that are not keywords: they are the only keys written into source.

    Args:
        text: the spec as serialized (`[1, {type, context, children_spec}]`).
        at: where it is, for the message.
        inputs: an input spec (`in_spec`): its keyword-argument keys must be Python names.

    Raises:
        ModelError: field "file", naming the type or the key.
    """
    if not isinstance(text, str) or len(text) > 1 << 20:
        raise refusal(at, "a pytree spec that is not a string or too long")
    spec = parse_json(text.encode(), at)
    if not (isinstance(spec, list) and len(spec) == 2 and spec[0] == 1):
        raise refusal(at, "a pytree spec that is not [1, {...}] (protocol 1)")
    if inputs:
        _check_kwargs_keys(spec[1], at)
    stack = [(spec[1], 0)]
    while stack:
        node, depth = stack.pop()
        if depth > 64 or not isinstance(node, dict) or set(node) != {"type", "context", "children_spec"} or (
                not isinstance(node["children_spec"], list)):
            raise refusal(at, "a pytree spec node that is not {type, context, children_spec} (or too deep)")
        typ, context, children = node["type"], node["context"], node["children_spec"]
        if typ is None:
            if context is not None or children:
                raise refusal(at, "a pytree leaf with a context or children")
            continue
        if typ not in TREESPEC_TYPES:
            raise refusal(at, f"pytree type {short_error(repr(typ), 80)} (only tuple, list, dict, OrderedDict and "
                              "namedtuple; others import modules by name)")
        if not isinstance(context, str):
            raise refusal(at, f"a {typ} context that is not a string")
        if typ == "collections.namedtuple":
            check_namedtuple_name(context, at)
        elif typ in ("builtins.tuple", "builtins.list"):
            if parse_json(context.encode(), at) is not None:
                raise refusal(at, f"a {typ} context that is not null")
        else:
            keys = parse_json(context.encode(), at)
            for key in keys if isinstance(keys, list) else [keys]:
                _check_dict_key(key, at)
            if not isinstance(keys, list) or len(keys) != len(children):
                raise refusal(at, f"a {typ} context that is not a list of one key per child")
        stack.extend((child, depth + 1) for child in children)


def _check_kwargs_keys(root: Any, at: str) -> None:
    """The keys of the kwargs dict of an input spec `(args, kwargs)` (the shape `gen_var_bindings` pastes)."""
    children = root.get("children_spec") if isinstance(root, dict) else None
    if not (root.get("type") == "builtins.tuple" and isinstance(children, list) and len(children) == 2
            and all(isinstance(c, dict) for c in children)
            and [c.get("type") for c in children] == ["builtins.tuple", "builtins.dict"]):
        return
    keys = parse_json(children[1]["context"].encode(), at) if isinstance(children[1].get("context"), str) else None
    for key in keys if isinstance(keys, list) else []:
        if not isinstance(key, str) or not IDENT.fullmatch(key) or keyword.iskeyword(key):
            raise refusal(at, f"keyword argument {short_error(repr(key), 120)} is not a Python identifier "
                              "(FX writes the keyword arguments' names into Python source)")


def _check_dict_key(key: Any, at: str) -> None:
    if isinstance(key, str):
        if len(key) > MAX_NAME or not key.isprintable():
            raise refusal(at, f"dict key {short_error(repr(key), 120)} is longer than {MAX_NAME} characters or "
                              "not printable")
    elif isinstance(key, dict | list):
        raise refusal(at, "a pytree context that holds a JSON object or list (torch would import an enum by name)")
    elif not (key is None or isinstance(key, bool) or (isinstance(key, int) and abs(key) <= MAX_INT)
              or (isinstance(key, float) and math.isfinite(key))):
        raise refusal(at, f"dict key {short_error(repr(key), 60)} is not a string, number, bool or null")
