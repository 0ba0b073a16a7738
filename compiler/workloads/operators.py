"""The operator catalog: each operator as a TE definition, validated from user parameters.

Layering: `compiler` never imports `tuner` or `service`. TVM, numpy and torch are
imported inside functions so that `service` can validate a job spec (and compute
its workload key) without loading them: `validate()` and `make_workload()` are
pure Python; `Workload.prim_func` builds the TE program on first use.

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

import functools
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import tvm

from .spec import (
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
from .subgraphs import SUBGRAPHS, make_subgraph, subgraph_shapes

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


# ---------------------------------------------------------------------------
# Per-operator shapes, checks, TE definitions and torch references.


def _out_dtype(data: Any) -> str | None:
    """The accumulator and output type of an operator reading `data` (None: topi's default, the input's)."""
    return {"uint8": "int32", "int8": "int32", "bfloat16": "float32"}.get(str(data.dtype))


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
class _Shapes:
    data: tuple[int, ...]
    weight: tuple[int, ...]
    output: tuple[int, ...]
    bias_axis: int  # output axis the per-channel bias runs along
    macs: int


@dataclass(frozen=True)
class _Impl:
    check: Callable[[dict[str, int]], None]
    shapes: Callable[[dict[str, int]], _Shapes]
    te_compute: Callable[[dict[str, int], Any, Any], Any]  # (params, data, weight) -> output tensor
    reference: Callable[[dict[str, int], Any, Any], Any]  # (params, data, weight) -> torch tensor
    topi_compute: Callable[[dict[str, int], Any, Any], Any] | None = None  # TVM's own, where ours differs


def _convnd_shapes(p: dict[str, int], axes: tuple[str, ...]) -> _Shapes:
    groups = p.get("groups", 1)
    k = p["kernel"]
    spatial_out = tuple(_conv_out(p[a], k, p["stride"], p["padding"], p["dilation"]) for a in axes)
    output = (p["batch"], p["out_channels"], *spatial_out)
    weight = (p["out_channels"], p["in_channels"] // groups, *(k,) * len(axes))
    macs = math.prod(output) * (p["in_channels"] // groups) * k ** len(axes)
    return _Shapes((p["batch"], p["in_channels"], *(p[a] for a in axes)), weight, output, 1, macs)


def _convnd_check(axes: tuple[str, ...]) -> Callable[[dict[str, int]], None]:
    def check(p: dict[str, int]) -> None:
        _check_groups(p)
        _check_conv_window(p, axes)

    return check


def _conv2d_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    from tvm import topi

    groups = p.get("groups", 1)
    if groups == 1:
        return topi.nn.conv2d_nchw(data, weight, p["stride"], p["padding"], p["dilation"], _out_dtype(data))
    return topi.nn.group_conv2d_nchw(data, weight, p["stride"], p["padding"], p["dilation"], groups)


def _conv2d_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    import torch.nn.functional as F

    groups = p.get("groups", 1)
    return F.conv2d(x, w, stride=p["stride"], padding=p["padding"], dilation=p["dilation"], groups=groups)


_AXES_2D = ("height", "width")
_CONV2D = _Impl(
    check=_convnd_check(_AXES_2D),
    shapes=lambda p: _convnd_shapes(p, _AXES_2D),
    te_compute=_conv2d_te,
    reference=_conv2d_ref,
)


def _depthwise_check(p: dict[str, int]) -> None:
    _check_conv_window(p, _AXES_2D)


def _depthwise_shapes(p: dict[str, int]) -> _Shapes:
    c, k = p["channels"], p["kernel"]
    spatial_out = tuple(_conv_out(p[a], k, p["stride"], p["padding"], p["dilation"]) for a in _AXES_2D)
    output = (p["batch"], c, *spatial_out)
    # (C, 1, kh, kw) is torch's depthwise weight and topi's (C, multiplier=1, kh, kw) alike.
    data = (p["batch"], c, p["height"], p["width"])
    return _Shapes(data, (c, 1, k, k), output, 1, math.prod(output) * k * k)


def _depthwise_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    from tvm import topi

    return topi.nn.depthwise_conv2d_nchw(data, weight, p["stride"], p["padding"], p["dilation"])


def _depthwise_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    import torch.nn.functional as F

    groups = p["channels"]
    return F.conv2d(x, w, stride=p["stride"], padding=p["padding"], dilation=p["dilation"], groups=groups)


_AXES_1D = ("width",)


def _conv1d_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    from tvm import topi

    return topi.nn.conv1d_ncw(data, weight, p["stride"], p["padding"], p["dilation"])


def _conv1d_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    import torch.nn.functional as F

    return F.conv1d(x, w, stride=p["stride"], padding=p["padding"], dilation=p["dilation"])


_AXES_3D = ("depth", "height", "width")


def _conv3d_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    from tvm import topi

    return topi.nn.conv3d_ncdhw(data, weight, p["stride"], p["padding"], p["dilation"], 1)


def _conv3d_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    import torch.nn.functional as F

    return F.conv3d(x, w, stride=p["stride"], padding=p["padding"], dilation=p["dilation"])


def _transpose_out(p: dict[str, int], axis: str) -> int:
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
        if _transpose_out(p, axis) <= 0:
            raise WorkloadError(
                "params.padding",
                f"output {axis} would be {_transpose_out(p, axis)}: padding={p['padding']} too large",
            )


def _transpose_shapes(p: dict[str, int]) -> _Shapes:
    g, k = p["groups"], p["kernel"]
    output = (p["batch"], p["out_channels"], _transpose_out(p, "height"), _transpose_out(p, "width"))
    weight = (p["in_channels"], p["out_channels"] // g, k, k)
    # Useful multiply-adds (every input element times its filter slice), not the
    # zeros that the dilated-input formulation also multiplies.
    macs = p["batch"] * p["in_channels"] * p["height"] * p["width"] * (p["out_channels"] // g) * k * k
    return _Shapes((p["batch"], p["in_channels"], p["height"], p["width"]), weight, output, 1, macs)


def _transpose_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    """Stride-phase form: each output row y takes only the kernel rows ky = (y + pad) % s + s*j, reading
    input row (y + pad) // s - j, so no multiply-add touches the zeros a dilated input would hold
    (topi's `conv2d_transpose` multiplies s*s times as many, most of them by zero)."""
    from tvm import te, tirx, topi

    s, pad, k, g = p["stride"], p["padding"], p["kernel"], p["groups"]
    n, in_c, h, w = (int(d) for d in data.shape)
    out_c, out_h, out_w = p["out_channels"], _transpose_out(p, "height"), _transpose_out(p, "width")
    in_g, out_g = in_c // g, out_c // g
    taps = -(-k // s)  # kernel rows per phase
    # input rows (y + pad) // s - j for j in [0, taps): `taps - 1` zero rows before, enough after
    low = taps - 1
    high = [max(0, (out - 1 + pad) // s - (size - 1)) for out, size in ((out_h, h), (out_w, w))]
    padded = topi.nn.pad(data, [0, 0, low, low], [0, 0, *high], name="pad_temp")
    zero = tirx.const(0, data.dtype)
    ic = te.reduce_axis((0, in_g), name="ic")
    jy = te.reduce_axis((0, taps), name="jy")
    jx = te.reduce_axis((0, taps), name="jx")

    def tap(b: Any, o: Any, y: Any, x: Any) -> Any:
        ky, kx = (y + pad) % s + s * jy, (x + pad) % s + s * jx
        value = padded[b, o // out_g * in_g + ic, (y + pad) // s - jy + low, (x + pad) // s - jx + low]
        value = value * weight[o // out_g * in_g + ic, o % out_g, ky, kx]
        if k % s == 0:  # every phase has `taps` kernel rows
            return value
        return tirx.if_then_else(tirx.all(ky < k, kx < k), value, zero)

    return te.compute(
        (n, out_c, out_h, out_w),
        lambda b, o, y, x: te.sum(tap(b, o, y, x), axis=[ic, jy, jx]),
        name="conv2d_transpose_nchw",
    )


def _transpose_topi_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    from tvm import topi

    if p["padding"] > p["kernel"] - 1:  # topi pads the dilated input by kernel - 1 - padding
        return _transpose_te(p, data, weight)
    opad = (p["output_padding"], p["output_padding"])
    stride = (p["stride"], p["stride"])
    return topi.nn.group_conv2d_transpose_nchw(
        data, weight, stride, p["padding"], data.dtype, opad, p["groups"]
    )


def _transpose_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    import torch.nn.functional as F

    return F.conv_transpose2d(
        x, w, stride=p["stride"], padding=p["padding"], output_padding=p["output_padding"], groups=p["groups"]
    )


def _no_check(p: dict[str, int]) -> None:
    del p


def _dense_shapes(p: dict[str, int]) -> _Shapes:
    m, n, k = p["m"], p["n"], p["k"]
    return _Shapes((m, k), (n, k), (m, n), 1, m * n * k)


def _dense_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    from tvm import topi

    return topi.nn.dense(data, weight, out_dtype=_out_dtype(data))


def _dense_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    import torch.nn.functional as F

    return F.linear(x, w)


def _bmm_shapes(p: dict[str, int]) -> _Shapes:
    b, m, n, k = p["batch"], p["m"], p["n"], p["k"]
    return _Shapes((b, m, k), (b, k, n), (b, m, n), 2, b * m * n * k)


def _bmm_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    from tvm import topi

    return topi.nn.batch_matmul(data, weight, transpose_a=False, transpose_b=False, out_dtype=_out_dtype(data))


def _bmm_ref(p: dict[str, int], x: Any, w: Any) -> Any:
    import torch

    return torch.bmm(x, w)


_IMPLS: dict[str, _Impl] = {
    "conv2d": _CONV2D,
    "group_conv2d": _CONV2D,
    "dilated_conv2d": _CONV2D,
    "depthwise_conv2d": _Impl(_depthwise_check, _depthwise_shapes, _depthwise_te, _depthwise_ref),
    "conv1d": _Impl(_convnd_check(_AXES_1D), lambda p: _convnd_shapes(p, _AXES_1D), _conv1d_te, _conv1d_ref),
    "conv3d": _Impl(_convnd_check(_AXES_3D), lambda p: _convnd_shapes(p, _AXES_3D), _conv3d_te, _conv3d_ref),
    "conv2d_transpose": _Impl(
        _transpose_check, _transpose_shapes, _transpose_te, _transpose_ref, topi_compute=_transpose_topi_te
    ),
    "dense": _Impl(_no_check, _dense_shapes, _dense_te, _dense_ref),
    "batch_matmul": _Impl(_no_check, _bmm_shapes, _bmm_te, _bmm_ref),
}
assert set(_IMPLS) == set(OPERATORS), f"{sorted(_IMPLS)=} != {sorted(OPERATORS)=}"


# ---------------------------------------------------------------------------
# Validation and the workload.


def validate(
    operator: str,
    params: dict,
    dtype: str = "float32",
    epilogue: str = "none",
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS,
) -> dict[str, int]:
    """Checks a workload description and fills in defaults.

    Args:
        operator: a name in `OPERATORS`.
        params: the operator's integer parameters; optional ones may be left out.
        dtype: element type, one of `DTYPES`.
        epilogue: one of `EPILOGUES`.
        max_tensor_elements: the largest number of elements any input or output may have.

    Returns:
        The normalized parameters: every parameter of the operator, in catalog order.

    Raises:
        WorkloadError: with `.field` naming what is wrong ("operator", "dtype",
            "epilogue", "params", "params.<name>").
    """
    catalog = {**OPERATORS, **SUBGRAPHS}
    op = catalog.get(operator) if isinstance(operator, str) else None
    if op is None:
        raise WorkloadError("operator", f"unknown operator {operator!r}; known: {', '.join(catalog)}")
    if dtype not in op.dtypes:
        takes = ", ".join(name for name, o in OPERATORS.items() if dtype in o.dtypes) if dtype in DTYPES else ""
        raise WorkloadError("dtype", f"unsupported dtype {dtype!r} for {operator}; supported for {operator}: "
                            f"{', '.join(op.dtypes)}" + (f" ({dtype} is supported for {takes})" if takes else
                                                         f"; known dtypes: {', '.join(DTYPES)}"))
    if epilogue not in EPILOGUES:
        raise WorkloadError("epilogue", f"unknown epilogue {epilogue!r}; known: {', '.join(EPILOGUES)}")
    if epilogue in REQUANTIZE and dtype != "int8":
        raise WorkloadError("epilogue", f"{epilogue!r} requantizes the int32 sums of an int8 operator to uint8; "
                            f"dtype {dtype!r} has none: use dtype 'int8', or epilogue "
                            f"{epilogue.removesuffix('requantize').rstrip('_') or 'none'!r}")
    if not isinstance(params, dict):
        raise WorkloadError("params", f"params must be an object of integers, got {type(params).__name__}")
    known = {p.name for p in op.params}
    for name in params:
        if name not in known:
            raise WorkloadError(
                f"params.{name}",
                f"unknown parameter {name!r} for {operator}; known: {', '.join(p.name for p in op.params)}",
            )
    normalized: dict[str, int] = {}
    for p in op.params:
        value = params.get(p.name, p.default)
        if value is None:
            raise WorkloadError(
                f"params.{p.name}", f"missing required parameter {p.name!r} ({p.description})"
            )
        # bool is an Integral in Python; a JSON true must not pass as 1
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise WorkloadError(f"params.{p.name}", f"{p.name} must be an integer, got {value!r}")
        value = int(value)
        if not p.minimum <= value <= p.maximum:
            raise WorkloadError(
                f"params.{p.name}", f"{p.name}={value} is out of range [{p.minimum}, {p.maximum}]"
            )
        normalized[p.name] = value
    if operator in SUBGRAPHS:
        tensors = subgraph_shapes(operator, normalized, epilogue)
    else:
        impl = _IMPLS[operator]
        impl.check(normalized)
        shapes = impl.shapes(normalized)
        tensors = [("data", shapes.data), ("weight", shapes.weight), ("output", shapes.output)]
        reduction = shapes.macs // math.prod(shapes.output)
        if dtype == "int8" and reduction > INT8_MAX_REDUCTION:
            raise WorkloadError("params", f"int8 {operator} sums {reduction} products per output, more than "
                                f"{INT8_MAX_REDUCTION}: its int32 accumulator could overflow")
    for role, shape in tensors:
        size = math.prod(shape)
        if size > max_tensor_elements:
            raise WorkloadError(
                "params",
                f"{role} tensor {'x'.join(map(str, shape))} has {size} elements, "
                f"more than the limit {max_tensor_elements}",
            )
    return normalized


@dataclass(frozen=True, eq=False)
class Workload:
    """One operator instance: shapes, a content key, the TE program and its torch reference.

    Equality and hashing follow `key`. `prim_func` is built on first access (it
    needs TVM), so a workload can be made and keyed where TVM is not loaded.
    """

    operator: str
    params: dict[str, int]
    dtype: str
    epilogue: str
    key: str
    inputs: tuple[TensorSpec, ...]  # data, weight, then bias, scale and zero_point (if any): the call order
    output: TensorSpec
    flops: int
    _bias_axis: int = field(repr=False, default=1)  # the output's channel axis (of bias, scale, zero_point)
    _reduction: int = field(repr=False, default=1)  # products summed into each output

    @property
    def requantizes(self) -> bool:
        """Whether the int32 sums are requantized to a uint8 output (the `REQUANTIZE` epilogues)."""
        return self.epilogue in REQUANTIZE

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workload) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def args(self) -> tuple[TensorSpec, ...]:
        """All arguments of `prim_func` in call order: inputs, then the output."""
        return (*self.inputs, self.output)

    def te_tensors(self, topi: bool = False) -> tuple[list[tvm.te.Tensor], tvm.te.Tensor]:
        """A fresh TE graph of the workload: its placeholders (in `inputs` order) and its output.

        The epilogue stages are separate ops named `bias_add`, `relu` and `requantize`. `topi`: the operator
        as TVM's topi defines it, where ours differs (see `topi_prim_func`).
        """
        from tvm import te, tirx

        placeholders = [te.placeholder(s.shape, s.dtype, name=s.name) for s in self.inputs]
        impl = _IMPLS[self.operator]
        compute = impl.topi_compute if topi and impl.topi_compute else impl.te_compute
        out = compute(self.params, placeholders[0], placeholders[1])
        assert tuple(int(d) for d in out.shape) == self.output.shape, (
            f"{self.operator}: TE output shape {tuple(out.shape)} != expected {self.output.shape}"
        )
        axis = self._bias_axis
        if self.epilogue.startswith("bias"):
            conv, bias = out, placeholders[2]
            out = te.compute(conv.shape, lambda *i: conv(*i) + bias[i[axis]], name="bias_add")
        if "relu" in self.epilogue:
            pre = out
            out = te.compute(pre.shape, lambda *i: tirx.max(pre(*i), tirx.const(0, pre.dtype)), name="relu")
        if self.requantizes:
            acc, scale, zero_point = out, placeholders[-2], placeholders[-1]

            def requantize(*i: Any) -> Any:
                c = i[axis]
                rounded = tirx.nearbyint(acc(*i).astype("float32") * scale[c])  # half to even, as np.rint
                q = rounded + zero_point[c].astype("float32")  # exact: clipped where it would not be
                return tirx.max(tirx.min(q, tirx.const(255.0, "float32")), tirx.const(0.0, "float32")).astype("uint8")

            out = te.compute(acc.shape, requantize, name="requantize")
        return placeholders, out

    @functools.cached_property
    def prim_func(self) -> tvm.tirx.PrimFunc:
        """The untransformed TIR program (global_symbol "main"), from `te.create_prim_func`."""
        from tvm import te

        placeholders, out = self.te_tensors()
        return te.create_prim_func([*placeholders, out]).with_attr("global_symbol", "main")

    @functools.cached_property
    def topi_prim_func(self) -> tvm.tirx.PrimFunc:
        """The program with the operator as TVM's topi defines it: what a TVM user would hand MetaSchedule.

        `prim_func` itself except for conv2d_transpose, where topi dilates the input with zeros
        (stride**2 times our multiply-adds) and ours is the stride-phase form.
        """
        from tvm import te

        if _IMPLS[self.operator].topi_compute is None:
            return self.prim_func
        placeholders, out = self.te_tensors(topi=True)
        return te.create_prim_func([*placeholders, out]).with_attr("global_symbol", "main")

    @functools.cached_property
    def compute_block(self) -> str:
        """Name of the operator's reduction block in `prim_func` (e.g. "conv2d_nchw")."""
        from tvm import s_tir, tirx

        sch = s_tir.Schedule(self.prim_func)
        names = [
            sch.get(rv).name_hint
            for rv in sch.get_child_blocks(sch.get_sblock("root"))
            if any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(rv).iter_vars)
        ]
        assert len(names) == 1, f"{self.key}: expected one reduction block, found {names}"
        return names[0]

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Inputs in call order, reproducible from `seed`: floats uniform in [-1, 1) (`compiler.arrays.
        random_inputs`; bfloat16 rounded from them); int8 jobs every value of their types (uint8 data in
        [0, 256), int8 weights in [-128, 128): the saturating u8 x s8 instructions are never used for catalog
        programs, so the full range is valid and tests it) and an int32 bias in [-2**16, 2**16). A requantizing
        job's zero points are any uint8 value and its scales spread the sums over about +-64 around them
        (`_requantization_inputs`), so that the outputs round, and some clip at 0 and 255."""
        import numpy as np

        from compiler.arrays import random_inputs

        if self.dtype != "int8":
            arrays = random_inputs([(tuple(s.shape), "float32") for s in self.inputs], seed)
            return [a.astype(_numpy_dtype(s.dtype)) for a, s in zip(arrays, self.inputs)]
        rng = np.random.default_rng(seed)
        bounds = {"uint8": (0, 256), "int8": (-128, 128), "int32": (-2**16, 2**16)}
        operands = self.inputs[:-2] if self.requantizes else self.inputs
        arrays = [rng.integers(*bounds[s.dtype], size=s.shape).astype(s.dtype) for s in operands]
        if self.requantizes:
            arrays += _requantization_inputs(rng, self.inputs[-1].shape[0], self._reduction)
        return arrays

    def reference(self, inputs: list[np.ndarray]) -> np.ndarray:
        """Computes the workload with torch: the ground truth every candidate is checked against.

        Args:
            inputs: arrays in the shapes and order of `inputs`.

        Returns:
            The output as a numpy array of `output.shape`.
        """
        import numpy as np
        import torch

        assert len(inputs) == len(self.inputs), f"{len(inputs)=} != {len(self.inputs)=}"
        for array, spec in zip(inputs, self.inputs):
            assert tuple(array.shape) == spec.shape, f"{spec.name}: {array.shape=} != {spec.shape=}"
        # int8: float64 holds every sum of u8 x s8 products below 2**53 exactly (the result is rounded back
        # to int32 below); bf16: its values widen to fp32 exactly, and fp32 is what our program accumulates in
        wide = {"float32": np.float32, "int8": np.float64, "bfloat16": np.float32}[self.dtype]
        with torch.no_grad():
            x, w, *rest = (torch.from_numpy(np.asarray(a).astype(wide)) for a in inputs)
            y = _IMPLS[self.operator].reference(self.params, x, w)
            view = [1] * y.dim()
            view[self._bias_axis] = -1
            if self.epilogue.startswith("bias"):
                y = y + rest[0].reshape(view)
            if "relu" in self.epilogue:
                y = torch.relu(y)
        out = y.numpy()
        if self.dtype == "int8":
            out = np.rint(out).astype(np.int32)
        if self.requantizes:  # in float32, operation by operation as the program does: exact
            scale, zero_point = (np.asarray(a).reshape(view) for a in inputs[-2:])
            q = np.rint(out.astype(np.float32) * scale.astype(np.float32)) + zero_point.astype(np.float32)
            out = np.clip(q, np.float32(0), np.float32(255)).astype(np.uint8)
        assert out.shape == self.output.shape, f"{out.shape=} != {self.output.shape=}"
        return out


def _requantization_inputs(rng: np.random.Generator, channels: int, reduction: int) -> list[np.ndarray]:
    """Random (scale, zero_point) per output channel for `channels` sums of `reduction` full-range u8 x s8
    products: the product's standard deviation is about 10922 (sqrt(E[x^2] E[w^2]) for uniform x in [0, 256)
    and w in [-128, 128)), so a scale of 64 / (10922 sqrt(reduction)), times a factor in [0.5, 2), spreads a
    channel's sums over about +-64 steps."""
    import numpy as np

    typical = 64.0 / (10922.0 * math.sqrt(reduction))
    scale = (typical * rng.uniform(0.5, 2.0, size=channels)).astype(np.float32)
    zero_point = rng.integers(0, 256, size=channels).astype(np.int32)
    return [scale, zero_point]


def _numpy_dtype(dtype: str) -> Any:
    """The numpy type of a TVM dtype name (bfloat16 is `ml_dtypes.bfloat16`, which TVM also takes)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return dtype


def make_workload(
    operator: str,
    params: dict,
    dtype: str = "float32",
    epilogue: str = "none",
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS,
) -> Workload:
    """Validates a workload description and returns the workload (a `Subgraph` for the names in
    `compiler.workloads.subgraphs.SUBGRAPHS`).

    Args:
        operator: a name in `OPERATORS` or `SUBGRAPHS`.
        params: the operator's parameters (defaults filled in by `validate`).
        dtype: element type, one of `DTYPES`.
        epilogue: one of `EPILOGUES`; bias, and a requantization's scale and zero point, are per output
            channel (per N column for dense and batch_matmul).
        max_tensor_elements: the largest number of elements any tensor may have.

    Returns:
        The workload; its `prim_func` is built on first access.

    Raises:
        WorkloadError: see `validate`.
    """
    normalized = validate(operator, params, dtype, epilogue, max_tensor_elements)
    if operator in SUBGRAPHS:  # a chain of operators, fused by `compiler.passes.basteln`
        return make_subgraph(operator, normalized, dtype, epilogue, workload_key(operator, normalized, dtype, epilogue))
    shapes = _IMPLS[operator].shapes(normalized)
    data_t, weight_t, out_t = STORAGE[dtype]
    inputs = [TensorSpec("data", shapes.data, data_t), TensorSpec("weight", shapes.weight, weight_t)]
    channels = (shapes.output[shapes.bias_axis],)
    if epilogue.startswith("bias"):
        inputs.append(TensorSpec("bias", channels, out_t))
    if epilogue in REQUANTIZE:
        inputs += [TensorSpec("scale", channels, "float32"), TensorSpec("zero_point", channels, "int32")]
    out_size = math.prod(shapes.output)
    # requantization: a multiply, a rounding, an add and the two clips
    epilogue_flops = out_size * (("bias" in epilogue) + ("relu" in epilogue) + 5 * (epilogue in REQUANTIZE))
    return Workload(
        operator=operator,
        params=normalized,
        dtype=dtype,
        epilogue=epilogue,
        key=workload_key(operator, normalized, dtype, epilogue),
        inputs=tuple(inputs),
        output=TensorSpec("output", shapes.output, "uint8" if epilogue in REQUANTIZE else out_t),
        flops=2 * shapes.macs + epilogue_flops,
        _bias_axis=shapes.bias_axis,
        _reduction=shapes.macs // out_size,
    )
