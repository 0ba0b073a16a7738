"""Translating a `torch.export` program to Relax: TVM's importer, our converters for the common ATen operators it
lacks, and errors that name the operator and the graph node that could not be imported.

`translate(ep)` runs torch's core-ATen decompositions, checks that every call has a converter (TVM's, or one of
`CONVERTERS`), and calls `relax.frontend.torch.from_exported_program` with `CONVERTERS` as its custom converters.
An operator with none, or a converter that fails, is a `ModelError("model", ...)` naming the operator and the fx
node ("unsupported operator amax.default at node amax_1").

Converters get the fx node and TVM's importer (`importer.env` maps fx nodes to Relax values,
`importer.block_builder` emits), as `from_exported_program(custom_convert_map=...)` calls them.

Layering: `compiler` never imports `tuner` or `service`. torch is imported inside the functions that need it (see
the comment at each): building and running the model needs only TVM.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tvm import relax, topi
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.relax.frontend.torch import from_exported_program
from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

from ...passes.tensorize.kernels import GROUP
from ..pt2 import ModelError, short_error
from .quantized import quantized_converters

if TYPE_CHECKING:
    import torch
    import tvm


def _arg(node: Any, index: int, name: str, default: Any) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _axes(dim: Any) -> list[int] | None:
    if dim is None or (isinstance(dim, list | tuple) and len(dim) == 0):
        return None  # every axis, as torch's amax(x, []) and var(x, None)
    return [int(d) for d in dim] if isinstance(dim, list | tuple) else [int(dim)]


def _reduce(op_name: str) -> Callable[[Any, Any], Any]:
    """amax / amin (x, dim=[], keepdim=False) -> relax max / min."""

    def convert(node: Any, importer: Any) -> Any:
        op = getattr(relax.op, op_name)
        x = importer.env[node.args[0]]
        axes = _axes(_arg(node, 1, "dim", None))
        return importer.block_builder.emit(op(x, axes, keepdims=bool(_arg(node, 2, "keepdim", False))))

    return convert


def _no_indices(node: Any) -> None:
    """Refuses a pooling node whose second result (the argmax indices) is read: only the values are computed."""
    for user in node.users:
        if not (user.op == "call_function" and user.target is operator.getitem and user.args[1] == 0):
            raise NotImplementedError(f"the indices of {node.target} are used ({user.name}); only its values are "
                                      "supported")


def _adaptive_max_pool(dims: int) -> Callable[[Any, Any], Any]:
    """adaptive_max_pool{2,3}d(x, output_size) -> (values, indices): `topi.nn.adaptive_pool` ("max"); the
    indices are zeros and must be unused (adaptive_max_pool1d arrives as the 2-D one after decomposition)."""

    def convert(node: Any, importer: Any) -> Any:
        _no_indices(node)
        x = importer.env[node.args[0]]
        size = [int(s) for s in node.args[1]]
        batched = x.ty.ndim == dims + 2
        if not batched:  # (C, H, W): torch's unbatched form
            x = importer.block_builder.emit(relax.op.expand_dims(x, 0))
        if dims == 2:
            values = importer.block_builder.emit_te(topi.nn.adaptive_pool, x, size, "max", "NCHW",
                                                    primfunc_name_hint="adaptive_max_pool2d")
        else:
            values = importer.block_builder.emit_te(topi.nn.adaptive_pool3d, x, size, "max", "NCDHW",
                                                    primfunc_name_hint="adaptive_max_pool3d")
        if not batched:
            values = importer.block_builder.emit(relax.op.squeeze(values, [0]))
        indices = relax.op.zeros(values.ty.shape, "int64")
        return importer.block_builder.emit(relax.Tuple([values, indices]))

    return convert


def _var_mean(node: Any, importer: Any) -> Any:
    """var_mean.correction(x, dim=None, correction=1, keepdim=False) -> (variance, mean)."""
    x = importer.env[node.args[0]]
    axes = _axes(_arg(node, 1, "dim", None))
    correction = node.kwargs.get("correction", 1)
    correction = 1 if correction is None else float(correction)
    keepdim = bool(node.kwargs.get("keepdim", False))
    shape = [int(d) for d in x.ty.shape]
    count = 1
    for a in (axes if axes is not None else range(len(shape))):
        count *= shape[a]
    bb = importer.block_builder
    var = bb.emit(relax.op.variance(x, axes, keepdims=keepdim))
    if correction:
        scale = count / max(count - correction, 0) if count > correction else float("nan")
        var = bb.emit(relax.op.multiply(var, relax.const(scale, x.ty.dtype)))
    return bb.emit(relax.Tuple([var, bb.emit(relax.op.mean(x, axes, keepdims=keepdim))]))


def _exp2(node: Any, importer: Any) -> Any:
    x = importer.env[node.args[0]]
    return importer.block_builder.emit(relax.op.exp(relax.op.multiply(x, relax.const(0.6931471805599453,
                                                                                     x.ty.dtype))))


def _hypot(node: Any, importer: Any) -> Any:
    a, b = (importer.env[n] for n in node.args[:2])
    return importer.block_builder.emit(relax.op.sqrt(relax.op.add(relax.op.multiply(a, a), relax.op.multiply(b, b))))


def _upsample3d(method: str) -> Callable[[Any, Any], Any]:
    """upsample_nearest3d.vec(x, output_size, scale_factors) / upsample_trilinear3d.vec(x, output_size,
    align_corners, scale_factors) -> `relax.op.image.resize3d` (torch's decomposition of these into index
    arithmetic is what TVM's importer fails on, so `translate` keeps them whole)."""

    def convert(node: Any, importer: Any) -> Any:
        x = importer.env[node.args[0]]
        size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
        if method == "nearest_neighbor":
            scales = node.args[2] if len(node.args) > 2 else node.kwargs.get("scale_factors")
            mode, rounding = "asymmetric", "floor"  # torch's "nearest": src = floor(dst * in / out)
        else:
            align = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("align_corners", False))
            scales = node.args[3] if len(node.args) > 3 else node.kwargs.get("scale_factors")
            mode, rounding = ("align_corners" if align else "half_pixel"), ""
        shape = [int(d) for d in x.ty.shape]
        if not size:
            scales = scales if isinstance(scales, list | tuple) else [scales] * 3
            size = [int(shape[2 + i] * float(scales[i])) for i in range(3)]
        return importer.block_builder.emit(relax.op.image.resize3d(
            x, [int(d) for d in size], layout="NCDHW", method=method, coordinate_transformation_mode=mode,
            rounding_method=rounding))

    return convert


# element types computed as torch computes them on a CPU: products accumulated in float32, the result
# rounded back (TVM's converters make every convolution and addmm float32 and then fail to add a bias of the
# model's own type)
LOW_PRECISION = ("bfloat16", "float16")


def _low_precision(x: Any) -> bool:
    return str(x.ty.dtype) in LOW_PRECISION


def _rounded(importer: Any, out: Any, bias: Any, dtype: str, bias_shape: tuple) -> Any:
    """`out` (float32) plus `bias` (in `dtype`, reshaped to `bias_shape`) in float32, then cast to `dtype`."""
    bb = importer.block_builder
    out = bb.emit(out)
    if bias is not None:
        wide = bb.emit(relax.op.astype(bias, "float32"))
        out = bb.emit(relax.op.add(out, bb.emit(relax.op.reshape(wide, bias_shape)) if bias_shape else wide))
    return bb.emit(relax.op.astype(out, dtype))


def _low_precision_convolution(node: Any, importer: Any) -> Any:
    """convolution.default on bfloat16 / float16 data: any rank, transposed or not, float32 accumulation."""
    x, weight = importer.env[node.args[0]], importer.env[node.args[1]]
    bias = importer.env.get(node.args[2]) if node.args[2] is not None else None
    stride, padding, dilation, transposed, output_padding, groups = node.args[3:9]
    dims = x.ty.ndim - 2
    data_layout = {1: "NCW", 2: "NCHW", 3: "NCDHW"}[dims]
    spatial = data_layout[2:]
    if transposed:
        op = getattr(relax.op.nn, f"conv{dims}d_transpose")
        out = op(x, weight, strides=stride, padding=padding, output_padding=output_padding, dilation=dilation,
                 groups=int(groups), data_layout=data_layout, kernel_layout="IO" + spatial, out_dtype="float32")
    else:
        extra = -int(x.ty.shape[1]) % GROUP["bfloat16"] if str(x.ty.dtype) == "bfloat16" and int(groups) == 1 else 0
        if extra:
            # input channels up to whole pairs of the bf16 dot product (3 RGB channels -> 4), the new weights 0,
            # so the dot-product form takes the conv (`layouts.dot_conv_layouts`); the spatial padding goes
            # into the same pad
            bb = importer.block_builder
            padding = [int(p) for p in padding] * (dims if len(padding) == 1 else 1)
            x = bb.emit(relax.op.nn.pad(x, [0, 0, 0, extra] + [w for p in padding for w in (p, p)], pad_value=0.0))
            weight = bb.emit(relax.op.nn.pad(weight, [0, 0, 0, extra] + [0, 0] * dims, pad_value=0.0))
            padding = [0] * dims
        op = getattr(relax.op.nn, f"conv{dims}d")
        out = op(x, weight, strides=stride, padding=padding, dilation=dilation, groups=int(groups),
                 data_layout=data_layout, kernel_layout="OI" + spatial, out_dtype="float32")
    return _rounded(importer, out, bias, str(x.ty.dtype), (1, -1) + (1,) * dims)


def _matmul_like(kind: str) -> Callable[[Any, Any], Any]:
    """addmm (bias, a, b, beta=1, alpha=1), mm / bmm (a, b) on bfloat16 / float16 data: float32 accumulation,
    the bias added in float32, the result rounded back (a bfloat16 linear, `b = permute(w)`, as a 1x1 conv:
    `_linear_weight`); other types as TVM converts them (addmm by its converter, mm / bmm as a
    `relax.op.matmul`, which is what its converter emits for two tensors)."""

    def convert(node: Any, importer: Any) -> Any:
        args = [importer.env[a] for a in node.args[:3 if kind == "addmm" else 2]]
        if not _low_precision(args[-1]):
            if kind == "addmm":
                return importer._addmm(node)
            return importer.block_builder.emit(relax.op.matmul(*args))
        bias, (a, b) = (args[0], args[1:]) if kind == "addmm" else (None, args)
        alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
        if kind == "addmm" and (alpha != 1 or beta != 1):
            raise NotImplementedError(f"addmm with alpha={alpha}, beta={beta} on {a.ty.dtype} data")
        weight = _linear_weight(node.args[-1], importer) if str(a.ty.dtype) == "bfloat16" else None
        if weight is not None:
            # a linear as a 1x1 NHWC conv over its rows: the form the layout policy gives the dot-product
            # instruction (`layouts.dot_conv_layouts`), as a quantized linear's
            *batch, k = (int(d) for d in a.ty.shape)
            m, n = math.prod(batch), int(weight.ty.shape[0])
            out = relax.op.nn.conv2d(relax.op.reshape(a, (1, 1, m, k)), relax.op.reshape(weight, (n, 1, 1, k)),
                                     data_layout="NHWC", kernel_layout="OHWI", out_dtype="float32")
            # the bias and the rounding on the conv's own shape, so that they fuse into it (a reshape between
            # would end the fused group)
            rounded = _rounded(importer, out, bias, str(a.ty.dtype), (n,) if bias is not None else ())
            return importer.block_builder.emit(relax.op.reshape(rounded, (*batch, n)))
        out = relax.op.matmul(a, b, out_dtype="float32")
        return _rounded(importer, out, bias, str(a.ty.dtype), tuple(int(d) for d in bias.ty.shape)
                        if bias is not None else ())

    return convert


def _linear_weight(b_node: Any, importer: Any) -> Any:
    """The (N, K) weight `w` of a linear's `mm` / `addmm` / `bmm` operand where the dot-product form fits it (N a
    multiple of 16 output lanes, K of pairs), else None. torch decomposes a linear into `b = permute(w, [1, 0])`
    and `mm` / `addmm`, or, on a non-contiguous 3-D input, into a `bmm` with `b = view(expand(permute(w)))`: the
    same weight for every batch, so the `bmm` is a linear over all its rows."""
    operand = [int(d) for d in importer.env[b_node].ty.shape]
    while (getattr(b_node, "op", None) == "call_function"
           and str(b_node.target) in ("aten.view.default", "aten.expand.default", "aten.reshape.default")):
        b_node = b_node.args[0]
    if not (getattr(b_node, "op", None) == "call_function" and str(b_node.target) == "aten.permute.default"
            and [int(d) for d in b_node.args[1]] == [1, 0]):
        return None
    weight = importer.env[b_node.args[0]]
    n, k = (int(d) for d in weight.ty.shape)
    return weight if operand[-2:] == [k, n] and n % 16 == 0 and k % 2 == 0 else None


def _convolution(node: Any, importer: Any) -> Any:
    """convolution.default: bfloat16 / float16 data with float32 accumulation (`_low_precision_convolution`);
    a 3-D transposed convolution as `relax.op.nn.conv3d_transpose` (TVM's converter refuses it); everything
    else by TVM's own converter."""
    x = importer.env[node.args[0]]
    if _low_precision(x):
        return _low_precision_convolution(node, importer)
    transposed = bool(node.args[6]) if len(node.args) > 6 else False
    if not (transposed and x.ty.ndim == 5):
        return importer._convolution(node)
    weight = importer.env[node.args[1]]
    bias = importer.env.get(node.args[2]) if node.args[2] is not None else None
    stride, padding, dilation, _, output_padding, groups = node.args[3:9]
    out = importer.block_builder.emit(relax.op.nn.conv3d_transpose(
        x, weight, strides=stride, padding=padding, output_padding=output_padding, dilation=dilation,
        groups=int(groups), data_layout="NCDHW", kernel_layout="IODHW"))
    if bias is not None:
        out = importer.block_builder.emit(relax.op.add(out, relax.op.reshape(bias, (1, -1, 1, 1, 1))))
    return out


# aten operator (overload) -> converter, for what TVM 0.27's importer has none of (or fails on)
CONVERTERS: dict[str, Callable[[Any, Any], Any]] = {
    "amax.default": _reduce("max"),
    "amin.default": _reduce("min"),
    "adaptive_max_pool2d.default": _adaptive_max_pool(2),
    "adaptive_max_pool3d.default": _adaptive_max_pool(3),
    "var_mean.correction": _var_mean,
    "exp2.default": _exp2,
    "hypot.default": _hypot,
    "upsample_nearest3d.vec": _upsample3d("nearest_neighbor"),
    "upsample_trilinear3d.vec": _upsample3d("linear"),
    "convolution.default": _convolution,
    "addmm.default": _matmul_like("addmm"),
    "mm.default": _matmul_like("mm"),
    "bmm.default": _matmul_like("bmm"),
}

# operators torch's default decompositions would break up into what TVM's importer cannot convert
_KEPT_WHOLE = ("upsample_nearest3d.vec", "upsample_trilinear3d.vec")


def translate(ep: torch.export.ExportedProgram) -> tvm.IRModule:
    """`from_exported_program(keep_params_as_input=True)` after torch's decompositions, with `CONVERTERS`.

    Raises:
        ModelError: "model", naming every operator without a converter and the node it is at, or the operator
            and node whose conversion failed.
    """
    import torch  # heavy: torch only where a program is imported (a sandbox child)

    table = torch.export.default_decompositions()
    for name in _KEPT_WHOLE:
        packet, overload = name.split(".")
        table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
    try:
        ep = ep.run_decompositions(table)
    except Exception as e:  # noqa: BLE001 - torch's decompositions refuse the program
        raise ModelError("model", f"torch could not decompose the program: {type(e).__name__}: "
                                  f"{short_error(e)}") from e

    converters = quantized_converters(ep, CONVERTERS)
    known = set(ExportedProgramImporter().create_convert_map()) | set(converters)
    missing: dict[str, list[str]] = {}
    for node in ep.graph.nodes:
        if node.op == "call_function":
            name = getattr(node.target, "__name__", str(node.target))
            if name not in known:
                missing.setdefault(name, []).append(node.name)
    if missing:
        listed = "; ".join(f"{op} at node{'s' if len(nodes) > 1 else ''} {', '.join(nodes[:5])}"
                           + (f" (+{len(nodes) - 5} more)" if len(nodes) > 5 else "")
                           for op, nodes in sorted(missing.items()))
        raise ModelError("model", f"unsupported operator(s): {listed}")
    try:
        mod = from_exported_program(ep, keep_params_as_input=True, custom_convert_map=converters,
                                    run_ep_decomposition=False)
        return widen_normalizations(mod)
    except Exception as e:  # noqa: BLE001 - a converter failed (TVM's or ours); say where
        node = _failing_node(e)
        where = (f"operator {getattr(node.target, '__name__', node.target)} at node {node.name}"
                 if node is not None else "the program")
        raise ModelError("model", f"cannot import {where}: {type(e).__name__}: {short_error(e)}") from e


# Relax operators that TVM computes in float32 / float16 only, or (softmax) that torch computes in float32 on
# low-precision data: run on float32 copies, the result rounded back
_WIDENED = ("relax.nn.layer_norm", "relax.nn.group_norm", "relax.nn.rms_norm", "relax.nn.softmax",
            "relax.nn.log_softmax")


def widen_normalizations(mod: tvm.IRModule) -> tvm.IRModule:
    """Every `_WIDENED` call on bfloat16 / float16 data computed in float32 (as torch computes them on a CPU:
    TVM's layer_norm refuses bfloat16 outright), its low-precision arguments cast up and its result back."""
    @mutator
    class Widen(PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            name = getattr(call.op, "name", None)
            dtype = str(getattr(call.ty, "dtype", ""))
            if name not in _WIDENED or dtype not in LOW_PRECISION:
                return super().visit_call_(call)
            args = [self.builder_.emit(relax.op.astype(a, "float32"))
                    if str(getattr(a.ty, "dtype", "")) in LOW_PRECISION else a for a in call.args]
            wide = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
            return relax.op.astype(wide, dtype)

    widen = Widen(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            widen.builder_.update_func(gv, widen.visit_expr(func))
    return widen.builder_.get()


def _failing_node(e: BaseException) -> Any:
    """The fx node the importer was converting when `e` was raised: the `node` local of the innermost frame of
    `_translate_fx_graph` in the traceback (None when the error came from elsewhere)."""
    tb, node = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_translate_fx_graph":
            node = tb.tb_frame.f_locals.get("node", node)
        tb = tb.tb_next
    return node
