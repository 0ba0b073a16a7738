"""An operator as torch runs it: the factory of `bench.ops`' torch programs (`torch_operator`), torch's output of a
workload, and torch.ao's quantized operator for a requantizing int8 one.

`torch_operator` runs in the child that times its program (`bench.common.time_fresh`, `bench.timing_torch`). It
makes the workload's constants (every input but `compiler.layout.program.ACTIVATIONS`) module parameters; that name
brings TVM into an operator's torch child (as before this module was split off) until it lives in the TVM-free
catalog (`compiler.workloads`). The whole models' and subgraphs' factories (`bench.torch_programs`) load no TVM.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from compiler.layout.program import ACTIVATIONS
from compiler.workloads import REQUANTIZE, Workload, make_workload


def _torch_op(workload: Workload) -> Callable[[list[Any]], Any]:
    """The torch call computing `workload` (the operator and its epilogue) on torch tensors."""
    p, op = workload.params, workload.operator
    conv_kw = lambda: dict(stride=p["stride"], padding=p["padding"], dilation=p["dilation"])  # noqa: E731
    if op in ("conv2d", "dilated_conv2d", "group_conv2d"):
        main = lambda x, w: F.conv2d(x, w, groups=p.get("groups", 1), **conv_kw())  # noqa: E731
    elif op == "depthwise_conv2d":
        main = lambda x, w: F.conv2d(x, w, groups=p["channels"], **conv_kw())  # noqa: E731
    elif op == "conv1d":
        main = lambda x, w: F.conv1d(x, w, **conv_kw())  # noqa: E731
    elif op == "conv3d":
        main = lambda x, w: F.conv3d(x, w, **conv_kw())  # noqa: E731
    elif op == "conv2d_transpose":
        main = lambda x, w: F.conv_transpose2d(  # noqa: E731
            x, w, stride=p["stride"], padding=p["padding"], output_padding=p["output_padding"], groups=p["groups"]
        )
    elif op == "dense":
        main = F.linear
    elif op == "batch_matmul":
        main = torch.bmm
    else:
        raise ValueError(f"no torch baseline for operator: {op}")
    bias_axis = 2 if op == "batch_matmul" else 1
    ndim = len(workload.output.shape)
    view = [1] * ndim
    view[bias_axis] = -1
    has_bias = workload.epilogue.startswith("bias")
    has_relu = "relu" in workload.epilogue

    def run(tensors: list[Any]) -> Any:
        y = main(tensors[0], tensors[1])
        if has_bias:
            y = y + tensors[2].reshape(view)
        if has_relu:
            y = torch.relu(y)
        return y

    return run


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def torch_output(workload: Workload, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """What `torch_latency` computes, as numpy (to check it against `workload.reference`)."""
    with torch.inference_mode():
        return _torch_op(workload)([torch.from_numpy(a) for a in inputs]).numpy()


def torch_operator(operator: str, params: dict, dtype: str = "float32", epilogue: str = "none",
                   seed: int = 0) -> tuple[Any, list[Any]]:
    """`bench.common.TorchProgram` factory: the workload as an `nn.Module` in eval mode whose constants (weight,
    bias) are parameters, and its activation inputs; the arrays of `Workload.random_inputs(seed)`. A bfloat16
    workload runs torch's own bfloat16 operator (oneDNN; its output rounded to bfloat16 where ours stays fp32);
    a requantizing int8 conv2d or dense runs torch.ao's quantized operator (`_torch_quantized`).

    Raises:
        ValueError: an int8 workload torch has no operator for: the int32 output (eager torch has no uint8 x
            int8 -> int32 convolution or matmul), a requantizing batch_matmul.
    """
    workload = make_workload(operator, params, dtype, epilogue)
    if dtype == "int8" and epilogue in REQUANTIZE and operator in ("conv2d", "dense"):
        return _torch_quantized(workload, workload.random_inputs(seed))
    if dtype == "int8":
        raise ValueError("torch has no uint8 x int8 operator with an int32 output (bench.tensorize times "
                         "torch._int_mm's int8 x int8 GEMM instead), and no quantized batch_matmul; torch.ao's "
                         "quantized conv2d and linear are the baseline of the requantizing conv2d and dense")
    op = _torch_op(workload)
    arrays = workload.random_inputs(seed)
    constant = [s.name not in ACTIVATIONS for s in workload.inputs]

    def tensor(a: Any) -> Any:
        if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16, which torch.from_numpy does not take
            return torch.from_numpy(a.astype("float32")).to(torch.bfloat16)
        return torch.from_numpy(a)

    class Operator(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.constants = torch.nn.ParameterList(
                [torch.nn.Parameter(tensor(a), requires_grad=False) for a, c in zip(arrays, constant) if c])

        def forward(self, *activations: Any) -> Any:
            given, kept = iter(activations), iter(self.constants)
            return op([next(kept) if c else next(given) for c in constant])

    activations = [tensor(a) for a, c in zip(arrays, constant) if not c]
    return Operator().eval(), activations


def _torch_quantized(workload: Workload, arrays: list[np.ndarray]) -> tuple[Any, list[Any]]:
    """torch.ao's quantized conv2d or linear (the x86 engine's: FBGEMM / oneDNN, per-channel int8 weights
    prepacked once) as the module of a requantizing int8 workload, and its uint8 input as a quantized tensor.

    torch's requantization multiplier is `input_scale * weight_scale[c] / output_scale`: with input and output
    scales of 1, the workload's `scale[c]` is the weight's. Its bias is float32, quantized by that product back
    to the int32 bias. The output zero point is per tensor in torch: the first channel's stands for all (the
    same work; the outputs of the other channels then differ, so this program is timed, not checked).
    """
    torch.backends.quantized.engine = "x86"
    p = workload.params
    x, w, *rest = arrays
    scale = rest[-2].astype(np.float64)
    bias = torch.from_numpy((rest[0] * scale).astype(np.float32)) if workload.epilogue.startswith("bias") else None
    channels = len(scale)
    qw = torch._make_per_channel_quantized_tensor(torch.from_numpy(w), torch.from_numpy(scale),
                                                  torch.zeros(channels, dtype=torch.long), 0)
    relu = "relu" in workload.epilogue
    if workload.operator == "conv2d":
        packed = torch.ops.quantized.conv2d_prepack(qw, bias, [p["stride"]] * 2, [p["padding"]] * 2,
                                                    [p["dilation"]] * 2, 1)
        op = torch.ops.quantized.conv2d_relu if relu else torch.ops.quantized.conv2d
    else:
        packed = torch.ops.quantized.linear_prepack(qw, bias)
        op = torch.ops.quantized.linear_relu if relu else torch.ops.quantized.linear
    zero_point = int(rest[-1][0])

    class Quantized(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.packed = packed

        def forward(self, qx: Any) -> Any:
            return op(qx, self.packed, 1.0, zero_point)

    qx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(x), 1.0, 0)
    return Quantized().eval(), [qx]
