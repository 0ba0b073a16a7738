"""The TE programs of the catalog's operators (`compiler.workloads.operators`): each operator as topi (or our
own stride-phase transposed convolution) defines it, with its epilogue stages, and the PrimFunc a workload
tunes. `Workload.prim_func` and its siblings come here on first use.

Layering: TVM at the top; the catalog (`operators`, `workload`, `catalog`) stays free of it, so the API can
validate and key a job without loading TVM. `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tvm import s_tir, te, tirx, topi

from .operators import OPERATORS, transpose_out
from .spec import REQUANTIZE, TensorSpec


def _out_dtype(data: Any) -> str | None:
    """The accumulator and output type of an operator reading `data` (None: topi's default, the input's)."""
    return {"uint8": "int32", "int8": "int32", "bfloat16": "float32"}.get(str(data.dtype))


def _conv2d_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    groups = p.get("groups", 1)
    if groups == 1:
        return topi.nn.conv2d_nchw(data, weight, p["stride"], p["padding"], p["dilation"], _out_dtype(data))
    return topi.nn.group_conv2d_nchw(data, weight, p["stride"], p["padding"], p["dilation"], groups)


def _depthwise_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    return topi.nn.depthwise_conv2d_nchw(data, weight, p["stride"], p["padding"], p["dilation"])


def _conv1d_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    return topi.nn.conv1d_ncw(data, weight, p["stride"], p["padding"], p["dilation"])


def _conv3d_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    return topi.nn.conv3d_ncdhw(data, weight, p["stride"], p["padding"], p["dilation"], 1)


def _transpose_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    """Stride-phase form: each output row y takes only the kernel rows ky = (y + pad) % s + s*j, reading
    input row (y + pad) // s - j, so no multiply-add touches the zeros a dilated input would hold
    (topi's `conv2d_transpose` multiplies s*s times as many, most of them by zero)."""
    s, pad, k, g = p["stride"], p["padding"], p["kernel"], p["groups"]
    n, in_c, h, w = (int(d) for d in data.shape)
    out_c, out_h, out_w = p["out_channels"], transpose_out(p, "height"), transpose_out(p, "width")
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
    if p["padding"] > p["kernel"] - 1:  # topi pads the dilated input by kernel - 1 - padding
        return _transpose_te(p, data, weight)
    opad = (p["output_padding"], p["output_padding"])
    stride = (p["stride"], p["stride"])
    return topi.nn.group_conv2d_transpose_nchw(
        data, weight, stride, p["padding"], data.dtype, opad, p["groups"]
    )


def _dense_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    return topi.nn.dense(data, weight, out_dtype=_out_dtype(data))


def _bmm_te(p: dict[str, int], data: Any, weight: Any) -> Any:
    return topi.nn.batch_matmul(data, weight, transpose_a=False, transpose_b=False, out_dtype=_out_dtype(data))


# operator -> (params, data, weight) -> the output tensor
TE_COMPUTE: dict[str, Callable[[dict[str, int], Any, Any], Any]] = {
    "conv2d": _conv2d_te,
    "group_conv2d": _conv2d_te,
    "dilated_conv2d": _conv2d_te,
    "depthwise_conv2d": _depthwise_te,
    "conv1d": _conv1d_te,
    "conv3d": _conv3d_te,
    "conv2d_transpose": _transpose_te,
    "dense": _dense_te,
    "batch_matmul": _bmm_te,
}
assert set(TE_COMPUTE) == set(OPERATORS), f"{sorted(TE_COMPUTE)=} != {sorted(OPERATORS)=}"
# TVM's own definition, where ours differs (see `topi_prim_func`)
TOPI_COMPUTE: dict[str, Callable[[dict[str, int], Any, Any], Any]] = {"conv2d_transpose": _transpose_topi_te}


def te_tensors(operator: str, params: dict[str, int], epilogue: str, inputs: tuple[TensorSpec, ...],
               output: TensorSpec, bias_axis: int, use_topi: bool = False) -> tuple[list[te.Tensor], te.Tensor]:
    """A fresh TE graph of a catalog workload (`Workload.te_tensors`): its placeholders (in `inputs` order)
    and its output.

    The epilogue stages are separate ops named `bias_add`, `relu` and `requantize`, along the output's
    `bias_axis`. `use_topi`: the operator as TVM's topi defines it, where ours differs (`TOPI_COMPUTE`).
    """
    placeholders = [te.placeholder(s.shape, s.dtype, name=s.name) for s in inputs]
    compute = (TOPI_COMPUTE.get(operator) if use_topi else None) or TE_COMPUTE[operator]
    out = compute(params, placeholders[0], placeholders[1])
    assert tuple(int(d) for d in out.shape) == output.shape, (
        f"{operator}: TE output shape {tuple(out.shape)} != expected {output.shape}"
    )
    axis = bias_axis
    if epilogue.startswith("bias"):
        conv, bias = out, placeholders[2]
        out = te.compute(conv.shape, lambda *i: conv(*i) + bias[i[axis]], name="bias_add")
    if "relu" in epilogue:
        pre = out
        out = te.compute(pre.shape, lambda *i: tirx.max(pre(*i), tirx.const(0, pre.dtype)), name="relu")
    if epilogue in REQUANTIZE:
        acc, scale, zero_point = out, placeholders[-2], placeholders[-1]

        def requantize(*i: Any) -> Any:
            c = i[axis]
            rounded = tirx.nearbyint(acc(*i).astype("float32") * scale[c])  # half to even, as np.rint
            q = rounded + zero_point[c].astype("float32")  # exact: clipped where it would not be
            return tirx.max(tirx.min(q, tirx.const(255.0, "float32")), tirx.const(0.0, "float32")).astype("uint8")

        out = te.compute(acc.shape, requantize, name="requantize")
    return placeholders, out


def as_prim_func(placeholders: list[te.Tensor], out: te.Tensor) -> tirx.PrimFunc:
    """The TIR program of a TE graph, as every workload's: `te.create_prim_func`, global_symbol "main"."""
    return te.create_prim_func([*placeholders, out]).with_attr("global_symbol", "main")


def reduction_block(func: tirx.PrimFunc, key: str) -> str:
    """Name of the one reduction block of a workload's program (e.g. "conv2d_nchw"); `key` names the workload
    in the assertion."""
    sch = s_tir.Schedule(func)
    names = [
        sch.get(rv).name_hint
        for rv in sch.get_child_blocks(sch.get_sblock("root"))
        if any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(rv).iter_vars)
    ]
    assert len(names) == 1, f"{key}: expected one reduction block, found {names}"
    return names[0]
