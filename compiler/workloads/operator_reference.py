"""The torch reference of a catalog workload (`Workload.reference`): the ground truth every candidate is
checked against, each operator as `torch.nn.functional` computes it, with the epilogue in numpy.

Layering: numpy and torch at the top (only the check of a candidate needs them); `compiler` never imports
`tuner` or `service`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .operators import OPERATORS
from .spec import REQUANTIZE, TensorSpec


def _conv2d_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    groups = p.get("groups", 1)
    return F.conv2d(x, w, stride=p["stride"], padding=p["padding"], dilation=p["dilation"], groups=groups)


def _depthwise_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    groups = p["channels"]
    return F.conv2d(x, w, stride=p["stride"], padding=p["padding"], dilation=p["dilation"], groups=groups)


def _conv1d_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    return F.conv1d(x, w, stride=p["stride"], padding=p["padding"], dilation=p["dilation"])


def _conv3d_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    return F.conv3d(x, w, stride=p["stride"], padding=p["padding"], dilation=p["dilation"])


def _transpose_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    return F.conv_transpose2d(
        x, w, stride=p["stride"], padding=p["padding"], output_padding=p["output_padding"], groups=p["groups"]
    )


def _dense_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    return F.linear(x, w)


def _bmm_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    return torch.bmm(x, w)


# operator -> (params, data, weight) -> the output as a torch tensor
REFERENCES: dict[str, Callable[[dict[str, int], Any, Any], Any]] = {
    "conv2d": _conv2d_ref,
    "group_conv2d": _conv2d_ref,
    "dilated_conv2d": _conv2d_ref,
    "depthwise_conv2d": _depthwise_ref,
    "conv1d": _conv1d_ref,
    "conv3d": _conv3d_ref,
    "conv2d_transpose": _transpose_ref,
    "dense": _dense_ref,
    "batch_matmul": _bmm_ref,
}
assert set(REFERENCES) == set(OPERATORS), f"{sorted(REFERENCES)=} != {sorted(OPERATORS)=}"


def reference(operator: str, params: dict[str, int], dtype: str, epilogue: str, specs: tuple[TensorSpec, ...],
              output: TensorSpec, bias_axis: int, inputs: list[np.ndarray]) -> np.ndarray:
    """Computes a catalog workload (`Workload.reference`) with torch: the ground truth every candidate is
    checked against.

    Args:
        operator, params, dtype, epilogue: the workload's.
        specs: its inputs, `output`: its output; `bias_axis`: the output's channel axis.
        inputs: arrays in the shapes and order of `specs`.

    Returns:
        The output as a numpy array of `output.shape`.
    """
    assert len(inputs) == len(specs), f"{len(inputs)=} != {len(specs)=}"
    for array, spec in zip(inputs, specs):
        assert tuple(array.shape) == spec.shape, f"{spec.name}: {array.shape=} != {spec.shape=}"
    # int8: float64 holds every sum of u8 x s8 products below 2**53 exactly (the result is rounded back
    # to int32 below); bf16: its values widen to fp32 exactly, and fp32 is what our program accumulates in
    wide = {"float32": np.float32, "int8": np.float64, "bfloat16": np.float32}[dtype]
    with torch.no_grad():
        x, w, *rest = (torch.from_numpy(np.asarray(a).astype(wide)) for a in inputs)
        y = REFERENCES[operator](params, x, w)
        view = [1] * y.dim()
        view[bias_axis] = -1
        if epilogue.startswith("bias"):
            y = y + rest[0].reshape(view)
        if "relu" in epilogue:
            y = torch.relu(y)
    out = y.numpy()
    if dtype == "int8":
        out = np.rint(out).astype(np.int32)
    if epilogue in REQUANTIZE:  # in float32, operation by operation as the program does: exact
        scale, zero_point = (np.asarray(a).reshape(view) for a in inputs[-2:])
        q = np.rint(out.astype(np.float32) * scale.astype(np.float32)) + zero_point.astype(np.float32)
        out = np.clip(q, np.float32(0), np.float32(255)).astype(np.uint8)
    assert out.shape == output.shape, f"{out.shape=} != {output.shape=}"
    return out
