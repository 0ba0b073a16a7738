"""The payloads of a .pt2: the weight and constant configs (each record's extent must fit its stored bytes)
and the sample inputs (scanned with `pickletools`, opcodes only, and refused unless they rebuild plain
tensors).

Layering: imports nothing from `compiler` but its own package; torch is imported inside the functions that
load or inspect a program (see the comment at each).
"""

from __future__ import annotations

import io
import math
import pickletools
import re
import zipfile
from typing import TYPE_CHECKING, Any

from .rules import MAX_INT, SAMPLE_INPUTS, ModelError, check_fqn, refusal, short_error

if TYPE_CHECKING:
    pass


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
        raise refusal(where, "not a payload config {config: {...}}")
    for fqn, meta in config["config"].items():
        at = f"{where} at {fqn}"
        check_fqn(fqn, at)
        if not isinstance(meta, dict) or set(meta) - {"path_name", "is_param", "use_pickle", "tensor_meta"}:
            raise refusal(at, "not a payload entry")
        path_name = meta.get("path_name")
        if meta.get("use_pickle") is not False or not isinstance(path_name, str) or not re.fullmatch(
                r"(weight|tensor)_\d{1,9}", path_name, re.ASCII):
            raise refusal(at, f"{fqn!r} is stored as a pickled or custom object")
        if path_name not in record_sizes:
            raise refusal(at, f"its record {path_name!r} is not in the archive")
        tensor = meta.get("tensor_meta")
        if not isinstance(tensor, dict):
            raise refusal(at, "no tensor_meta")
        dtype = _SERIALIZE_TO_TORCH_DTYPE.get(tensor.get("dtype")) if type(tensor.get("dtype")) is int else None
        if dtype is None or tensor.get("layout") != Layout.Strided or not isinstance(tensor.get("device"), dict) or (
                tensor["device"].get("type") != "cpu"):
            raise refusal(at, "a tensor that is not a strided CPU tensor of a known dtype")
        try:
            sizes = [_as_int(s) for s in tensor["sizes"]]
            strides = [_as_int(s) for s in tensor["strides"]]
            offset = _as_int(tensor["storage_offset"])
        except (KeyError, TypeError, ValueError) as e:
            raise refusal(at, "sizes, strides and storage_offset must be plain non-negative integers") from e
        if len(sizes) != len(strides):
            raise refusal(at, f"{len(sizes)} sizes but {len(strides)} strides")
        record = record_sizes[path_name] // max(dtype.itemsize, 1)
        numel = math.prod(sizes)
        extent = 0 if numel == 0 else offset + 1 + sum((n - 1) * s for n, s in zip(sizes, strides))
        if extent > record:  # torch would allocate `sizes` zeros for an empty record
            raise refusal(at, f"a tensor of {numel} elements reaching element {extent} of a record of {record}")


def _as_int(value: Any) -> int:
    if not isinstance(value, dict) or set(value) != {"as_int"} or type(value["as_int"]) is not int or not (
            0 <= value["as_int"] <= MAX_INT):
        raise ValueError(f"not a plain integer: {value!r}")
    return value["as_int"]


# what `torch.save` of tensors and containers of them pickles (protocol 2: GLOBAL opcodes)
_PICKLE_GLOBALS = re.compile(r"torch\._utils _rebuild_tensor_v2|torch\._utils _rebuild_parameter|"
                             r"torch [A-Za-z0-9]{1,20}Storage|collections OrderedDict|torch device", re.ASCII)


_PICKLE_OPS = frozenset({"INST", "OBJ", "STACK_GLOBAL", "EXT1", "EXT2", "EXT4", "NEWOBJ_EX"})


MAX_PICKLE_BYTES = 16 << 20


def check_sample_inputs(data: bytes, where: str = SAMPLE_INPUTS) -> None:
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
            raise refusal(where, "not a torch.save file of tensors (one data.pkl)")
        if pickles[0].file_size > MAX_PICKLE_BYTES:  # tensors' bytes are records of their own: the pickle is small
            raise refusal(where, f"a pickle of {pickles[0].file_size} bytes, more than {MAX_PICKLE_BYTES}")
        with inner.open(pickles[0]) as f:
            code = f.read()
        for op, arg, _pos in pickletools.genops(code):
            if op.name in _PICKLE_OPS or (op.name == "GLOBAL" and not _PICKLE_GLOBALS.fullmatch(str(arg))):
                raise refusal(where, f"holds more than tensors (the pickle asks for {op.name} "
                                     f"{short_error(repr(arg), 80)})")
    except ModelError:
        raise
    except Exception as e:  # a damaged zip or pickle: refused the same way
        raise refusal(where, f"holds more than tensors or is damaged ({short_error(e, 100)})") from e
