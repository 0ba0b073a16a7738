"""The conv2d kernels of a model's blocked layouts, and `legalize_conv2d`, which `LegalizeOps` runs for a
conv2d: Relax's own legalization for the 4-d layouts, plus the NHWC dot-product form (`conv2d_nhwc_dot`,
a kernel packed for a dot-product instruction), topi's `conv2d_NCHWc` and our blocked depthwise
(`depthwise_conv2d_nchwc`), which Relax leaves alone.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import re
from typing import Any

from tvm import relax, te, topi

from compiler.passes.tensorize.mark import DOT_GROUP


def conv2d_nhwc_dot(data: Any, kernel: Any, strides: Any, padding: Any, dilation: Any,
                    out_dtype: str = "int32") -> Any:
    """conv2d of NHWC data and a kernel packed for a dot-product instruction, `O/L KH KW I/G L G`
    (`OHWI{L}o{G}i`), as TE:

        out[n, y, x, ob, ol] = sum_{kh, kw, rc, g} pad(data)[n, y*sh + kh*dh, x*sw + kw*dw, rc*G + g]
                                                   * kernel[ob, kh, kw, rc, ol, g]

    then reshaped to NHWC (the same bytes). The output channel is two axes, a block and its L lanes, so that
    a register block of one or two whole vectors indexes the kernel affinely; the group `g` is a reduction
    axis of its own, the last, and the block says so (`DOT_GROUP`): the loop search (`tuner.spaces.loop.LoopSpace`)
    keeps it whole, innermost below the register block, the operand of the instruction
    (`compiler.passes.tensorize`; `kernels.conv2d`'s layout with a general stride and dilation)."""
    n, height, width, _ = (int(d) for d in data.shape)
    blocks, kh_, kw_, chunks, lanes, group = (int(d) for d in kernel.shape)
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    top, left, bottom, right = (int(p) for p in padding)
    out_h = (height + top + bottom - (kh_ - 1) * dh - 1) // sh + 1
    out_w = (width + left + right - (kw_ - 1) * dw - 1) // sw + 1
    if top or left or bottom or right:
        data = topi.nn.pad(data, (0, top, left, 0), (0, bottom, right, 0), name="data_pad")
    kh = te.reduce_axis((0, kh_), name="kh")
    kw = te.reduce_axis((0, kw_), name="kw")
    rc = te.reduce_axis((0, chunks), name="rc")
    g = te.reduce_axis((0, group), name="g")
    out = te.compute(
        (n, out_h, out_w, blocks, lanes),
        lambda b, y, x, ob, ol: te.sum(
            data[b, y * sh + kh * dh, x * sw + kw * dw, rc * group + g].astype(out_dtype)
            * kernel[ob, kh, kw, rc, ol, g].astype(out_dtype), axis=[kh, kw, rc, g]),
        name="conv2d_nhwc_dot", attrs={DOT_GROUP: group},
    )
    return topi.reshape(out, (n, out_h, out_w, blocks * lanes))


def legalize_conv2d(bb: Any, call: Any) -> Any:
    """Relax's conv2d legalization, plus the blocked layout (`topi.nn.conv2d_NCHWc`), which it leaves alone."""
    attrs = call.attrs
    dot = re.fullmatch(r"OHWI(\d+)o(\d+)i", str(attrs.kernel_layout))
    if str(attrs.data_layout) == "NHWC" and dot:
        return bb.call_te(conv2d_nhwc_dot, call.args[0], call.args[1], attrs.strides, attrs.padding, attrs.dilation,
                          attrs.out_dtype or "int32", primfunc_name_hint="conv2d_nhwc_dot")
    if len(attrs.data_layout) == 4 and len(attrs.kernel_layout) == 4:
        return relax.transform.legalize_ops.nn._nn_conv2d(bb, call)
    args = (call.args[0], call.args[1], attrs.strides, attrs.padding, attrs.dilation, attrs.data_layout,
            attrs.out_layout, attrs.out_dtype or "float32")
    if int(attrs.groups) > 1:  # `blocked_conv_layouts` blocks only depthwise among grouped convs
        return bb.call_te(depthwise_conv2d_nchwc, *args, primfunc_name_hint="depthwise_conv2d_NCHWc")
    return bb.call_te(topi.nn.conv2d_NCHWc, *args, primfunc_name_hint="conv2d_NCHWc")


def depthwise_conv2d_nchwc(data: Any, kernel: Any, strides: Any, padding: Any, dilation: Any, layout: str,
                           out_layout: str, out_dtype: str = "float32") -> Any:
    """Depthwise conv2d in the blocked layout (TE): data `N C/c H W c`, kernel `C/c 1 KH KW 1 c`.

    topi declares `nn.depthwise_conv2d_NCHWc` without a generic compute (its x86 one is gone), so it
    is written here: out[n, C, y, x, c] = sum_{kh, kw} pad(data)[n, C, y*sh + kh*dh, x*sw + kw*dw, c]
    * kernel[C, 0, kh, kw, 0, c].
    """
    assert layout == out_layout, f"depthwise in {layout}, out {out_layout}: one block for both"
    n, chunks, height, width, block = (int(d) for d in data.shape)
    _, _, kh_, kw_, _, kblock = (int(d) for d in kernel.shape)
    assert kblock == block, f"kernel block {kblock} != data block {block}"
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    top, left, bottom, right = (int(p) for p in padding)
    out_h = (height + top + bottom - (kh_ - 1) * dh - 1) // sh + 1
    out_w = (width + left + right - (kw_ - 1) * dw - 1) // sw + 1
    padded = topi.nn.pad(data, (0, 0, top, left, 0), (0, 0, bottom, right, 0), name="data_pad")
    kh = te.reduce_axis((0, kh_), name="kh")
    kw = te.reduce_axis((0, kw_), name="kw")
    return te.compute(
        (n, chunks, out_h, out_w, block),
        lambda b, oc, y, x, c: te.sum(
            padded[b, oc, y * sh + kh * dh, x * sw + kw * dw, c].astype(out_dtype)
            * kernel[oc, 0, kh, kw, 0, c].astype(out_dtype), axis=[kh, kw]),
        name="depthwise_conv2d_NCHWc",
    )
