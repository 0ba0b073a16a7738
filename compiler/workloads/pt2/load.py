"""`load_exported_program`: the archive checked (sizes, members, ratios; every JSON and payload by
`program` and `payloads`), rebuilt from the checked members only, then given to torch with `torch.load`
forced to `weights_only=True` and `pickle.loads` refused; `check_graph` checks what torch built, and
`static_shapes` pins a program's symbolic input shapes.

Layering: imports nothing from `compiler` but its own package; torch is imported inside the functions that
load or inspect a program (see the comment at each).
"""

from __future__ import annotations

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
import re
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .payloads import check_payload_config, check_sample_inputs
from .program import check_program
from .rules import (
    CONSTANTS_CONFIG,
    DENIED_OPS,
    IDENT,
    MODEL_JSON,
    QUANTIZED_OPS,
    SAMPLE_INPUTS,
    WEIGHTS_CONFIG,
    ModelError,
    parse_json,
    refusal,
    short_error,
)

if TYPE_CHECKING:
    import torch


DEFAULT_MAX_FILE_BYTES = 1 << 30  # the upload as sent


DEFAULT_MAX_UNPACKED_BYTES = 1 << 30  # its members, inflated


DEFAULT_MAX_RATIO = 100.0  # inflated / compressed, per member over RATIO_FLOOR bytes


RATIO_FLOOR = 1 << 20  # smaller members cannot make a bomb whatever their ratio


MAX_MEMBERS = 100_000


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
    for rest in ("archive_format", "archive_version", MODEL_JSON, WEIGHTS_CONFIG, CONSTANTS_CONFIG, SAMPLE_INPUTS):
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
            raise refusal(members[rest].filename, "unexpected content")
    model = parse_json(read(MODEL_JSON), members[MODEL_JSON].filename)
    check_program(model, where=members[MODEL_JSON].filename)
    namedtuples = _namedtuple_stand_ins(model, where=members[MODEL_JSON].filename)
    configs = {}
    for rest, folder in ((WEIGHTS_CONFIG, "data/weights/"), (CONSTANTS_CONFIG, "data/constants/")):
        configs[rest] = parse_json(read(rest), members[rest].filename)
        sizes = {name[len(folder):]: info.file_size for name, info in members.items() if name.startswith(folder)}
        check_payload_config(configs[rest], sizes, where=members[rest].filename)
    check_sample_inputs(read(SAMPLE_INPUTS), where=members[SAMPLE_INPUTS].filename)

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        def put(rest: str, data: bytes) -> None:
            dst.writestr(zipfile.ZipInfo(f"archive/{rest}", date_time=(1980, 1, 1, 0, 0, 0)), data)

        for rest in _TEXT_MEMBERS:
            if rest in members:
                put(rest, read(rest))
        put(MODEL_JSON, json.dumps(model).encode())
        for rest, config in configs.items():
            put(rest, json.dumps(config).encode())
            folder = rest.rsplit("/", 1)[0]
            for path_name in sorted({meta["path_name"] for meta in config["config"].values()}):
                put(f"{folder}/{path_name}", read(f"{folder}/{path_name}"))
        put(SAMPLE_INPUTS, b"")  # torch then keeps no example inputs: nothing is unpickled
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
        if prefix != root or not (rest in _TEXT_MEMBERS or rest in (MODEL_JSON, WEIGHTS_CONFIG, CONSTANTS_CONFIG,
                                                                    SAMPLE_INPUTS)
                                  or _PAYLOAD.fullmatch(rest) or _EXTRA.fullmatch(rest)):
            raise ModelError("file", f"unexpected archive member {info.filename!r}: not a plain torch.export "
                                     "program (pickled objects, compiled code, custom objects, legacy formats "
                                     "and programs other than 'model' are refused)")
        if rest in members:
            raise refusal(info.filename, "the archive holds two members of this name")
        if info.flag_bits & 0x1:
            raise refusal(info.filename, "an encrypted member")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise refusal(info.filename, f"compression method {info.compress_type} (only stored and deflated)")
        total += info.file_size
        if total > max_unpacked:
            raise ModelError("file", f"the archive unpacks to more than {max_unpacked} bytes (the limit)")
        if info.file_size > RATIO_FLOOR and info.file_size > max_ratio * max(info.compress_size, 1):
            raise refusal(info.filename, f"compressed {info.file_size / max(info.compress_size, 1):.0f}:1, "
                                         f"more than the limit {max_ratio:g}:1 (a zip bomb?)")
        members[rest] = info
    return members


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
                raise refusal(where, f"namedtuple {short_error(repr(name), 80)} of a pytree spec has no entry in "
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
                if not isinstance(name, str) or not IDENT.fullmatch(name):
                    raise refusal("the loaded graph", f"node name {short_error(repr(name), 80)} is not a Python "
                                                      "identifier")
            if node.op in ("placeholder", "output"):
                continue
            target = node.target
            ok = node.op == "call_function" and (
                (isinstance(target, torch._ops.OpOverload) and target.namespace == "aten"
                 and target._schema.name.split("::")[-1] not in DENIED_OPS)
                or (isinstance(target, torch._ops.OpOverload) and f"torch.ops.{target}" in QUANTIZED_OPS)
                or (not isinstance(target, torch._ops.OperatorBase) and target in allowed))
            if not ok:
                raise refusal("the loaded graph", f"node {node.name!r} is a {node.op} of {short_error(repr(target), 80)}, "
                                                  "not an aten operator")
    for name, value in (*ep.state_dict.items(), *ep.constants.items()):
        if not isinstance(value, torch.Tensor) or type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise refusal("the loaded program", f"{name!r} is a {type(value).__name__}, not a plain tensor")
    in_spec = ep.call_spec.in_spec
    if in_spec is not None and in_spec.type is tuple and in_spec.num_children == 2 and (
            in_spec.child(1).type is dict):
        for key in in_spec.child(1).context:
            if not isinstance(key, str) or not IDENT.fullmatch(key) or keyword.iskeyword(key):
                raise refusal("the loaded program", f"keyword argument {short_error(repr(key), 80)} is not a "
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
