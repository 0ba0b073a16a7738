"""The program's JSON (`models/model.json` of a .pt2): every string checked by its class, field by field
(`check_program`), the evaluated ones by `compiler.workloads.pt2.expressions`.

Layering: imports nothing from `compiler` but its own package; torch is imported inside the functions that
load or inspect a program (see the comment at each).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .expressions import check_guard, check_sym_expr, check_target, check_treespec
from .rules import (
    DOTTED,
    FLOAT_WORDS,
    MAX_INT,
    MODEL_JSON,
    VERIFIERS,
    check_fqn,
    check_ident,
    check_namedtuple_name,
    check_python_names,
    json_path,
    parse_json,
    refusal,
    short_error,
)

if TYPE_CHECKING:
    pass


# dicts of the schema whose keys are data, with the class of their keys (all other keys are field names)
_KEYED = {
    "tensor_values": "name", "sym_int_values": "name", "sym_bool_values": "name", "sym_float_values": "name",
    "opset_version": "name", "as_string_to_argument": "name",
}


def check_program(model: Any, where: str = MODEL_JSON) -> None:
    """Refuses a `models/<name>.json` with a string outside its class (module docstring: which string is what).

    Schema field names and every string not listed are Python names; attribute paths, floats, string
    arguments, metadata, expressions, guards, targets and pytree specs have their own rules (`_FIELDS`).

    Raises:
        ModelError: field "file", naming the string and where it is.
    """
    if not isinstance(model, dict) or not isinstance(model.get("graph_module"), dict):
        raise refusal(where, "not an exported program")
    stack: list[tuple[Any, tuple]] = [(model, ())]
    while stack:
        value, path = stack.pop()
        at = f"{where} at {json_path(path)}"
        parent = path[-1] if path else None
        if isinstance(value, dict):
            for key, item in value.items():
                if parent == "range_constraints":
                    check_sym_expr(key, at)
                    _check_range(item, f"{where} at {json_path((*path, key))}")
                    continue
                check_ident(key, at, "a name" if parent in _KEYED else "a field name")
                handler = _FIELDS.get(key) if parent not in _KEYED else None
                if handler is not None:
                    handler(item, f"{where} at {json_path((*path, key))}")
                else:
                    stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))
        elif isinstance(value, str):
            check_ident(value, at)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise refusal(at, f"an integer of {len(str(value))} digits")


def _check_floats(value: Any, at: str) -> None:
    """`as_float(s)`, `as_float_lists`, `real`, `imag`: numbers, or how torch writes inf, -inf and nan."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif not (type(v) in (int, float) or (isinstance(v, str) and v in FLOAT_WORDS)):
            raise refusal(at, f"float {short_error(repr(v), 60)} is not a number, 'Infinity', '-Infinity' or 'NaN'")


def _check_range(value: Any, at: str) -> None:
    if not isinstance(value, dict) or set(value) - {"min_val", "max_val"}:
        raise refusal(at, "a range that is not {min_val, max_val}")
    for bound in value.values():
        if bound is not None and (type(bound) is not int or abs(bound) > MAX_INT):
            raise refusal(at, f"range bound {short_error(repr(bound), 60)} is not a 64-bit integer")


def _check_text(value: Any, at: str, limit: int = 1 << 20) -> None:
    if not isinstance(value, str) or len(value) > limit or "\r" in value or "\0" in value:
        raise refusal(at, "text with a carriage return or NUL, or too long (text can become Python source)")


def _check_strings(value: Any, at: str) -> None:
    """`as_string(s)` arguments: torch passes them on as values (FX writes them with repr)."""
    for s in value if isinstance(value, list) else [value]:
        if not isinstance(s, str) or len(s) > 1 << 16:
            raise refusal(at, "a string argument that is not a string or too long")


def _check_guards(value: Any, at: str) -> None:
    if not isinstance(value, list):
        raise refusal(at, "guards_code is not a list")
    for i, guard in enumerate(value):
        check_guard(guard, f"{at}[{i}]")


def _check_metadata(value: Any, at: str) -> None:
    if not isinstance(value, dict):
        raise refusal(at, "metadata is not a mapping")
    for key, text in value.items():
        check_ident(key, at, "a metadata key")
        _check_text(text, f"{at}.{key}")
        if key in ("custom", "from_node"):
            parse_json(text.encode(), f"{at}.{key}")
        elif key == "source_fn_stack":  # "name,target;...": the targets are resolved with getattr on torch
            for item in text.split(";"):
                name, _, target = item.partition(",")
                check_ident(name, f"{at}.{key}")
                if not DOTTED.fullmatch(target):
                    raise refusal(f"{at}.{key}", f"{short_error(repr(target), 80)} is not a dotted name")


def _check_namedtuple_fields(value: Any, at: str) -> None:
    """`treespec_namedtuple_fields`: {type name: {field_names: [...]}}, kept as metadata."""
    if not isinstance(value, dict):
        raise refusal(at, "treespec_namedtuple_fields is not a mapping")
    for name, fields in value.items():
        check_namedtuple_name(name, at)
        if not isinstance(fields, dict) or set(fields) != {"field_names"} or not isinstance(
                fields["field_names"], list):
            raise refusal(f"{at}.{name}", "not {field_names: [...]}")
        check_python_names(fields["field_names"], f"{at}.{name}", "a namedtuple field")


def _check_device(value: Any, at: str) -> None:
    if not isinstance(value, dict) or value.get("type") not in ("cpu", "cuda", "meta") or not (
            value.get("index") is None or type(value.get("index")) is int):
        raise refusal(at, f"device {short_error(repr(value), 80)} is not cpu, cuda or meta")


def _refuse_field(what: str) -> Any:
    def handler(_value: Any, at: str) -> None:
        raise refusal(at, what)

    return handler


def _check_custom_obj_values(value: Any, at: str) -> None:
    if value:
        raise refusal(at, "the program holds custom objects (torchbind or opaque classes, loaded by name)")


def _check_verifiers(value: Any, at: str) -> None:
    if not isinstance(value, list) or any(v not in VERIFIERS for v in value):
        raise refusal(at, f"verifiers {short_error(repr(value), 80)}: only ATEN and TRAINING programs are accepted")


_FIELDS = {
    "expr_str": lambda v, at: check_sym_expr(v, at),
    "guards_code": _check_guards,
    "target": lambda v, at: check_target(v, at),
    "as_operator": lambda v, at: check_target(v, at),
    "in_spec": lambda v, at: check_treespec(v, at, inputs=True),
    "out_spec": lambda v, at: check_treespec(v, at),
    "forward_arg_names": lambda v, at: check_python_names(v or [], at, "an argument name"),
    "parameter_name": check_fqn,
    "buffer_name": check_fqn,
    "tensor_constant_name": check_fqn,
    "fqn": lambda v, at: check_fqn(v, at, root=True),
    "as_float": _check_floats,
    "as_floats": _check_floats,
    "as_float_lists": _check_floats,
    "real": _check_floats,
    "imag": _check_floats,
    "metadata": _check_metadata,
    "treespec_namedtuple_fields": _check_namedtuple_fields,
    "as_string": _check_strings,
    "as_strings": _check_strings,
    "device": _check_device,
    "torch_version": lambda v, at: _check_text(v, at, 64),
    "verifiers": _check_verifiers,
    "custom_obj_values": _check_custom_obj_values,
    "as_custom_obj": _refuse_field("a custom object argument (torchbind or opaque classes, loaded by name)"),
    "custom_obj": _refuse_field("a custom object input (torchbind or opaque classes, loaded by name)"),
    "as_graph": _refuse_field("a subgraph argument (higher-order operators are not supported)"),
}
