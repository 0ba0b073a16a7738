"""The words of the .pt2 loader's checks: `ModelError`, the archive's member names, the classes of strings
(Python names, attribute paths, shape symbols, aten names, ...) and the checks of a name, a path and a JSON
text every other check uses. See `compiler.workloads.pt2` for where each string goes in torch.

Layering: imports nothing from `compiler` but its own package; torch is imported inside the functions that
load or inspect a program (see the comment at each).
"""

from __future__ import annotations

import json
import keyword
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


MAX_EXPRESSION_CHARS = 10_000


class ModelError(ValueError):
    """A model that cannot be imported, with the field to blame ("file", "model", "input_shapes", "layout").

    str() is "field: message", as `WorkloadError`.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def refusal(where: str, message: str) -> ModelError:
    return ModelError("file", f"{where}: {message}; refused")


def short_error(e: BaseException | str, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text[:limit] + ("..." if len(text) > limit else "")


MODEL_JSON = "models/model.json"


WEIGHTS_CONFIG = "data/weights/model_weights_config.json"


CONSTANTS_CONFIG = "data/constants/model_constants_config.json"


SAMPLE_INPUTS = "data/sample_inputs/model.pt"


# A Python name: an ASCII identifier not starting with "__". Node and tensor names (FX sets `node.name` to them
# unsanitized and writes them as variables), placeholder targets, forward's argument names and keyword-argument
# keys are written into the source FX generates as they are.
IDENT = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


# Printable ASCII that cannot close or escape a quoted Python literal, nor open an f-string field: no quote,
# backslash or brace ("\x20"-"\x7e" less " ' \ { }).
SAFE = r" !#-&(-\[\]-z|~"


# An attribute path (a parameter, buffer or constant name, a module path): parts joined by dots, each made of
# `SAFE` characters but the dot and not starting with "__". FX writes a part that is not an identifier as
# `getattr(m, "part")` (`torch.fx.graph._format_target`); `_assign_attr` gives each part to `setattr`.
PART = r"(?!__)[ !#-&(-\-/-\[\]-z|~]+"


FQN = re.compile(rf"{PART}(?:\.{PART})*", re.ASCII)


DOTTED = re.compile(r"(?!__)[A-Za-z_]\w*(?:\.(?!__)[A-Za-z_]\w*)*", re.ASCII)  # module.qualname, torch.nn.X


SYMBOL = re.compile(r"[a-z]{1,8}\d{1,6}", re.ASCII)  # s77, u0: torch's shape symbols


ATEN = re.compile(r"torch\.ops\.aten\.(?!__)[A-Za-z_]\w*\.(?!__)[A-Za-z_]\w*", re.ASCII)


# how torch's serializer writes a float that JSON has no number for (`_dataclass_to_dict`); `float()` reads them
FLOAT_WORDS = frozenset({"Infinity", "-Infinity", "NaN"})


DENIED_OPS = frozenset({"from_file"})  # aten operators that reach outside the tensors they are given


# the (de)quantization operators of a PT2E-quantized program (`torchao`'s `convert_pt2e`): pure arithmetic on the
# tensors they are given, registered by `torch.ao.quantization.fx._decomposed` (imported before the load)
QUANTIZED_OPS = frozenset(f"torch.ops.quantized_decomposed.{op}.{overload}"
                          for op in ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel",
                                     "dequantize_per_channel")
                          for overload in ("default", "tensor"))


VERIFIERS = frozenset({"", "ATEN", "TRAINING"})


TREESPEC_TYPES = frozenset({"builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict",
                             "collections.namedtuple"})


MAX_INT = 1 << 64


MAX_NAME = 1024


GUARD_KEY = re.compile(rf"[{SAFE}]{{1,{MAX_NAME}}}", re.ASCII)  # L['x'], L['batch']['aux-input']


def json_path(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "the top"


def check_ident(value: Any, at: str, what: str = "a name") -> None:
    if not isinstance(value, str) or len(value) > MAX_NAME or not IDENT.fullmatch(value):
        raise refusal(at, f"{short_error(repr(value), 120)} as {what}: not a Python identifier (names become "
                          "Python source)")


def check_python_names(value: Any, at: str, what: str) -> None:
    """Names FX writes as parameters of the `forward` it generates: identifiers that are not keywords."""
    for name in value if isinstance(value, list) else [value]:
        check_ident(name, at, what)
        if keyword.iskeyword(name):
            raise refusal(at, f"{name!r} as {what}: a Python keyword")


def check_fqn(value: Any, at: str, *, root: bool = False) -> None:
    if root and value == "":
        return
    if not isinstance(value, str) or len(value) > MAX_NAME or not FQN.fullmatch(value):
        raise refusal(at, f"{short_error(repr(value), 120)} is not an attribute path (parts joined by dots, each "
                          "printable ASCII without quotes, backslashes or braces, none starting with '__'; "
                          "FX writes them into Python source)")


def parse_json(data: bytes, where: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise refusal(where, f"not JSON ({short_error(e, 100)})") from e


def check_namedtuple_name(value: Any, at: str) -> None:
    """A namedtuple's serialized type name: a key torch looks up (`_namedtuple_deserialize`), and the loader
    replaces it with a stand-in's before torch sees it (`_namedtuple_stand_ins`)."""
    if not isinstance(value, str) or not 0 < len(value) <= 256 or not value.isprintable():
        raise refusal(at, f"namedtuple type {short_error(repr(value), 80)} is not a printable name up to 256 "
                          "characters")
