"""The operator catalog: each operator's parameters (`OPERATORS`), the checks they must pass and the shapes
they make. Pure Python: `compiler.workloads.catalog.validate` and `make_workload` use it to check a job spec
and key its workload without TVM, numpy or torch.

One job per module beside it: `operator_programs` (each operator's TE program, TVM), `operator_inputs`
(random inputs, numpy), `operator_reference` (the torch reference), `workload` (`Workload`), `catalog`
(`validate`, `make_workload`); the subgraphs of several operators are `subgraphs`.

Layouts are PyTorch's: activations NCHW (NCW, NCDHW), weights OIHW (OIW, OIDHW),
transposed-convolution weights (in_channels, out_channels / groups, kh, kw), dense
weights (N, K) as in `torch.nn.functional.linear`, batch_matmul operands
(B, M, K) x (B, K, N) as in `torch.bmm`. Kernels are square (cubic) and stride,
padding and dilation are the same along every spatial axis.

Element types (`DTYPES`; the operators that take each: `OperatorDef.dtypes`, checked by `validate`):

- "float32": every operator; inputs, bias and output fp32.
- "int8" (conv2d, dense, batch_matmul): uint8 activations x int8 weights, int32 accumulation and an int32
  bias. u8 x s8 is the form x86's dot-product instructions take (VNNI `vpdpbusd`, `vpmaddwd` on pairs) and
  what oneDNN, FBGEMM and TVM's QNN use for quantized convolutions and GEMMs. The output is either
  - the **int32 accumulator** (epilogues none, bias, relu, bias_relu), for a user whose framework requantizes
    it separately, or
  - **requantized to uint8** (the `..._requantize` epilogues, `REQUANTIZE`): two more constant inputs, a
    float32 `scale` and an int32 `zero_point` per output channel, and the output
    `clip(nearbyint(float32(acc) * scale[c]) + zero_point[c], 0, 255)` as uint8, after the bias and ReLU in
    int32. That is FBGEMM's requantization (`torch.ao`'s quantized conv/linear on x86): `scale` is the
    combined multiplier `input_scale * weight_scale[c] / output_scale`, rounded half to even; a per-tensor
    quantization repeats its one scale and zero point.
  Every uint8 and int8 value is allowed: `vpmaddubsw`, which saturates on activations >= 128, is never used
  for catalog programs (their dot products are VNNI's or `vpmaddwd`'s, which are exact); the reduction
  length is limited so the int32 accumulator cannot overflow (`INT8_MAX_REDUCTION`). The reference computes
  the sums in float64 (exact) and requantizes in float32 as the program does, so it is exact too.
- "bfloat16" (conv2d, dense, batch_matmul): bfloat16 data and weight, fp32 accumulation, **float32 output**
  and bias (the accumulator, not rounded back to bf16; a bf16 consumer rounds it once itself). The reference
  widens the bf16 values to fp32 (exactly) and the check has the fp32 tolerance of `compiler.arrays`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .spec import (  # re-exported (`__all__`): callers have always found the catalog's words here
    DEFAULT_MAX_TENSOR_ELEMENTS,
    DTYPES,
    EPILOGUES,
    INT8_MAX_REDUCTION,
    REQUANTIZE,
    STORAGE,
    OperatorDef,
    Param,
    TensorSpec,
    WorkloadError,
    workload_key,
)

__all__ = ["DEFAULT_MAX_TENSOR_ELEMENTS", "DTYPES", "EPILOGUES", "INT8_MAX_REDUCTION", "OPERATORS", "REQUANTIZE",
           "STORAGE", "OperatorDef", "Param", "Shapes", "TensorSpec", "WorkloadError", "check", "shapes",
           "transpose_out", "workload_key"]

# Parameter ranges are sanity bounds; the real guard against huge workloads is
# `max_tensor_elements`, checked on every tensor after the shapes are known.
_MAX_DIM = 1 << 20


def _batch() -> Param:
    return Param("batch", 1, 4096, None, "batch size N")


def _channels(name: str, what: str) -> Param:
    return Param(name, 1, 65536, None, what)


def _spatial(name: str) -> Param:
    return Param(name, 1, 16384, None, f"input {name}")


def _kernel(what: str = "kernel size (square)") -> Param:
    return Param("kernel", 1, 64, None, what)


def _stride() -> Param:
    return Param("stride", 1, 16, 1, "stride along every spatial axis")


def _padding() -> Param:
    return Param("padding", 0, 64, 0, "zero padding on both sides of every spatial axis")


def _dilation(default: int) -> Param:
    return Param("dilation", 1, 16, default, "kernel dilation along every spatial axis")


def _conv2d_params(dilation_default: int, groups_default: int | None = 1) -> tuple[Param, ...]:
    params = [
        _batch(),
        _channels("in_channels", "input channels C"),
        _spatial("height"),
        _spatial("width"),
        _channels("out_channels", "output channels (filters)"),
        _kernel(),
        _stride(),
        _padding(),
        _dilation(dilation_default),
    ]
    if groups_default is None:
        params.append(Param("groups", 1, 65536, None, "number of channel groups"))
    return tuple(params)


OPERATORS: dict[str, OperatorDef] = {
    op.name: op
    for op in (
        OperatorDef(
            "conv2d",
            "2-D convolution, NCHW input x OIHW weight",
            _conv2d_params(dilation_default=1),
            DTYPES,
        ),
        OperatorDef(
            "depthwise_conv2d",
            "depthwise 2-D convolution (one filter per channel), NCHW x (C,1,kh,kw)",
            (
                _batch(),
                _channels("channels", "input and output channels C"),
                _spatial("height"),
                _spatial("width"),
                _kernel(),
                _stride(),
                _padding(),
                _dilation(1),
            ),
        ),
        OperatorDef(
            "group_conv2d",
            "grouped 2-D convolution, NCHW x (O, I/groups, kh, kw)",
            _conv2d_params(dilation_default=1, groups_default=None),
        ),
        OperatorDef(
            "dilated_conv2d",
            "dilated (atrous) 2-D convolution, NCHW x OIHW, dilation 2 unless given",
            _conv2d_params(dilation_default=2),
        ),
        OperatorDef(
            "conv1d",
            "1-D convolution, NCW input x OIW weight",
            (
                _batch(),
                _channels("in_channels", "input channels C"),
                _spatial("width"),
                _channels("out_channels", "output channels (filters)"),
                _kernel("kernel size"),
                _stride(),
                _padding(),
                _dilation(1),
            ),
        ),
        OperatorDef(
            "conv3d",
            "3-D convolution, NCDHW input x OIDHW weight",
            (
                _batch(),
                _channels("in_channels", "input channels C"),
                _spatial("depth"),
                _spatial("height"),
                _spatial("width"),
                _channels("out_channels", "output channels (filters)"),
                _kernel("kernel size (cubic)"),
                _stride(),
                _padding(),
                _dilation(1),
            ),
        ),
        OperatorDef(
            "conv2d_transpose",
            "transposed 2-D convolution, NCHW x (I, O/groups, kh, kw) as torch",
            (
                _batch(),
                _channels("in_channels", "input channels C"),
                _spatial("height"),
                _spatial("width"),
                _channels("out_channels", "output channels"),
                _kernel(),
                _stride(),
                Param("padding", 0, 64, 0, "implicit padding removed from both sides (torch's)"),
                Param("output_padding", 0, 15, 0, "extra rows/columns added at the end"),
                Param("groups", 1, 65536, 1, "number of channel groups"),
            ),
        ),
        OperatorDef(
            "dense",
            "GEMM out[M,N] = data[M,K] x weight[N,K]^T (torch linear)",
            (
                Param("m", 1, _MAX_DIM, None, "rows of data and output (M)"),
                Param("n", 1, _MAX_DIM, None, "rows of weight, columns of output (N)"),
                Param("k", 1, _MAX_DIM, None, "reduction length (K)"),
            ),
            DTYPES,
        ),
        OperatorDef(
            "batch_matmul",
            "batched GEMM out[B,M,N] = data[B,M,K] x weight[B,K,N] (torch bmm)",
            (
                Param("batch", 1, 65536, None, "batch size B"),
                Param("m", 1, _MAX_DIM, None, "rows of data and output (M)"),
                Param("n", 1, _MAX_DIM, None, "columns of weight and output (N)"),
                Param("k", 1, _MAX_DIM, None, "reduction length (K)"),
            ),
            DTYPES,
        ),
    )
}


def _conv_out(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _check_conv_window(p: dict[str, int], axes: tuple[str, ...]) -> None:
    """Reject a dilated kernel that does not fit the padded input (output size <= 0)."""
    span = p["dilation"] * (p["kernel"] - 1) + 1
    for axis in axes:
        padded = p[axis] + 2 * p["padding"]
        if span > padded:
            raise WorkloadError(
                "params.kernel",
                f"dilated kernel extent {span} (kernel {p['kernel']}, dilation {p['dilation']}) "
                f"is larger than the padded input {axis} {padded} "
                f"({axis} {p[axis]} + 2 * padding {p['padding']}): the output would be empty",
            )


def _check_groups(p: dict[str, int], in_key: str = "in_channels", out_key: str = "out_channels") -> None:
    groups = p.get("groups", 1)
    for key in (in_key, out_key):
        if p[key] % groups:
            raise WorkloadError(f"params.{key}", f"{key}={p[key]} is not divisible by groups={groups}")


@dataclass(frozen=True)
class Shapes:
    """The operand and output shapes of one operator instance, the output's channel axis, its multiply-adds."""

    data: tuple[int, ...]
    weight: tuple[int, ...]
    output: tuple[int, ...]
    bias_axis: int  # output axis the per-channel bias runs along
    macs: int


@dataclass(frozen=True)
class _Impl:
    check: Callable[[dict[str, int]], None]  # raises WorkloadError where the parameters do not make an operator
    shapes: Callable[[dict[str, int]], Shapes]


def _convnd_shapes(p: dict[str, int], axes: tuple[str, ...]) -> Shapes:
    groups = p.get("groups", 1)
    k = p["kernel"]
    spatial_out = tuple(_conv_out(p[a], k, p["stride"], p["padding"], p["dilation"]) for a in axes)
    output = (p["batch"], p["out_channels"], *spatial_out)
    weight = (p["out_channels"], p["in_channels"] // groups, *(k,) * len(axes))
    macs = math.prod(output) * (p["in_channels"] // groups) * k ** len(axes)
    return Shapes((p["batch"], p["in_channels"], *(p[a] for a in axes)), weight, output, 1, macs)


def _convnd_check(axes: tuple[str, ...]) -> Callable[[dict[str, int]], None]:
    def check(p: dict[str, int]) -> None:
        _check_groups(p)
        _check_conv_window(p, axes)

    return check


_AXES_2D = ("height", "width")


_CONV2D = _Impl(check=_convnd_check(_AXES_2D), shapes=lambda p: _convnd_shapes(p, _AXES_2D))


def _depthwise_check(p: dict[str, int]) -> None:
    _check_conv_window(p, _AXES_2D)


def _depthwise_shapes(p: dict[str, int]) -> Shapes:
    c, k = p["channels"], p["kernel"]
    spatial_out = tuple(_conv_out(p[a], k, p["stride"], p["padding"], p["dilation"]) for a in _AXES_2D)
    output = (p["batch"], c, *spatial_out)
    # (C, 1, kh, kw) is torch's depthwise weight and topi's (C, multiplier=1, kh, kw) alike.
    data = (p["batch"], c, p["height"], p["width"])
    return Shapes(data, (c, 1, k, k), output, 1, math.prod(output) * k * k)


_AXES_1D = ("width",)


_AXES_3D = ("depth", "height", "width")


def transpose_out(p: dict[str, int], axis: str) -> int:
    return (p[axis] - 1) * p["stride"] - 2 * p["padding"] + p["kernel"] + p["output_padding"]


def _transpose_check(p: dict[str, int]) -> None:
    _check_groups(p)
    if p["output_padding"] >= p["stride"]:
        # torch's rule (without dilation): otherwise output rows would have no input at all
        raise WorkloadError(
            "params.output_padding",
            f"output_padding={p['output_padding']} must be smaller than stride={p['stride']}",
        )
    for axis in _AXES_2D:
        if transpose_out(p, axis) <= 0:
            raise WorkloadError(
                "params.padding",
                f"output {axis} would be {transpose_out(p, axis)}: padding={p['padding']} too large",
            )


def _transpose_shapes(p: dict[str, int]) -> Shapes:
    g, k = p["groups"], p["kernel"]
    output = (p["batch"], p["out_channels"], transpose_out(p, "height"), transpose_out(p, "width"))
    weight = (p["in_channels"], p["out_channels"] // g, k, k)
    # Useful multiply-adds (every input element times its filter slice), not the
    # zeros that the dilated-input formulation also multiplies.
    macs = p["batch"] * p["in_channels"] * p["height"] * p["width"] * (p["out_channels"] // g) * k * k
    return Shapes((p["batch"], p["in_channels"], p["height"], p["width"]), weight, output, 1, macs)


def _no_check(p: dict[str, int]) -> None:
    del p


def _dense_shapes(p: dict[str, int]) -> Shapes:
    m, n, k = p["m"], p["n"], p["k"]
    return Shapes((m, k), (n, k), (m, n), 1, m * n * k)


def _bmm_shapes(p: dict[str, int]) -> Shapes:
    b, m, n, k = p["batch"], p["m"], p["n"], p["k"]
    return Shapes((b, m, k), (b, k, n), (b, m, n), 2, b * m * n * k)


_IMPLS: dict[str, _Impl] = {
    "conv2d": _CONV2D,
    "group_conv2d": _CONV2D,
    "dilated_conv2d": _CONV2D,
    "depthwise_conv2d": _Impl(_depthwise_check, _depthwise_shapes),
    "conv1d": _Impl(_convnd_check(_AXES_1D), lambda p: _convnd_shapes(p, _AXES_1D)),
    "conv3d": _Impl(_convnd_check(_AXES_3D), lambda p: _convnd_shapes(p, _AXES_3D)),
    "conv2d_transpose": _Impl(_transpose_check, _transpose_shapes),
    "dense": _Impl(_no_check, _dense_shapes),
    "batch_matmul": _Impl(_no_check, _bmm_shapes),
}


def check(operator: str, params: dict[str, int]) -> None:
    """Raises WorkloadError where normalized `params` do not make an instance of catalog operator `operator`."""
    _IMPLS[operator].check(params)


def shapes(operator: str, params: dict[str, int]) -> Shapes:
    """The shapes of catalog operator `operator` with normalized `params`."""
    return _IMPLS[operator].shapes(params)

