"""The words of the operator catalog, free of TVM, numpy and torch: element types, epilogues, the limits, a
parameter, an operator's entry, a tensor's spec, the error a bad workload raises, and the content key.

`compiler.workloads.operators` and `compiler.workloads.subgraphs` define their workloads in these words.

Layering: imports nothing of altune; `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# the int32 epilogues; int8 also takes each followed by requantization to uint8 ("none" -> "requantize")
_INT_EPILOGUES = ("none", "bias", "relu", "bias_relu")
REQUANTIZE = ("requantize", "bias_requantize", "relu_requantize", "bias_relu_requantize")
EPILOGUES = _INT_EPILOGUES + REQUANTIZE
DTYPES = ("float32", "int8", "bfloat16")
# job dtype -> (data, weight, output and bias) element types: the operands and the accumulator
STORAGE: dict[str, tuple[str, str, str]] = {
    "float32": ("float32", "float32", "float32"),
    "int8": ("uint8", "int8", "int32"),
    "bfloat16": ("bfloat16", "bfloat16", "float32"),
}
# the longest int8 reduction whose int32 sums cannot overflow: 255 * 128 * n <= 2**31 - 1
INT8_MAX_REDUCTION = (2**31 - 1) // (255 * 128)
DEFAULT_MAX_TENSOR_ELEMENTS = 2**28


class WorkloadError(ValueError):
    """Bad user input for a workload; `field` names the offending part ("params.kernel")."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Param:
    """One integer parameter of an operator; `default` None means required."""

    name: str
    minimum: int
    maximum: int
    default: int | None
    description: str


@dataclass(frozen=True)
class OperatorDef:
    """A catalog entry: the operator's name, a one-line description and its parameters."""

    name: str
    description: str
    params: tuple[Param, ...]
    dtypes: tuple[str, ...] = ("float32",)  # the element types it takes (see the module docstring)


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one argument of the compiled function."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


def workload_key(operator: str, params: dict[str, int], dtype: str, epilogue: str) -> str:
    """The canonical content key of a normalized workload.

    Args:
        operator: the operator name.
        params: normalized parameters (as returned by `validate`).
        dtype: element type.
        epilogue: epilogue name.

    Returns:
        e.g. "conv2d[batch=1,dilation=1,...,width=56]:float32:none".
    """
    body = ",".join(f"{k}={params[k]}" for k in sorted(params))
    return f"{operator}[{body}]:{dtype}:{epilogue}"
