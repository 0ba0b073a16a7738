"""PT2E-quantized programs: torch's (de)quantization operators in Relax, and each quantized convolution and linear
computed in integers, u8 x s8 -> s32, as oneDNN and FBGEMM run them.

A program quantized by torchao's `convert_pt2e` (its X86 quantizer, or any that quantizes activations per tensor
and weights per output channel, symmetrically) computes a quantized conv as float arithmetic on dequantized values:

    y = conv(dequantize(xq, sx, zx), dequantize_per_channel(wq, sw, 0, axis=0)) + bias

The integer part of that sum is exact in int32, so with the weights' zero point 0 it equals

    y = sx * sw[o] * (conv(pad(xq, zx), wq) - zx * sum(wq[o])) + bias

where `pad(xq, zx)` pads with the zero point (the value that dequantizes to 0): one u8 x s8 -> s32 convolution
on a quarter of the bytes of the float one, the form the int8 dot-product instructions take, and a per-channel
correction and scale that depend on the parameters alone (`LiftTransformParams` computes them once, at build
time). A linear (`addmm` / `mm` after torch's decompositions) is the same, as a 1x1 conv over its rows (NHWC).
Between two quantized operators the tensor stays uint8: the first's epilogue ends in `quantize_per_tensor`, the
next reads it.

What is not of that form -- a dequantized tensor read by an add, a pooling, a concat; a quantized operator with
weights that are not symmetric or not per output channel -- computes in float on the dequantized values, as the
program itself does; the result is the same, only slower.

    converters = quantized_converters(ep, CONVERTERS)   # our converters, quantized operands recognized

`quantize_per_tensor` rounds half to even, as `torch.round` does, after multiplying by the reciprocal of the scale
(torch's own formula), so the uint8 tensors between operators are torch's bit for bit wherever their float inputs
are.

Layering: `compiler` never imports `tuner` or `service`. torch is imported inside the functions that need it (see
the comment at each): building and running the model needs only TVM.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tvm import relax

from ...passes.tensorize.kernels import GROUP

if TYPE_CHECKING:
    import torch

Converter = Callable[[Any, Any], Any]

_DEQUANTIZE = "quantized_decomposed.dequantize_per_tensor.default"
_DEQUANTIZE_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"


def quantized_converters(ep: torch.export.ExportedProgram, base: Mapping[str, Converter]) -> dict[str, Converter]:
    """`base` with converters for the (de)quantization operators, and its convolution, addmm and mm converters
    wrapped to compute a quantized operator in integers (see the module doc) and fall back to `base` otherwise.

    `ep` gives the values of the weights' zero points (its parameters, buffers and constants): an operator is
    computed in integers only where they are all 0."""
    values = _placeholder_values(ep)
    out = dict(base)
    out["quantize_per_tensor.default"] = _quantize_per_tensor
    out["dequantize_per_tensor.default"] = _dequantize_per_tensor
    out["dequantize_per_channel.default"] = _dequantize_per_channel
    out["convolution.default"] = _integer_conv(base["convolution.default"], values)
    out["addmm.default"] = _integer_linear(base["addmm.default"], values, bias=True)
    out["mm.default"] = _integer_linear(base["mm.default"], values, bias=False)
    return out


def _placeholder_values(ep: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    """fx placeholder name -> its tensor, for the program's parameters, buffers and constants."""
    out = {}
    for spec in ep.graph_signature.input_specs:
        if spec.target is None:
            continue
        value = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
        if value is not None:
            out[spec.arg.name] = value
    return out


def _is(node: Any, name: str) -> bool:
    return getattr(node, "op", None) == "call_function" and str(node.target) == name


def _quantize_per_tensor(node: Any, importer: Any) -> Any:
    """quantize_per_tensor(x, scale, zero_point, quant_min, quant_max, dtype): torch's
    `clamp(round(x * (1 / scale)) + zero_point, quant_min, quant_max).to(dtype)`, rounding half to even."""
    x = importer.env[node.args[0]]
    scale, zero_point, low, high, dtype = node.args[1:6]
    bb = importer.block_builder
    f32 = str(x.ty.dtype)
    scaled = relax.op.multiply(x, relax.const(1.0 / float(scale), f32))
    rounded = relax.op.round(scaled)  # TVM's round is LLVM's nearbyint: half to even, as torch.round
    shifted = relax.op.add(rounded, relax.const(float(zero_point), f32))
    clipped = relax.op.clip(shifted, int(low), int(high))
    return bb.emit(relax.op.astype(clipped, _dtype_name(dtype)))


def _dequantize_per_tensor(node: Any, importer: Any) -> Any:
    """dequantize_per_tensor(x, scale, zero_point, ...): torch's `(x.to(float32) - zero_point) * scale`, as
    element-wise operators (which `ConvertLayout` carries in any layout; `relax.op.dequantize` it wraps in
    transposes)."""
    x = importer.env[node.args[0]]
    scale, zero_point = float(node.args[1]), int(node.args[2])
    shifted = relax.op.subtract(relax.op.astype(x, "float32"), relax.const(float(zero_point), "float32"))
    return importer.block_builder.emit(relax.op.multiply(shifted, relax.const(scale, "float32")))


def _dequantize_per_channel(node: Any, importer: Any) -> Any:
    """dequantize_per_channel(x, scales, zero_points, axis, ...): `(x - zero_points) * scales` along `axis`."""
    x, scales, zero_points = (importer.env[a] for a in node.args[:3])
    axis = int(node.args[3]) % x.ty.ndim
    bb = importer.block_builder
    scales = bb.emit(relax.op.astype(scales, "float32"))
    zero_points = bb.emit(relax.op.astype(zero_points, "int32"))
    return bb.emit(relax.op.dequantize(x, scales, zero_points, axis=axis, out_dtype="float32"))


def _dtype_name(dtype: Any) -> str:
    """torch.uint8 -> "uint8"."""
    return str(dtype).removeprefix("torch.")


def _operands(x_node: Any, w_node: Any, values: Mapping[str, torch.Tensor]) -> tuple | None:
    """((xq node, scale, zero point), (wq node, scales node)) when `x_node` dequantizes a uint8 tensor per
    tensor and `w_node` an int8 weight per output channel (axis 0) with every zero point 0; else None."""
    import torch  # heavy: torch only where a program is imported (a sandbox child)

    if not (_is(x_node, _DEQUANTIZE) and _is(w_node, _DEQUANTIZE_CHANNEL)):
        return None
    if _dtype_name(x_node.args[5]) != "uint8" or _dtype_name(w_node.args[6]) != "int8" or int(w_node.args[3]) != 0:
        return None
    zero_points = values.get(getattr(w_node.args[2], "name", ""))
    if zero_points is None or bool(torch.any(zero_points != 0)):
        return None
    return (x_node.args[0], float(x_node.args[1]), int(x_node.args[2])), (w_node.args[0], w_node.args[1])


def _scaled(importer: Any, acc: Any, wq: Any, scales: Any, scale: float, zero_point: int, reduce_axes: list[int],
            channel_shape: tuple[int, ...]) -> Any:
    """The int32 sum `acc` -> float32: `(acc - zero_point * sum(wq over reduce_axes)) * scale * scales`, the
    per-channel terms reshaped to `channel_shape` (they read parameters alone)."""
    bb = importer.block_builder
    if zero_point:
        sums = relax.op.sum(relax.op.astype(wq, "int32"), axis=reduce_axes)
        correction = relax.op.multiply(sums, relax.const(zero_point, "int32"))
        acc = bb.emit(relax.op.subtract(acc, relax.op.reshape(correction, channel_shape)))
    factor = relax.op.multiply(relax.op.astype(scales, "float32"), relax.const(scale, "float32"))
    return bb.emit(relax.op.multiply(relax.op.astype(acc, "float32"), relax.op.reshape(factor, channel_shape)))


def _integer_conv(fallback: Converter, values: Mapping[str, torch.Tensor]) -> Converter:
    """convolution.default on quantized operands (a 1-, 2- or 3-D conv, not transposed) in integers, else
    `fallback`."""

    def convert(node: Any, importer: Any) -> Any:
        operands = _operands(node.args[0], node.args[1], values)
        transposed = bool(node.args[6]) if len(node.args) > 6 else False
        if operands is None or transposed:
            return fallback(node, importer)
        (xq_node, scale, zero_point), (wq_node, scales_node) = operands
        xq, wq, scales = importer.env[xq_node], importer.env[wq_node], importer.env[scales_node]
        stride, padding, dilation = node.args[3:6]
        groups = int(node.args[8])
        rank = xq.ty.ndim - 2
        if rank not in (1, 2, 3):
            return fallback(node, importer)
        bb = importer.block_builder
        padding = [int(p) for p in padding] * (rank if len(padding) == 1 else 1)
        # input channels up to a multiple of the int8 instructions' group (3 RGB channels -> 4), the weights
        # of the new channels 0 (a constant, folded at import), so the dot-product form takes the conv too
        extra = -int(xq.ty.shape[1]) % GROUP["int8"] if groups == 1 else 0  # VNNI, sdot (vpmaddwd: 2)
        if extra:
            wq = bb.emit(relax.op.nn.pad(wq, [0, 0, 0, extra] + [0, 0] * rank, pad_value=0.0))
        if extra or (any(padding) and zero_point):  # padded with the zero point: the value that dequantizes to 0
            widths = [0, 0, 0, extra] + [w for p in padding for w in (p, p)]
            xq = bb.emit(relax.op.nn.pad(xq, widths, pad_value=float(zero_point)))
            padding = [0] * rank
        conv = {1: relax.op.nn.conv1d, 2: relax.op.nn.conv2d, 3: relax.op.nn.conv3d}[rank]
        acc = bb.emit(conv(xq, wq, strides=stride, padding=padding, dilation=dilation, groups=groups,
                           out_dtype="int32"))
        channels = int(wq.ty.shape[0])
        shape = (1, channels) + (1,) * rank
        out = _scaled(importer, acc, wq, scales, scale, zero_point, list(range(1, rank + 2)), shape)
        if len(node.args) > 2 and node.args[2] is not None:
            out = bb.emit(relax.op.add(out, relax.op.reshape(importer.env[node.args[2]], shape)))
        return out

    return convert


_VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def _rows_of(x_node: Any) -> Any:
    """The dequantized tensor a linear's `mm` reads, through the view that makes rows of it: torch decomposes a
    linear on a 3-D input (a transformer's tokens) into `view(x, [B * S, K]) -> mm -> view`, and the view of a
    dequantized tensor is the dequantized view of its uint8 tensor. Other nodes as they are."""
    if getattr(x_node, "op", None) == "call_function" and str(x_node.target) in _VIEWS \
            and _is(x_node.args[0], _DEQUANTIZE):
        source = x_node.args[0].meta.get("val")
        shape = [int(d) for d in x_node.args[1]]
        if source is not None and len(shape) == 2 and shape[-1] == int(source.shape[-1]):
            return x_node.args[0]
    return x_node


def _integer_linear(fallback: Converter, values: Mapping[str, torch.Tensor], *, bias: bool) -> Converter:
    """addmm(bias, x, w.T) / mm(x, w.T) on quantized operands (a linear after torch's decompositions: the
    weight is `permute(dequantize_per_channel(wq), [1, 0])`; `x` is the dequantized input, or its rows through a
    view for inputs of more than two dimensions) in integers, else `fallback`."""

    def convert(node: Any, importer: Any) -> Any:
        x_node, t_node = node.args[1:3] if bias else node.args[:2]
        if not (getattr(t_node, "op", None) == "call_function" and str(t_node.target) == "aten.permute.default"
                and [int(d) for d in t_node.args[1]] == [1, 0]):
            return fallback(node, importer)
        x_node = _rows_of(x_node)
        operands = _operands(x_node, t_node.args[0], values)
        if operands is None or (bias and (node.kwargs.get("alpha", 1) != 1 or node.kwargs.get("beta", 1) != 1)):
            return fallback(node, importer)
        (xq_node, scale, zero_point), (wq_node, scales_node) = operands
        xq, wq, scales = importer.env[xq_node], importer.env[wq_node], importer.env[scales_node]
        bb = importer.block_builder
        *rows, k = (int(d) for d in xq.ty.shape)
        m, n = math.prod(rows), int(wq.ty.shape[0])
        # a 1x1 conv in NHWC: one program form with the quantized convs, so the layout policy gives it the same
        # dot-product form where the CPU has one (`layouts.dot_conv_layouts`)
        acc = bb.emit(relax.op.nn.conv2d(relax.op.reshape(xq, (1, 1, m, k)), relax.op.reshape(wq, (n, 1, 1, k)),
                                         data_layout="NHWC", kernel_layout="OHWI", out_dtype="int32"))
        acc = bb.emit(relax.op.reshape(acc, (m, n)))
        out = _scaled(importer, acc, wq, scales, scale, zero_point, [1], (n,))
        if bias:
            out = bb.emit(relax.op.add(out, importer.env[node.args[0]]))
        return out

    return convert
