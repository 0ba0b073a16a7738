"""Loading an uploaded `torch.export` file (.pt2) without evaluating anything from it.

    ep = load_exported_program(path_bytes_or_file, max_bytes=..., max_unpacked_bytes=..., max_ratio=...)

`torch.export.load` trusts its file. This loader is a second line behind the confined child process it runs in
(docs/DESIGN.md, "Untrusted input"): every string of `models/model.json` belongs to a class, each class is an
allowlist of what is safe by construction where torch puts it, and anything else is refused, naming the string
and where it is. Reading torch 2.13's loader (`torch/export/pt2_archive/_package.py`,
`torch/_export/serde/serialize.py`, `torch/utils/_pytree.py`, `torch/export/_unlift.py`, `torch/fx/graph.py`),
the strings go to these places:

- Python names (an ASCII identifier not starting with "__"): node names (the deserializer sets `node.name`
  unsanitized; FX writes each as a variable), tensor and symbol names (`as_tensor.name`, `as_name`, the keys of
  `tensor_values` and `sym_*_values`), placeholder targets (written raw into `forward`), operator argument names,
  metadata keys, schema field names, and every string not listed below. Argument names
  (`forward_arg_names`: `def forward(self, <names>)`) and namedtuple field names must not be keywords either.
- Attribute paths (`parameter_name`, `buffer_name`, `tensor_constant_name`, module `fqn`s, the keys of the
  weights and constants configs): `_assign_attr` gives each dot-separated part to `setattr`, and FX writes a
  part that is not an identifier as `getattr(m, "part")` (`_format_target`). Each part is printable ASCII
  without quotes, backslashes or braces and does not start with "__": regnet's `block4-11` is accepted, a part
  that could close the literal is not. Module paths elsewhere (`nn_module_stack`) are metadata text.
- pytree specs (`in_spec`, `out_spec`; `treespec_loads`): only leaf, tuple, list, dict, OrderedDict and
  namedtuple nodes (enum contexts and `defaultdict` factories import modules by name). Tuple and list contexts
  are `null`; dict and OrderedDict contexts a list of one key per child, each a printable string, a number, a
  bool or null: data only (`tree_flatten_spec`, `tree_unflatten`), except the keys of the keyword-argument dict
  of an input spec `(args, kwargs)`, which FX pastes into the source of `ep.module()` (`'{key}':{arg}` in
  `_PyTreeCodeGen.gen_var_bindings`, and as parameter names in `_get_codegen`): those must be Python names and
  not keywords. A namedtuple context is its registered type name (printable); torch looks it up among the
  types registered in the loading process, so the loader renames it to a stand-in registered with the field
  names of `treespec_namedtuple_fields` (Python names, not keywords; `collections.namedtuple` validates them).
- floats (`as_float`, `as_floats`, `as_float_lists`, `real`, `imag`): JSON numbers, or exactly `Infinity`,
  `-Infinity` and `NaN`, which torch's serializer writes for inf, -inf and nan (`_dataclass_to_dict`) and
  `float()` reads back: a causal mask's `masked_fill(mask, float('-inf'))`. Nowhere else.
- string arguments (`as_string`, `as_strings`): values of the operator call (`reduce="mean"`), which FX writes
  with `repr`: any string up to 64 KiB.
- every `expr_str` (tensor sizes, strides and offsets, symbolic ints, floats and bools) goes to
  `sympy.sympify`, which `eval`s it: each must parse (`ast`, never evaluated) as a sympy `srepr` or infix
  expression of shape symbols (`s77`, `u0`), bounded integer literals, arithmetic and the integer functions
  torch prints (`Add`, `Mul`, `FloorDiv`, `Mod`, `Max`, `Eq`, ...; exponents and shifts by a literal <= 64);
- `guards_code` is compiled with `exec` when the program is unlifted with example inputs: each entry must be a
  comparison of `L['input'].size()[i]`, `.stride()[i]`, integers and arithmetic (subscript keys printable
  ASCII without quotes, backslashes or braces);
- `range_constraints` keys (symbol names, `int()`-parsed for unbacked symbols) follow the expression rule,
  with symbol numbers of at most 6 digits, and their bounds are 64-bit integers;
- node `target`s and `as_operator` arguments are resolved with `getattr` chains on `torch`, `operator` and
  `math` (`torch.os.system` resolves): each must be an `aten` overload (`torch.ops.aten.<op>.<overload>`) or
  one of torch's own symbolic-int operators; higher-order operators (subgraphs) and `#extension` operators
  are refused, and after loading every call must really be an `aten` `OpOverload` or one of those;
- node metadata is text (`stack_trace` becomes comments of FX's source: no carriage return or NUL);
  `source_fn_stack` targets are resolved with `getattr` on `torch` (dotted names); `custom` and `from_node`
  are JSON; device types are cpu, cuda or meta; verifiers ATEN or TRAINING;
- custom objects (torchbind `_pickle_load_obj`, opaque objects `pickle.loads`) and payloads marked
  `use_pickle` (`torch.load(weights_only=False)`) are refused, as are the legacy `.pt` weight files, AOTInductor
  folders (shared libraries) and anything else not written by `torch.export.save`;
- the sample inputs (`torch.load`, falling back to `weights_only=False`) are scanned with `pickletools`
  (opcodes only) and refused unless they rebuild plain tensors, and are then left out: torch gets none.

After loading, `check_graph` checks what torch built: aten calls only, plain tensors, Python-name node names
and placeholder targets, and keyword-argument keys of the input spec that are Python names.

Sizes: the file, the unpacked total (declared in the central directory, before inflating; `zipfile` never
inflates more than a member's declared size and checks its CRC) and the compression ratio of every member
over 1 MiB are bounded; a stored tensor's extent must fit its record. Finally torch loads a canonical
archive rebuilt from the checked members only (so torch's own zip reader cannot read something other than
what was checked), with `torch.load` forced to `weights_only=True` and `pickle.loads` refused.

Layering: imports nothing from `compiler`; torch is imported inside functions.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import hashlib
import io
import json
import keyword
import math
import operator
import os
import pickle
import pickletools
import re
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DEFAULT_MAX_FILE_BYTES = 1 << 30  # the upload as sent
DEFAULT_MAX_UNPACKED_BYTES = 1 << 30  # its members, inflated
DEFAULT_MAX_RATIO = 100.0  # inflated / compressed, per member over RATIO_FLOOR bytes
RATIO_FLOOR = 1 << 20  # smaller members cannot make a bomb whatever their ratio
MAX_MEMBERS = 100_000
MAX_EXPRESSION_CHARS = 10_000


class ModelError(ValueError):
    """A model that cannot be imported, with the field to blame ("file", "model", "input_shapes", "layout").

    str() is "field: message", as `WorkloadError`.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _refuse(where: str, message: str) -> ModelError:
    return ModelError("file", f"{where}: {message}; refused")


def short_error(e: BaseException | str, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text[:limit] + ("..." if len(text) > limit else "")


# ---------------------------------------------------------------------------
# The archive


_MODEL = "models/model.json"
_WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
_CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
_SAMPLE_INPUTS = "data/sample_inputs/model.pt"
# small text members torch's reader wants, with what they may hold
_TEXT_MEMBERS = {
    "archive_format": re.compile(rb"pt2"), "archive_version": re.compile(rb"\d{1,4}"),
    "byteorder": re.compile(rb"little|big"), ".data/version": re.compile(rb"\d{1,4}\n?"),
    ".data/serialization_id": re.compile(rb"[0-9A-Za-z]{0,128}"),
}
_PAYLOAD = re.compile(r"data/weights/weight_\d{1,9}|data/constants/tensor_\d{1,9}")
_EXTRA = re.compile(r"extra/[\w./-]+")  # text files the user attached: accepted, never given to torch
_load_lock = threading.Lock()


def load_exported_program(
    source: str | os.PathLike | bytes | IO[bytes],
    *,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_unpacked_bytes: int | None = None,
    max_ratio: float = DEFAULT_MAX_RATIO,
) -> torch.export.ExportedProgram:
    """Loads a `torch.export.save` file without evaluating anything from it (see the module docstring).

    Args:
        source: a path, the file's bytes, or a seekable binary file.
        max_bytes: the largest accepted file.
        max_unpacked_bytes: the largest total of its members, inflated; None: `max_bytes`.
        max_ratio: the largest inflated/compressed ratio of a member over 1 MiB.

    Raises:
        ModelError: field "file": not a zip or not an exported program, too big, a member or a string that
            could carry code (named, with where it is), or torch failed to read it.
    """
    with _open(source) as f:
        size = f.seek(0, io.SEEK_END)
        f.seek(0)
        if size > max_bytes:
            raise ModelError("file", f"the file has {size} bytes, more than the limit {max_bytes}")
        canonical, namedtuples = _checked_archive(
            f, max_unpacked_bytes if max_unpacked_bytes is not None else max_bytes, max_ratio)
    ep = _torch_load(canonical, namedtuples)
    check_graph(ep)
    return ep


@contextlib.contextmanager
def _open(source: str | os.PathLike | bytes | IO[bytes]) -> Iterator[IO[bytes]]:
    """`source` as a seekable binary file; closes only what it opened."""
    if isinstance(source, bytes | bytearray | memoryview):
        yield io.BytesIO(source)
    elif isinstance(source, str | os.PathLike):
        with Path(source).open("rb") as f:
            yield f
    else:
        yield source


def _checked_archive(f: IO[bytes], max_unpacked: int, max_ratio: float) -> tuple[bytes, dict[str, list[str]]]:
    """The archive checked member by member, rebuilt from the members torch needs (see the module docstring),
    and the namedtuple types its specs name (`_namedtuple_stand_ins`)."""
    try:
        archive = zipfile.ZipFile(f)
        infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        if not zipfile.is_zipfile(f):
            raise ModelError("file", "not a torch.export program (.pt2): the file is not a zip archive") from e
        raise ModelError("file", f"a damaged zip archive: {short_error(e)}") from e
    if not infos:
        raise ModelError("file", "an empty zip archive")
    if len(infos) > MAX_MEMBERS:
        raise ModelError("file", f"the archive has {len(infos)} members, more than {MAX_MEMBERS}")
    members = _check_members(infos, max_unpacked, max_ratio)
    for rest in ("archive_format", "archive_version", _MODEL, _WEIGHTS_CONFIG, _CONSTANTS_CONFIG, _SAMPLE_INPUTS):
        if rest not in members:
            raise ModelError("file", f"not a torch.export program (.pt2): no {rest} in the archive")

    def read(rest: str) -> bytes:
        info = members[rest]
        try:
            with archive.open(info) as m:
                data = m.read()  # zipfile stops at the declared size and checks the CRC
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
            raise ModelError("file", f"{info.filename}: unreadable ({short_error(e)})") from e
        assert len(data) == info.file_size, f"{info.filename}: {len(data)=} != {info.file_size=}"
        return data

    for rest, pattern in _TEXT_MEMBERS.items():
        if rest in members and not pattern.fullmatch(read(rest)):
            raise _refuse(members[rest].filename, "unexpected content")
    model = _json(read(_MODEL), members[_MODEL].filename)
    check_program(model, where=members[_MODEL].filename)
    namedtuples = _namedtuple_stand_ins(model, where=members[_MODEL].filename)
    configs = {}
    for rest, folder in ((_WEIGHTS_CONFIG, "data/weights/"), (_CONSTANTS_CONFIG, "data/constants/")):
        configs[rest] = _json(read(rest), members[rest].filename)
        sizes = {name[len(folder):]: info.file_size for name, info in members.items() if name.startswith(folder)}
        check_payload_config(configs[rest], sizes, where=members[rest].filename)
    check_sample_inputs(read(_SAMPLE_INPUTS), where=members[_SAMPLE_INPUTS].filename)

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        def put(rest: str, data: bytes) -> None:
            dst.writestr(zipfile.ZipInfo(f"archive/{rest}", date_time=(1980, 1, 1, 0, 0, 0)), data)

        for rest in _TEXT_MEMBERS:
            if rest in members:
                put(rest, read(rest))
        put(_MODEL, json.dumps(model).encode())
        for rest, config in configs.items():
            put(rest, json.dumps(config).encode())
            folder = rest.rsplit("/", 1)[0]
            for path_name in sorted({meta["path_name"] for meta in config["config"].values()}):
                put(f"{folder}/{path_name}", read(f"{folder}/{path_name}"))
        put(_SAMPLE_INPUTS, b"")  # torch then keeps no example inputs: nothing is unpickled
    return out.getvalue(), namedtuples


def _check_members(infos: list[zipfile.ZipInfo], max_unpacked: int, max_ratio: float) -> dict[str, zipfile.ZipInfo]:
    """Member name (under the root folder) -> its entry, every entry checked by name, method and size."""
    root = infos[0].filename.split("/", 1)[0]
    members: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in infos:
        prefix, _, rest = info.filename.partition("/")
        if info.is_dir() and prefix == root:
            continue
        if prefix != root or not (rest in _TEXT_MEMBERS or rest in (_MODEL, _WEIGHTS_CONFIG, _CONSTANTS_CONFIG,
                                                                    _SAMPLE_INPUTS)
                                  or _PAYLOAD.fullmatch(rest) or _EXTRA.fullmatch(rest)):
            raise ModelError("file", f"unexpected archive member {info.filename!r}: not a plain torch.export "
                                     "program (pickled objects, compiled code, custom objects, legacy formats "
                                     "and programs other than 'model' are refused)")
        if rest in members:
            raise _refuse(info.filename, "the archive holds two members of this name")
        if info.flag_bits & 0x1:
            raise _refuse(info.filename, "an encrypted member")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise _refuse(info.filename, f"compression method {info.compress_type} (only stored and deflated)")
        total += info.file_size
        if total > max_unpacked:
            raise ModelError("file", f"the archive unpacks to more than {max_unpacked} bytes (the limit)")
        if info.file_size > RATIO_FLOOR and info.file_size > max_ratio * max(info.compress_size, 1):
            raise _refuse(info.filename, f"compressed {info.file_size / max(info.compress_size, 1):.0f}:1, "
                                         f"more than the limit {max_ratio:g}:1 (a zip bomb?)")
        members[rest] = info
    return members


def _json(data: bytes, where: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise _refuse(where, f"not JSON ({short_error(e, 100)})") from e


def _namedtuple_stand_ins(model: dict, where: str) -> dict[str, list[str]]:
    """Renames the namedtuple types of the program's pytree specs to stand-ins: serialized name -> field names.

    torch reads a namedtuple node by looking its type name up among the types registered in the loading
    process (`_namedtuple_deserialize`), so a model returning the user's own namedtuple loads nowhere but where
    it was exported. Each (name, fields) gets a stand-in name from a hash of both, written into the specs and
    `treespec_namedtuple_fields`, for which `_torch_load` registers a plain namedtuple of those fields: the
    leaves and their order are the program's. Both were checked (`check_program`): dotted names, identifiers.

    Raises:
        ModelError: field "file": a namedtuple of the specs whose fields the program does not list.
    """
    graph_module = model["graph_module"]
    fields_by_name = graph_module.get("treespec_namedtuple_fields") or {}
    stand_ins: dict[str, list[str]] = {}
    renamed: dict[str, str] = {}

    def rename(node: dict) -> None:
        if node.get("type") == "collections.namedtuple":
            name = node["context"]
            if name not in fields_by_name:
                raise _refuse(where, f"namedtuple {short_error(repr(name), 80)} of a pytree spec has no entry in "
                                     "treespec_namedtuple_fields")
            fields = list(fields_by_name[name]["field_names"])
            digest = hashlib.sha256(json.dumps([name, fields]).encode()).hexdigest()[:16]
            node["context"] = renamed[name] = f"altune.namedtuple.T{digest}"
            stand_ins[node["context"]] = fields
        for child in node.get("children_spec", []):
            rename(child)

    for entry in graph_module.get("module_call_graph") or []:
        signature = entry.get("signature")
        for key in ("in_spec", "out_spec"):
            if signature and isinstance(signature.get(key), str) and "collections.namedtuple" in signature[key]:
                spec = json.loads(signature[key])
                rename(spec[1])
                signature[key] = json.dumps(spec)
    if renamed:
        graph_module["treespec_namedtuple_fields"] = {
            renamed.get(name, name): fields for name, fields in fields_by_name.items()}
    return stand_ins


def _register_namedtuples(stand_ins: dict[str, list[str]]) -> None:
    """Registers a plain namedtuple for each stand-in name not registered yet (see `_namedtuple_stand_ins`)."""
    # heavy: torch only after the archive is checked (the API loads pt2 without it)
    from torch.utils import _pytree as pytree

    for name, fields in stand_ins.items():
        if name not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
            cls = collections.namedtuple(name.rsplit(".", 1)[-1], fields, rename=True, module="altune.namedtuple")
            pytree._register_namedtuple(cls, serialized_type_name=name)


def _torch_load(canonical: bytes, namedtuples: dict[str, list[str]]) -> torch.export.ExportedProgram:
    """`torch.export.load` of the checked archive, `torch.load` forced to `weights_only` and `pickle.loads` refused."""
    import torch  # heavy: torch only after the archive is checked (the API loads pt2 without it)
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers QUANTIZED_OPS for the loader to resolve

    real_load, real_loads = torch.load, pickle.loads

    def weights_only_load(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        return real_load(*args, **kwargs)

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise ModelError("file", "the file holds a pickled Python object; refused")

    with _load_lock:  # the patches are process-wide: one load at a time
        _register_namedtuples(namedtuples)
        torch.load, pickle.loads = weights_only_load, refuse
        try:
            return torch.export.load(io.BytesIO(canonical))
        except (ModelError, MemoryError):
            raise
        except Exception as e:  # torch's reasons are many (versions, schema, bad JSON): all mean "unreadable"
            raise ModelError("file", f"not a readable torch.export program: {type(e).__name__}: {short_error(e)}") from e
        finally:
            torch.load, pickle.loads = real_load, real_loads


# ---------------------------------------------------------------------------
# The program's JSON: every string by its class


# A Python name: an ASCII identifier not starting with "__". Node and tensor names (FX sets `node.name` to them
# unsanitized and writes them as variables), placeholder targets, forward's argument names and keyword-argument
# keys are written into the source FX generates as they are.
_IDENT = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
# Printable ASCII that cannot close or escape a quoted Python literal, nor open an f-string field: no quote,
# backslash or brace ("\x20"-"\x7e" less " ' \ { }).
_SAFE = r" !#-&(-\[\]-z|~"
# An attribute path (a parameter, buffer or constant name, a module path): parts joined by dots, each made of
# `_SAFE` characters but the dot and not starting with "__". FX writes a part that is not an identifier as
# `getattr(m, "part")` (`torch.fx.graph._format_target`); `_assign_attr` gives each part to `setattr`.
_PART = r"(?!__)[ !#-&(-\-/-\[\]-z|~]+"
_FQN = re.compile(rf"{_PART}(?:\.{_PART})*", re.ASCII)
_DOTTED = re.compile(r"(?!__)[A-Za-z_]\w*(?:\.(?!__)[A-Za-z_]\w*)*", re.ASCII)  # module.qualname, torch.nn.X
_SYMBOL = re.compile(r"[a-z]{1,8}\d{1,6}", re.ASCII)  # s77, u0: torch's shape symbols
_ATEN = re.compile(r"torch\.ops\.aten\.(?!__)[A-Za-z_]\w*\.(?!__)[A-Za-z_]\w*", re.ASCII)
# how torch's serializer writes a float that JSON has no number for (`_dataclass_to_dict`); `float()` reads them
_FLOAT_WORDS = frozenset({"Infinity", "-Infinity", "NaN"})
_DENIED_OPS = frozenset({"from_file"})  # aten operators that reach outside the tensors they are given
# the (de)quantization operators of a PT2E-quantized program (`torchao`'s `convert_pt2e`): pure arithmetic on the
# tensors they are given, registered by `torch.ao.quantization.fx._decomposed` (imported before the load)
QUANTIZED_OPS = frozenset(f"torch.ops.quantized_decomposed.{op}.{overload}"
                          for op in ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel",
                                     "dequantize_per_channel")
                          for overload in ("default", "tensor"))
_VERIFIERS = frozenset({"", "ATEN", "TRAINING"})
_TREESPEC_TYPES = frozenset({"builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict",
                             "collections.namedtuple"})
_MAX_INT = 1 << 64
_MAX_NAME = 1024
_GUARD_KEY = re.compile(rf"[{_SAFE}]{{1,{_MAX_NAME}}}", re.ASCII)  # L['x'], L['batch']['aux-input']
# dicts of the schema whose keys are data, with the class of their keys (all other keys are field names)
_KEYED = {
    "tensor_values": "name", "sym_int_values": "name", "sym_bool_values": "name", "sym_float_values": "name",
    "opset_version": "name", "as_string_to_argument": "name",
}


def check_program(model: Any, where: str = _MODEL) -> None:
    """Refuses a `models/<name>.json` with a string outside its class (module docstring: which string is what).

    Schema field names and every string not listed are Python names; attribute paths, floats, string
    arguments, metadata, expressions, guards, targets and pytree specs have their own rules (`_FIELDS`).

    Raises:
        ModelError: field "file", naming the string and where it is.
    """
    if not isinstance(model, dict) or not isinstance(model.get("graph_module"), dict):
        raise _refuse(where, "not an exported program")
    stack: list[tuple[Any, tuple]] = [(model, ())]
    while stack:
        value, path = stack.pop()
        at = f"{where} at {_path(path)}"
        parent = path[-1] if path else None
        if isinstance(value, dict):
            for key, item in value.items():
                if parent == "range_constraints":
                    check_sym_expr(key, at)
                    _check_range(item, f"{where} at {_path((*path, key))}")
                    continue
                _check_ident(key, at, "a name" if parent in _KEYED else "a field name")
                handler = _FIELDS.get(key) if parent not in _KEYED else None
                if handler is not None:
                    handler(item, f"{where} at {_path((*path, key))}")
                else:
                    stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_ident(value, at)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_INT:
            raise _refuse(at, f"an integer of {len(str(value))} digits")


def _path(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "the top"


def _check_ident(value: Any, at: str, what: str = "a name") -> None:
    if not isinstance(value, str) or len(value) > _MAX_NAME or not _IDENT.fullmatch(value):
        raise _refuse(at, f"{short_error(repr(value), 120)} as {what}: not a Python identifier (names become "
                          "Python source)")


def _check_python_names(value: Any, at: str, what: str) -> None:
    """Names FX writes as parameters of the `forward` it generates: identifiers that are not keywords."""
    for name in value if isinstance(value, list) else [value]:
        _check_ident(name, at, what)
        if keyword.iskeyword(name):
            raise _refuse(at, f"{name!r} as {what}: a Python keyword")


def _check_fqn(value: Any, at: str, *, root: bool = False) -> None:
    if root and value == "":
        return
    if not isinstance(value, str) or len(value) > _MAX_NAME or not _FQN.fullmatch(value):
        raise _refuse(at, f"{short_error(repr(value), 120)} is not an attribute path (parts joined by dots, each "
                          "printable ASCII without quotes, backslashes or braces, none starting with '__'; "
                          "FX writes them into Python source)")


def _check_floats(value: Any, at: str) -> None:
    """`as_float(s)`, `as_float_lists`, `real`, `imag`: numbers, or how torch writes inf, -inf and nan."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif not (type(v) in (int, float) or (isinstance(v, str) and v in _FLOAT_WORDS)):
            raise _refuse(at, f"float {short_error(repr(v), 60)} is not a number, 'Infinity', '-Infinity' or 'NaN'")


def _check_range(value: Any, at: str) -> None:
    if not isinstance(value, dict) or set(value) - {"min_val", "max_val"}:
        raise _refuse(at, "a range that is not {min_val, max_val}")
    for bound in value.values():
        if bound is not None and (type(bound) is not int or abs(bound) > _MAX_INT):
            raise _refuse(at, f"range bound {short_error(repr(bound), 60)} is not a 64-bit integer")


def _check_text(value: Any, at: str, limit: int = 1 << 20) -> None:
    if not isinstance(value, str) or len(value) > limit or "\r" in value or "\0" in value:
        raise _refuse(at, "text with a carriage return or NUL, or too long (text can become Python source)")


def _check_strings(value: Any, at: str) -> None:
    """`as_string(s)` arguments: torch passes them on as values (FX writes them with repr)."""
    for s in value if isinstance(value, list) else [value]:
        if not isinstance(s, str) or len(s) > 1 << 16:
            raise _refuse(at, "a string argument that is not a string or too long")


def _check_guards(value: Any, at: str) -> None:
    if not isinstance(value, list):
        raise _refuse(at, "guards_code is not a list")
    for i, guard in enumerate(value):
        check_guard(guard, f"{at}[{i}]")


def _check_metadata(value: Any, at: str) -> None:
    if not isinstance(value, dict):
        raise _refuse(at, "metadata is not a mapping")
    for key, text in value.items():
        _check_ident(key, at, "a metadata key")
        _check_text(text, f"{at}.{key}")
        if key in ("custom", "from_node"):
            _json(text.encode(), f"{at}.{key}")
        elif key == "source_fn_stack":  # "name,target;...": the targets are resolved with getattr on torch
            for item in text.split(";"):
                name, _, target = item.partition(",")
                _check_ident(name, f"{at}.{key}")
                if not _DOTTED.fullmatch(target):
                    raise _refuse(f"{at}.{key}", f"{short_error(repr(target), 80)} is not a dotted name")


def _check_namedtuple_fields(value: Any, at: str) -> None:
    """`treespec_namedtuple_fields`: {type name: {field_names: [...]}}, kept as metadata."""
    if not isinstance(value, dict):
        raise _refuse(at, "treespec_namedtuple_fields is not a mapping")
    for name, fields in value.items():
        _check_namedtuple_name(name, at)
        if not isinstance(fields, dict) or set(fields) != {"field_names"} or not isinstance(
                fields["field_names"], list):
            raise _refuse(f"{at}.{name}", "not {field_names: [...]}")
        _check_python_names(fields["field_names"], f"{at}.{name}", "a namedtuple field")


def _check_namedtuple_name(value: Any, at: str) -> None:
    """A namedtuple's serialized type name: a key torch looks up (`_namedtuple_deserialize`), and the loader
    replaces it with a stand-in's before torch sees it (`_namedtuple_stand_ins`)."""
    if not isinstance(value, str) or not 0 < len(value) <= 256 or not value.isprintable():
        raise _refuse(at, f"namedtuple type {short_error(repr(value), 80)} is not a printable name up to 256 "
                          "characters")


def _check_device(value: Any, at: str) -> None:
    if not isinstance(value, dict) or value.get("type") not in ("cpu", "cuda", "meta") or not (
            value.get("index") is None or type(value.get("index")) is int):
        raise _refuse(at, f"device {short_error(repr(value), 80)} is not cpu, cuda or meta")


def _refuse_field(what: str) -> Any:
    def handler(_value: Any, at: str) -> None:
        raise _refuse(at, what)

    return handler


def _check_custom_obj_values(value: Any, at: str) -> None:
    if value:
        raise _refuse(at, "the program holds custom objects (torchbind or opaque classes, loaded by name)")


def _check_verifiers(value: Any, at: str) -> None:
    if not isinstance(value, list) or any(v not in _VERIFIERS for v in value):
        raise _refuse(at, f"verifiers {short_error(repr(value), 80)}: only ATEN and TRAINING programs are accepted")


_FIELDS = {
    "expr_str": lambda v, at: check_sym_expr(v, at),
    "guards_code": _check_guards,
    "target": lambda v, at: check_target(v, at),
    "as_operator": lambda v, at: check_target(v, at),
    "in_spec": lambda v, at: check_treespec(v, at, inputs=True),
    "out_spec": lambda v, at: check_treespec(v, at),
    "forward_arg_names": lambda v, at: _check_python_names(v or [], at, "an argument name"),
    "parameter_name": _check_fqn,
    "buffer_name": _check_fqn,
    "tensor_constant_name": _check_fqn,
    "fqn": lambda v, at: _check_fqn(v, at, root=True),
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


# ---------------------------------------------------------------------------
# Strings torch evaluates: symbolic expressions, guards, operator names, pytree specs


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
        raise _refuse(at, f"{what} {short_error(repr(text), 120)} is not short printable ASCII")
    try:
        return ast.parse(text, mode="eval").body  # parsing runs nothing
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise _refuse(at, f"{what} {short_error(repr(text), 120)} does not parse") from e


def check_sym_expr(text: Any, at: str = "expr_str") -> None:
    """Refuses a symbolic expression (`expr_str`) that is more than shape arithmetic (what sympify may eval).

    Raises:
        ModelError: field "file", naming the expression.
    """
    what = "symbolic expression (expr_str)"
    bad = _sym_expr_error(_parse(text, at, what))
    if bad:
        raise _refuse(at, f"{what} {short_error(repr(text), 120)} is not plain arithmetic on shape symbols ({bad})")


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
            if type(n.value) is int and abs(n.value) <= _MAX_INT:
                continue
            if type(n.value) is float and math.isfinite(n.value):
                continue
            return f"literal {short_error(repr(n.value), 40)}"
        if isinstance(n, ast.Name):
            if not (_SYMBOL.fullmatch(n.id) or n.id in _SYMPY_NAMES):
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
                                            and _SYMBOL.fullmatch(n.args[0].value)):
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
        raise _refuse(at, f"{what} {short_error(repr(text), 120)} is not a shape guard ({bad})")


def _is_input(node: ast.expr) -> bool:
    """`L['x']`, `L['x'][0]`, `L['kw']['y']`: an input by its path (identifier keys, integer indices)."""
    while isinstance(node, ast.Subscript):
        key = node.slice
        if not isinstance(key, ast.Constant) or not (
                (isinstance(key.value, str) and _GUARD_KEY.fullmatch(key.value))
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
            if type(n.value) in (int, bool) and abs(n.value) <= _MAX_INT:
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
    if isinstance(target, str) and _ATEN.fullmatch(target):
        if target.split(".")[3] in _DENIED_OPS:
            raise _refuse(at, f"operator {target!r} reads outside its tensors")
        return
    if isinstance(target, str) and (target in _sym_op_names() or target in QUANTIZED_OPS):
        return
    if isinstance(target, str) and target.startswith("torch.ops.higher_order."):
        raise _refuse(at, f"higher-order operator {short_error(target, 80)!r} is not supported")
    raise _refuse(at, f"node target {short_error(repr(target), 120)} is not an aten operator "
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
        raise _refuse(at, "a pytree spec that is not a string or too long")
    spec = _json(text.encode(), at)
    if not (isinstance(spec, list) and len(spec) == 2 and spec[0] == 1):
        raise _refuse(at, "a pytree spec that is not [1, {...}] (protocol 1)")
    if inputs:
        _check_kwargs_keys(spec[1], at)
    stack = [(spec[1], 0)]
    while stack:
        node, depth = stack.pop()
        if depth > 64 or not isinstance(node, dict) or set(node) != {"type", "context", "children_spec"} or (
                not isinstance(node["children_spec"], list)):
            raise _refuse(at, "a pytree spec node that is not {type, context, children_spec} (or too deep)")
        typ, context, children = node["type"], node["context"], node["children_spec"]
        if typ is None:
            if context is not None or children:
                raise _refuse(at, "a pytree leaf with a context or children")
            continue
        if typ not in _TREESPEC_TYPES:
            raise _refuse(at, f"pytree type {short_error(repr(typ), 80)} (only tuple, list, dict, OrderedDict and "
                              "namedtuple; others import modules by name)")
        if not isinstance(context, str):
            raise _refuse(at, f"a {typ} context that is not a string")
        if typ == "collections.namedtuple":
            _check_namedtuple_name(context, at)
        elif typ in ("builtins.tuple", "builtins.list"):
            if _json(context.encode(), at) is not None:
                raise _refuse(at, f"a {typ} context that is not null")
        else:
            keys = _json(context.encode(), at)
            for key in keys if isinstance(keys, list) else [keys]:
                _check_dict_key(key, at)
            if not isinstance(keys, list) or len(keys) != len(children):
                raise _refuse(at, f"a {typ} context that is not a list of one key per child")
        stack.extend((child, depth + 1) for child in children)


def _check_kwargs_keys(root: Any, at: str) -> None:
    """The keys of the kwargs dict of an input spec `(args, kwargs)` (the shape `gen_var_bindings` pastes)."""
    children = root.get("children_spec") if isinstance(root, dict) else None
    if not (root.get("type") == "builtins.tuple" and isinstance(children, list) and len(children) == 2
            and all(isinstance(c, dict) for c in children)
            and [c.get("type") for c in children] == ["builtins.tuple", "builtins.dict"]):
        return
    keys = _json(children[1]["context"].encode(), at) if isinstance(children[1].get("context"), str) else None
    for key in keys if isinstance(keys, list) else []:
        if not isinstance(key, str) or not _IDENT.fullmatch(key) or keyword.iskeyword(key):
            raise _refuse(at, f"keyword argument {short_error(repr(key), 120)} is not a Python identifier "
                              "(FX writes the keyword arguments' names into Python source)")


def _check_dict_key(key: Any, at: str) -> None:
    if isinstance(key, str):
        if len(key) > _MAX_NAME or not key.isprintable():
            raise _refuse(at, f"dict key {short_error(repr(key), 120)} is longer than {_MAX_NAME} characters or "
                              "not printable")
    elif isinstance(key, dict | list):
        raise _refuse(at, "a pytree context that holds a JSON object or list (torch would import an enum by name)")
    elif not (key is None or isinstance(key, bool) or (isinstance(key, int) and abs(key) <= _MAX_INT)
              or (isinstance(key, float) and math.isfinite(key))):
        raise _refuse(at, f"dict key {short_error(repr(key), 60)} is not a string, number, bool or null")



# ---------------------------------------------------------------------------
# Payloads: weights, constants, sample inputs


def check_payload_config(config: Any, record_sizes: dict[str, int], where: str) -> None:
    """Refuses a weights or constants config with a pickled or custom entry, or a tensor outside its record.

    Args:
        config: the parsed `{"config": {fqn: {path_name, is_param, use_pickle, tensor_meta}}}`.
        record_sizes: the payload members beside it (`weight_0` -> inflated bytes).

    Raises:
        ModelError: field "file", naming the entry.
    """
    # heavy: torch only after the archive is checked (the API loads pt2 without it)
    from torch._export.serde.schema import Layout
    # heavy: torch only after the archive is checked (the API loads pt2 without it)
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    if not isinstance(config, dict) or set(config) != {"config"} or not isinstance(config["config"], dict):
        raise _refuse(where, "not a payload config {config: {...}}")
    for fqn, meta in config["config"].items():
        at = f"{where} at {fqn}"
        _check_fqn(fqn, at)
        if not isinstance(meta, dict) or set(meta) - {"path_name", "is_param", "use_pickle", "tensor_meta"}:
            raise _refuse(at, "not a payload entry")
        path_name = meta.get("path_name")
        if meta.get("use_pickle") is not False or not isinstance(path_name, str) or not re.fullmatch(
                r"(weight|tensor)_\d{1,9}", path_name, re.ASCII):
            raise _refuse(at, f"{fqn!r} is stored as a pickled or custom object")
        if path_name not in record_sizes:
            raise _refuse(at, f"its record {path_name!r} is not in the archive")
        tensor = meta.get("tensor_meta")
        if not isinstance(tensor, dict):
            raise _refuse(at, "no tensor_meta")
        dtype = _SERIALIZE_TO_TORCH_DTYPE.get(tensor.get("dtype")) if type(tensor.get("dtype")) is int else None
        if dtype is None or tensor.get("layout") != Layout.Strided or not isinstance(tensor.get("device"), dict) or (
                tensor["device"].get("type") != "cpu"):
            raise _refuse(at, "a tensor that is not a strided CPU tensor of a known dtype")
        try:
            sizes = [_as_int(s) for s in tensor["sizes"]]
            strides = [_as_int(s) for s in tensor["strides"]]
            offset = _as_int(tensor["storage_offset"])
        except (KeyError, TypeError, ValueError) as e:
            raise _refuse(at, "sizes, strides and storage_offset must be plain non-negative integers") from e
        if len(sizes) != len(strides):
            raise _refuse(at, f"{len(sizes)} sizes but {len(strides)} strides")
        record = record_sizes[path_name] // max(dtype.itemsize, 1)
        numel = math.prod(sizes)
        extent = 0 if numel == 0 else offset + 1 + sum((n - 1) * s for n, s in zip(sizes, strides))
        if extent > record:  # torch would allocate `sizes` zeros for an empty record
            raise _refuse(at, f"a tensor of {numel} elements reaching element {extent} of a record of {record}")


def _as_int(value: Any) -> int:
    if not isinstance(value, dict) or set(value) != {"as_int"} or type(value["as_int"]) is not int or not (
            0 <= value["as_int"] <= _MAX_INT):
        raise ValueError(f"not a plain integer: {value!r}")
    return value["as_int"]


# what `torch.save` of tensors and containers of them pickles (protocol 2: GLOBAL opcodes)
_PICKLE_GLOBALS = re.compile(r"torch\._utils _rebuild_tensor_v2|torch\._utils _rebuild_parameter|"
                             r"torch [A-Za-z0-9]{1,20}Storage|collections OrderedDict|torch device", re.ASCII)
_PICKLE_OPS = frozenset({"INST", "OBJ", "STACK_GLOBAL", "EXT1", "EXT2", "EXT4", "NEWOBJ_EX"})
MAX_PICKLE_BYTES = 16 << 20


def check_sample_inputs(data: bytes, where: str = _SAMPLE_INPUTS) -> None:
    """Refuses sample inputs that unpickle anything but tensors; reads the opcodes, runs nothing.

    torch would `torch.load` them, falling back to `weights_only=False`; the loader then leaves them out.

    Raises:
        ModelError: field "file", naming the global the pickle asks for.
    """
    if not data:
        return
    try:
        inner = zipfile.ZipFile(io.BytesIO(data))
        pickles = [i for i in inner.infolist() if i.filename.endswith("data.pkl")]
        if len(pickles) != 1:
            raise _refuse(where, "not a torch.save file of tensors (one data.pkl)")
        if pickles[0].file_size > MAX_PICKLE_BYTES:  # tensors' bytes are records of their own: the pickle is small
            raise _refuse(where, f"a pickle of {pickles[0].file_size} bytes, more than {MAX_PICKLE_BYTES}")
        with inner.open(pickles[0]) as f:
            code = f.read()
        for op, arg, _pos in pickletools.genops(code):
            if op.name in _PICKLE_OPS or (op.name == "GLOBAL" and not _PICKLE_GLOBALS.fullmatch(str(arg))):
                raise _refuse(where, f"holds more than tensors (the pickle asks for {op.name} "
                                     f"{short_error(repr(arg), 80)})")
    except ModelError:
        raise
    except Exception as e:  # a damaged zip or pickle: refused the same way
        raise _refuse(where, f"holds more than tensors or is damaged ({short_error(e, 100)})") from e


# ---------------------------------------------------------------------------
# The loaded graph


def check_graph(ep: torch.export.ExportedProgram) -> None:
    """Refuses a loaded program whose graphs call anything but `aten` operators and torch's symbolic-int ones,
    hold anything but plain tensors, or name a node or a keyword argument with more than a Python name.

    The JSON was checked already; this checks what torch actually built, before anything traces it.

    Raises:
        ModelError: field "file", naming the node.
    """
    import torch  # heavy: torch only after the archive is checked (the API loads pt2 without it)
    # heavy: torch only after the archive is checked (the API loads pt2 without it)
    from torch._export.serde.serialize import _SYM_OPS

    allowed = {*_SYM_OPS, operator.getitem}
    for module in ep.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            # FX writes node names and placeholder targets into the source it generates as they are
            for name in (node.name, node.target) if node.op == "placeholder" else (node.name,):
                if not isinstance(name, str) or not _IDENT.fullmatch(name):
                    raise _refuse("the loaded graph", f"node name {short_error(repr(name), 80)} is not a Python "
                                                      "identifier")
            if node.op in ("placeholder", "output"):
                continue
            target = node.target
            ok = node.op == "call_function" and (
                (isinstance(target, torch._ops.OpOverload) and target.namespace == "aten"
                 and target._schema.name.split("::")[-1] not in _DENIED_OPS)
                or (isinstance(target, torch._ops.OpOverload) and f"torch.ops.{target}" in QUANTIZED_OPS)
                or (not isinstance(target, torch._ops.OperatorBase) and target in allowed))
            if not ok:
                raise _refuse("the loaded graph", f"node {node.name!r} is a {node.op} of {short_error(repr(target), 80)}, "
                                                  "not an aten operator")
    for name, value in (*ep.state_dict.items(), *ep.constants.items()):
        if not isinstance(value, torch.Tensor) or type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise _refuse("the loaded program", f"{name!r} is a {type(value).__name__}, not a plain tensor")
    in_spec = ep.call_spec.in_spec
    if in_spec is not None and in_spec.type is tuple and in_spec.num_children == 2 and (
            in_spec.child(1).type is dict):
        for key in in_spec.child(1).context:
            if not isinstance(key, str) or not _IDENT.fullmatch(key) or keyword.iskeyword(key):
                raise _refuse("the loaded program", f"keyword argument {short_error(repr(key), 80)} is not a "
                                                    "Python identifier")


def static_shapes(ep: torch.export.ExportedProgram, input_shapes: list[list[int]] | None = None, *,
                  max_tensor_elements: int = 1 << 28) -> torch.export.ExportedProgram:
    """The program with every dynamic input dimension (`torch.export.Dim`) fixed; `ep` itself when it has none.

    `import_model` takes static shapes: a program exported with dynamic dimensions is exported again
    from its own graph (`ep.module()`: aten operators and checked guards only) at `input_shapes`, or
    at the sizes of the example inputs it was exported with.

    Raises:
        ModelError: "input_shapes" when the shapes are not given and the program keeps no example
            sizes, do not fit its inputs or its dimensions' ranges, or are over `max_tensor_elements`.
    """
    import torch  # heavy: torch only after the archive is checked (the API loads pt2 without it)

    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    vals = [placeholders[s.arg.name].meta.get("val") for s in ep.graph_signature.input_specs
            if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    if all(isinstance(d, int) for v in vals for d in getattr(v, "shape", ())):
        return ep
    if not all(isinstance(v, torch.Tensor) for v in vals):
        raise ModelError("input_shapes", "a program with dynamic dimensions and non-tensor inputs; "
                                         "export it with static shapes")
    if input_shapes is None:
        hints = [[d if isinstance(d, int) else d.node.hint for d in v.shape] for v in vals]
        if any(h is None for shape in hints for h in shape):
            raise ModelError("input_shapes", "the program has dynamic dimensions and no example sizes: "
                                             "give input_shapes")
        shapes = [[int(h) for h in shape] for shape in hints]
    else:
        shapes = [[int(d) for d in s] for s in input_shapes]
    if len(shapes) != len(vals) or any(len(s) != v.dim() for s, v in zip(shapes, vals)):
        raise ModelError("input_shapes", f"the program takes {len(vals)} inputs of ranks "
                                         f"{[v.dim() for v in vals]}, got shapes {shapes}")
    for shape in shapes:
        if math.prod(shape) > max_tensor_elements or min(shape, default=1) < 0:
            raise ModelError("input_shapes", f"input shape {shape} is negative or over {max_tensor_elements} "
                                             "elements (the limit)")
    args = tuple(torch.zeros(shape, dtype=v.dtype) for shape, v in zip(shapes, vals))
    try:
        return torch.export.export(ep.module(), args)
    except Exception as e:  # a guard or a dimension's range refused the shapes, or the graph cannot be traced
        raise ModelError("input_shapes", f"the program's dynamic dimensions cannot take {shapes}: "
                                         f"{type(e).__name__}: {short_error(e)}") from e
