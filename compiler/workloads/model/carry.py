"""Carrying blocked layouts where `ConvertLayout` leaves NCHW between blocked neighbours (`carry_layouts`,
after it and before legalization): resizes and channel concats done in a block, conversions that cancel
removed, a conversion that moves no element (`keeps_order`) made a reshape. `channel_conversion` reads
which block a `layout_transform` converts into or out of.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm_ffi import structural_equal


def channel_conversion(call: Any) -> tuple[str, int] | None:
    """("block", b) when `call` converts NCHW into `N C/b H W b`, ("unblock", b) for the way back (the
    `layout_transform`s `ConvertLayout` writes), None for any other call."""
    if not (isinstance(call, relax.Call) and getattr(call.op, "name", "") == "relax.layout_transform"):
        return None
    if call.attrs.pad_value is not None:
        return None
    src, dst = call.args[0].ty, call.ty
    if not (isinstance(src, relax.TensorType) and isinstance(dst, relax.TensorType) and dst.shape is not None):
        return None
    if (src.ndim, dst.ndim) == (4, 5):
        kind, block = "block", dst.shape[4]
    elif (src.ndim, dst.ndim) == (5, 4):
        kind, block = "unblock", src.shape[4]
    else:
        return None
    if not isinstance(block, tvm.tirx.IntImm):
        return None
    want = _block_map(int(block)) if kind == "block" else _unblock_map(int(block))
    index_map = call.attrs.index_map
    dtype = str(index_map.initial_indices[0].ty.dtype)
    same = structural_equal(index_map, tvm.tirx.IndexMap.from_func(want, index_dtype=dtype), map_free_vars=True)
    return (kind, int(block)) if same else None


def keeps_order(call: Any, max_elements: int = 1 << 20) -> bool:
    """`call` is a `layout_transform` that moves no element in memory (the channels of a 1x1 image, or of a
    tensor with no image left, in or out of their block; a block of 1): a reshape, which the VM does as a view,
    without a kernel call. Its index map is evaluated on every index of a static source of at most
    `max_elements` (False beyond, and for a map of other operations than + - * // %)."""
    if not (isinstance(call, relax.Call) and getattr(call.op, "name", "") == "relax.layout_transform"):
        return False
    src, dst = call.args[0].ty, call.ty
    shapes = [getattr(t, "shape", None) for t in (src, dst)]
    if any(s is None or not all(isinstance(d, tvm.tirx.IntImm) for d in s) for s in shapes):
        return False
    src_shape, dst_shape = ([int(d) for d in s] for s in shapes)
    size = math.prod(src_shape)
    if size != math.prod(dst_shape) or size > max_elements:
        return False
    index_map = call.attrs.index_map
    env = list(zip(index_map.initial_indices, np.indices(src_shape, dtype=np.int64)))
    ops = {tvm.tirx.Add: np.add, tvm.tirx.Sub: np.subtract, tvm.tirx.Mul: np.multiply,
           tvm.tirx.FloorDiv: np.floor_divide, tvm.tirx.FloorMod: np.mod}

    def value(expr: Any) -> Any:
        if isinstance(expr, tvm.tirx.IntImm):
            return int(expr.value)
        if isinstance(expr, tvm.tirx.Var):
            return next(a for v, a in env if v.same_as(expr))
        return ops[type(expr)](value(expr.a), value(expr.b))

    try:
        moved = [np.broadcast_to(value(e), src_shape) for e in index_map.final_indices]
    except (KeyError, StopIteration):
        return False
    if len(moved) != len(dst_shape) or any(((m < 0) | (m >= d)).any() for m, d in zip(moved, dst_shape)):
        return False
    return bool((np.ravel_multi_index(moved, dst_shape).ravel() == np.arange(size)).all())


def _block_map(b: int) -> Any:
    return lambda n, c, h, w: (n, c // b, h, w, c % b)


def _unblock_map(b: int) -> Any:
    return lambda n, c, h, w, i: (n, c * b + i, h, w)


def _reblock_map(src: int, dst: int) -> Any:
    return lambda n, c, h, w, i: (n, (c * src + i) // dst, h, w, (c * src + i) % dst)


def carry_layouts(mod: Any) -> Any:
    """Carries blocked layouts where `ConvertLayout` leaves NCHW between blocked neighbours (run after it,
    before legalization), so that conversions between neighbours that agree cancel:

    - a resize of a tensor converted out of block b is resized in block b (`ConvertLayout` does not carry a
      block through `resize2d`), converted back after it;
    - a channel concat is done in block b where that needs fewer conversions than NCHW (`ConvertLayout` puts a
      concat of a blocked and a plain tensor in NCHW), counting those of its inputs (out of their blocks for
      NCHW; into b otherwise) and of its users (into their blocks, or one back to NCHW);
    - a conversion into block b of a tensor converted out of block b is the tensor itself; out of one block into
      another, one conversion;
    - a conversion that moves no element in memory (`keeps_order`: the channels of a 1x1 image, as after a
      global pooling) is a reshape, which the VM does as a view; a reshape of a reshape, one reshape.

    Conversions left unused are removed."""
    main = mod["main"]
    users: dict[Any, list[Any]] = {}
    for block in main.body.blocks:
        for binding in block.bindings:
            for var in relax.analysis.free_vars(binding.value):
                users.setdefault(var, []).append(binding.value)
    for var in relax.analysis.free_vars(main.body.body):
        users.setdefault(var, []).append(None)  # a function output: wanted in its own layout

    @relax.expr_functor.mutator
    class Carry(relax.PyExprMutator):
        def __init__(self) -> None:
            super().__init__(mod)
            self.blocked: dict[Any, tuple[Any, int]] = {}  # NCHW var -> (the same tensor in block b, b)
            self.reshaped: dict[Any, Any] = {}  # a reshape's var -> what it reshapes

        def emit_layout(self, x: Any, fn: Any) -> Any:
            return self.builder_.emit(relax.op.layout_transform(x, index_map=fn))

        def visit_var_binding_(self, binding: Any) -> None:
            value = self.visit_expr(binding.value)
            carried = self.carry(binding.var, value)
            value = self.builder_.normalize(value if carried is None else carried)
            conversion = channel_conversion(value)
            if conversion is not None and conversion[0] == "unblock":
                self.blocked[binding.var] = (value.args[0], conversion[1])
            if keeps_order(value):  # the same bytes in the other shape: a view, no kernel
                value = self.builder_.normalize(relax.op.reshape(value.args[0], value.ty.shape))
            if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.reshape":
                if value.args[0] in self.reshaped:  # one reshape, not two: FuseOps would make a kernel of the pair
                    value = self.builder_.normalize(relax.op.reshape(self.reshaped[value.args[0]], value.args[1]))
                self.reshaped[binding.var] = value.args[0]
            self.builder_.emit_normalized(relax.VarBinding(binding.var, value))

        def carry(self, var: Any, value: Any) -> Any:
            if not isinstance(value, relax.Call):
                return None
            name = getattr(value.op, "name", "")
            conversion = channel_conversion(value)
            if conversion is not None and conversion[0] == "block" and value.args[0] in self.blocked:
                src, b = self.blocked[value.args[0]]
                return src if b == conversion[1] else relax.op.layout_transform(
                    src, index_map=_reblock_map(b, conversion[1]))
            if name == "relax.image.resize2d" and value.attrs.layout == "NCHW" and value.args[0] in self.blocked:
                src, b = self.blocked[value.args[0]]
                a = value.attrs
                resized = self.builder_.emit(relax.op.image.resize2d(
                    src, value.args[1], [float(r) for r in a.roi], f"NCHW{b}c", a.method,
                    a.coordinate_transformation_mode, a.rounding_method, float(a.cubic_alpha), int(a.cubic_exclude),
                    float(a.extrapolation_value), a.out_dtype))
                return relax.op.layout_transform(resized, index_map=_unblock_map(b))
            if name == "relax.concat":
                return self.concat(var, value)
            return None

        def concat(self, var: Any, value: Any) -> Any:
            fields = value.args[0]
            if not (isinstance(fields, relax.Tuple) and int(value.attrs.axis) in (1, -3) and var.ty.ndim == 4
                    and all(isinstance(f, relax.Var) and f.ty.ndim == 4 for f in fields.fields)):
                return None
            channels = [int(f.ty.shape[1]) for f in fields.fields]
            into = [channel_conversion(u) for u in users.get(var, [])]
            plain_cost = sum(1 for f in fields.fields if f in self.blocked and len(users.get(f, [])) == 1)
            plain_cost += sum(1 for c in into if c is not None)

            def cost(b: int) -> int:
                ins = sum(0 if f in self.blocked and self.blocked[f][1] == b else 1 for f in fields.fields)
                outs = sum(1 for c in into if c is not None and c[1] != b)
                return ins + outs + (1 if any(c is None for c in into) else 0)

            blocks = {self.blocked[f][1] for f in fields.fields if f in self.blocked}
            blocks |= {c[1] for c in into if c is not None}
            blocks = sorted(b for b in blocks if all(c % b == 0 for c in channels))
            if not blocks or min(map(cost, blocks)) >= plain_cost:
                return None
            b = min(blocks, key=lambda b: (cost(b), -b))
            inputs = []
            for f in fields.fields:
                if f in self.blocked:
                    src, fb = self.blocked[f]
                    inputs.append(src if fb == b else self.emit_layout(src, _reblock_map(fb, b)))
                else:
                    inputs.append(self.emit_layout(f, _block_map(b)))
            joined = self.builder_.emit(relax.op.concat(inputs, axis=1))
            return relax.op.layout_transform(joined, index_map=_unblock_map(b))

    carry = Carry()
    gv = mod.get_global_var("main")
    carry.builder_.update_func(gv, carry.visit_expr(main))
    carried = carry.builder_.get()
    return relax.transform.DeadCodeElimination(["main"])(relax.transform.CanonicalizeBindings()(carried))
