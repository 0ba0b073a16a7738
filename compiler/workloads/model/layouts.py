"""Graph-level layouts of a model: the blocked `N C/c H W c` policy for convolutions, its block factors from
the target's vector width, and the legalizations that give TVM's operators those layouts.

Layering: `compiler` never imports `tuner` or `service`. torch, TVM and numpy are imported inside functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tvm


# Graph-level layouts of a model (ALT sec. 4.2): "none" keeps the operators' own layouts; "blocked"
# puts every dense and depthwise conv2d in N C/c H W c (weights O/o I/i KH KW i o, transformed at build time) and
# lets ConvertLayout carry the layout along element-wise, pooling and reduction paths, so conversions
# remain only where an operator cannot take it (inputs, outputs, flatten, grouped convs).
MODEL_LAYOUTS = ("blocked", "none")


def vector_lanes(target: Any, dtype: str = "float32") -> int:
    """How many `dtype` values one vector register of the target holds (16 for float32 on AVX-512)."""
    import tvm

    bits = tvm.DataType(dtype).bits
    if target.kind.name != "llvm":
        return max(1, 128 // bits)
    from compiler.target import vector_unit

    return max(1, vector_unit(target).lanes * 32 // bits)


def conv_blocks(out_channels: int, in_channels: int, lanes: int) -> tuple[int, int]:
    """(output block o, input block i) of a conv2d in the blocked layout: the largest power of two up
    to `lanes` that divides the channel count; a channel count below `lanes` that no power of two
    >= 4 divides (3 RGB channels) is one whole block."""

    def block(c: int) -> int:
        if c <= lanes and all(c % b for b in (4, 8, 16, 32, 64) if b <= c):
            return c
        return next(b for b in (64, 32, 16, 8, 4, 2, 1) if b <= lanes and c % b == 0)

    return block(out_channels), block(in_channels)


def blocked_conv_layouts(lanes: int) -> Any:
    """`ConvertLayout`'s per-call callback: the blocked layout for dense and depthwise NCHW conv2d,
    nothing else (other grouped convs, every other operator: ConvertLayout's own rules)."""

    def layouts(call: Any) -> dict:
        op = getattr(call, "op", None)
        if getattr(op, "name", "") != "relax.nn.conv2d":
            return {}
        attrs = call.attrs
        if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
            return {"relax.nn.conv2d": [str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)]}
        shape = call.args[1].ty.shape
        out_channels, in_channels, groups = int(shape[0]), int(shape[1]), int(attrs.groups)
        if groups == out_channels and in_channels == 1:  # depthwise: one block for data and output
            ob, _ = conv_blocks(out_channels, out_channels, lanes)
            return {"relax.nn.conv2d": [f"NCHW{ob}c", f"OIHW1i{ob}o", f"NCHW{ob}c"]}
        if groups != 1:  # other grouped convs keep NCHW (conversions around them); said explicitly, since
            return {"relax.nn.conv2d": ["NCHW", "OIHW", "NCHW"]}  # {} would try the producer's blocked layout
        ob, ib = conv_blocks(out_channels, in_channels, lanes)
        return {"relax.nn.conv2d": [f"NCHW{ib}c", f"OIHW{ib}i{ob}o", f"NCHW{ob}c"]}

    return layouts


def _blockable_convs(mod: Any, policy: Any) -> list[str]:
    """Names of the weights of "main"'s conv2d calls that `policy` would block, in graph order (a weight is a
    parameter of "main", so its name says which conv a `ConvertLayout` callback is looking at)."""
    from tvm import relax

    names: list[str] = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if (isinstance(call, relax.Call) and getattr(call.op, "name", "") == "relax.nn.conv2d"
                    and isinstance(call.args[1], relax.Var) and call.args[1].name not in names):
                wanted = policy(call).get("relax.nn.conv2d", ["NCHW"])
                if wanted[0] != str(call.attrs.data_layout):
                    names.append(call.args[1].name)
    return names


def convert_layouts(mod: Any, lanes: int, target: Any, *, legalize: bool = False) -> tuple[Any, list[str]]:
    """`relax.transform.ConvertLayout` with the blocked policy (`blocked_conv_layouts`), for every conv2d it can
    be applied to: the result, and the weights (parameter names in "main") of the convs left in their own layout.

    TVM's layout pass fails on some graphs with an internal error ("Layouts must have the same size" where a
    blocked tensor reaches a transposed conv or a resize, "Invalid layout axis" at a concat of different blocks,
    `std::bad_alloc` on 1-D pooling). Then the convs are tried one at a time in graph order, each kept blocked
    only if the graph with it (and those kept before) still converts (and, with `legalize`, legalizes: slower,
    for when the converted graph fails later); a conv left out keeps NCHW, so `ConvertLayout` puts conversions
    at its boundary. With no conv blocked the module is returned as it is (no layout pass at all)."""
    from tvm import relax

    policy = blocked_conv_layouts(lanes)
    convs = _blockable_convs(mod, policy)

    def attempt(blocked: set[str]) -> Any:
        def layouts(call: Any) -> dict:
            if (getattr(getattr(call, "op", None), "name", "") == "relax.nn.conv2d"
                    and getattr(call.args[1], "name", None) not in blocked):
                attrs = call.attrs  # said explicitly: {} would take the producer's blocked layout
                return {"relax.nn.conv2d": [str(attrs.data_layout), str(attrs.kernel_layout),
                                            str(attrs.out_layout)]}
            return policy(call)

        try:
            converted = relax.transform.ConvertLayout({}, layouts)(mod)
            if legalize:
                with target:
                    relax.transform.LegalizeOps({"relax.nn.conv2d": legalize_conv2d})(converted)
        except Exception:  # noqa: BLE001 - TVM's internal errors (InternalError, bad_alloc as RuntimeError)
            return None
        return converted

    if not convs:
        return mod, []
    converted = attempt(set(convs))
    if converted is not None:
        return converted, []
    kept: set[str] = set()
    for name in convs:
        if attempt(kept | {name}) is not None:
            kept.add(name)
    left = [c for c in convs if c not in kept]
    if not kept:
        return mod, left
    converted = attempt(kept)
    assert converted is not None, f"blocked {sorted(kept)} converted one at a time but not together"
    return converted, left


def legalize_conv2d(bb: Any, call: Any) -> Any:
    """Relax's conv2d legalization, plus the blocked layout (`topi.nn.conv2d_NCHWc`), which it leaves alone."""
    from tvm import relax, topi

    attrs = call.attrs
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
    from tvm import te, topi

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
