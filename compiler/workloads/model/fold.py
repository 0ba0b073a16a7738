"""Batch norm folded into the convolution before it, on the parameters, as torch.compile's freezing does.

    main, params, folded = fold_batch_norms(main, param_vars, params)

In inference a batch norm after a convolution is an affine map per output channel: `conv(x, W) (+ b)` then
`(y - mean) / sqrt(var + eps) * gamma + beta` equals `conv(x, W * s) + ((b - mean) * s + beta)` with
`s = gamma / sqrt(var + eps)`. Folded, the conv's epilogue loses four operations per output element, and the
lowering loses the constant arithmetic that `FoldConstant` compiled one LLVM module at a time (MobileNet-V2:
312 modules, about half of its lowering).

Only where nothing else reads what is changed: the weight (and a conv bias) is read by this conv alone, the
conv's output by the bias add and the batch norm alone, the batch norm's other outputs by nobody; `gamma`,
`beta`, `mean` and `var` are parameters or constants. The folded bias is written into the conv's bias
parameter, or, for a conv without one, into the batch norm's `beta` (a parameter of the same shape, read by
nothing else), so no constant is added. Transposed convolutions (their weight is `IO...`) are left alone.

A batch norm no conv can take (pre-activation, as in DenseNet and ResNet-v2: after a concat or an add; or after
a conv whose output something else reads) becomes `x * s + t` with `gamma := s` and `beta := beta - mean * s`
where nothing else reads gamma and beta: two operations per element instead of four, none a division.

A bfloat16 / float16 conv (`converters._low_precision_convolution`: float32 sums, the bias added in float32, the
result rounded to the model's type, then the batch norm in that type) folds the same way: the scaled weight and
the folded bias rounded to the model's type once, added in float32 before the rounding, as torch.compile's
freezing folds them (one rounding of the weight instead of one of the conv's output before the affine map).

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_op, is_tuple_get_item, rewrite_call, wildcard

if TYPE_CHECKING:
    import tvm

_CONVS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")


def fold_batch_norms(main: tvm.relax.Function, param_vars: Sequence[Any],
                     params: Sequence[np.ndarray]) -> tuple[tvm.relax.Function, list[np.ndarray], int]:
    """`main` with every foldable conv -> (bias add) -> batch norm folded (see the module doc) and every other
    batch norm whose parameters nothing else reads as `x * s + t`, the parameter arrays (in `param_vars`' order;
    changed ones are new arrays) and how many batch norms were folded or rescaled."""
    index = {v: i for i, v in enumerate(param_vars)}
    users: dict[Any, int] = {}
    for block in main.body.blocks:
        if isinstance(block, relax.DataflowBlock):
            for var, used_by in relax.analysis.udchain(block).items():
                users[var] = users.get(var, 0) + len(used_by)
    bindings = {b.var: b.value for block in main.body.blocks for b in block.bindings}

    x, w, b, shape = wildcard(), wildcard(), wildcard(), wildcard()
    gamma, beta, mean, var = wildcard(), wildcard(), wildcard(), wildcard()
    # a low-precision conv's weight may be padded to whole channel groups (`converters._low_precision_convolution`;
    # zeros scale to zeros), its bias is cast to float32 (the alternatives in this order: a wildcard takes anything)
    padded = is_op("relax.nn.pad")(w)
    conv = (is_op(_CONVS[0])(x, padded | w) | is_op(_CONVS[1])(x, padded | w) | is_op(_CONVS[2])(x, padded | w))
    biased = is_op("relax.add")(conv, is_op("relax.reshape")(is_op("relax.astype")(b) | b, shape))
    rounded = is_op("relax.astype")(conv | biased)  # a low-precision conv's float32 sums rounded
    norm = is_op("relax.nn.batch_norm")(conv | biased | rounded, gamma, beta, mean, var)
    pattern = is_tuple_get_item(norm, 0)

    out = list(params)
    folded: set[int] = set()

    def value(expr: Any) -> np.ndarray | None:
        if isinstance(expr, relax.Var) and expr in index:
            return np.asarray(params[index[expr]], dtype=np.float64)
        if type(expr).__name__ == "GenericConst":  # TVM 0.27's relax constant: `.value` is its tensor
            return np.asarray(expr.value.numpy(), dtype=np.float64)
        return None

    def only_here(v: Any, uses: int = 1) -> bool:
        return isinstance(v, relax.Var) and users.get(v, 0) == uses

    def rewrite(expr: Any, matches: dict) -> Any:
        bn_call = matches[norm]
        conv_call = matches[conv]
        weight, has_bias = matches[w], b in matches
        attrs = conv_call.attrs
        dtype = str(weight.ty.dtype)  # the model's: float32, or the type a low-precision conv rounds to
        low = rounded in matches
        if (str(attrs.out_dtype or "float32") != "float32" or dtype != ("float32" if not low else
                                                                          str(matches[rounded].attrs.dtype))
                or dtype not in ("float32", "bfloat16", "float16")
                or attrs.kernel_layout[:2] != "OI" or attrs.data_layout[:2] != "NC" or int(bn_call.attrs.axis) != 1):
            return expr
        if (weight not in index or index[weight] in folded or not only_here(weight)
                or (padded in matches and not only_here(conv_call.args[1]))):
            return expr
        if has_bias and not (matches[b] in index and only_here(matches[b]) and index[matches[b]] not in folded):
            return expr
        target = matches[b] if has_bias else matches[beta]
        if target not in index or (not has_bias and (not only_here(target) or index[target] in folded)):
            return expr
        # what is read between the conv and the batch norm (the bias add, the rounding), and the batch norm's
        # tuple: nothing else may read it
        between = [bn_call.args[0]]
        for _ in range(int(has_bias) + int(low)):
            between.append(bindings[between[-1]].args[0] if between[-1] in bindings else None)
        if not (all(only_here(v) for v in between) and only_here(expr.tuple_value)):
            return expr
        stats = [value(matches[v]) for v in (gamma, beta, mean, var)]
        if any(s is None for s in stats):
            return expr
        g, be, mu, sigma2 = stats
        scale = g / np.sqrt(sigma2 + float(bn_call.attrs.epsilon))
        w_array = np.asarray(params[index[weight]], dtype=np.float64)
        bias = value(matches[b]) if has_bias else np.zeros_like(mu)
        out[index[weight]] = (w_array * scale.reshape((-1,) + (1,) * (w_array.ndim - 1))).astype(
            params[index[weight]].dtype)
        out[index[target]] = ((bias - mu) * scale + be).astype(params[index[target]].dtype)
        folded.update((index[weight], index[target]))
        rank = len(conv_call.ty.shape)
        channels = int(conv_call.ty.shape[1])
        wide = relax.op.astype(target, "float32") if low else target
        out_expr = relax.op.add(conv_call, relax.op.reshape(wide, (1, channels) + (1,) * (rank - 2)))
        return relax.op.astype(out_expr, dtype) if low else out_expr

    new_main = rewrite_call(pattern, rewrite, main)
    # a batch norm no conv can take (pre-activation: after a concat or an add, or after a conv whose output
    # something else reads): `x * s + t` on the parameters gamma := s, beta := beta - mean * s (two operations
    # per element instead of four, none a division)
    alone = is_op("relax.nn.batch_norm")(x, gamma, beta, mean, var)

    def rescale(expr: Any, matches: dict) -> Any:
        bn_call = matches[alone]
        g_var, b_var = matches[gamma], matches[beta]
        data = bn_call.args[0]
        attrs = bn_call.attrs
        rank = int(data.ty.ndim)
        if (getattr(attrs, "training", False) or not (attrs.scale and attrs.center) or rank < 2
                or int(attrs.axis) not in (1, 1 - rank) or data.ty.shape is None
                or str(data.ty.dtype) not in ("float32", "bfloat16", "float16")):
            return expr
        if (g_var.same_as(b_var) or not all(v in index and only_here(v) and index[v] not in folded
                                             for v in (g_var, b_var)) or not only_here(expr.tuple_value)):
            return expr
        stats = [value(matches[v]) for v in (gamma, beta, mean, var)]
        if any(s is None for s in stats):
            return expr
        g, be, mu, sigma2 = stats
        scale = g / np.sqrt(sigma2 + float(attrs.epsilon))
        out[index[g_var]] = scale.astype(params[index[g_var]].dtype)
        out[index[b_var]] = (be - mu * scale).astype(params[index[b_var]].dtype)
        folded.update((index[g_var], index[b_var]))
        shape = (1, int(data.ty.shape[1])) + (1,) * (rank - 2)
        return relax.op.add(relax.op.multiply(data, relax.op.reshape(g_var, shape)), relax.op.reshape(b_var, shape))

    new_main = rewrite_call(is_tuple_get_item(alone, 0), rescale, new_main)
    return new_main, out, len(folded) // 2
