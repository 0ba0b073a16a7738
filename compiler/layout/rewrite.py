"""Applies a propagation plan to a TE graph: ALT's layout pass (paper sec. 6), on TVM 0.27 TE.

For every compute op `Y = F(X...)` with stored layout `S_Y`:

1. the loop nest is rebuilt over `S_Y`'s shape (one loop per new dimension);
2. the old loop variables become `S_Y^-1(L')` (`Layout.backward`), with a guard
   where the new layout has padding (split remainders, pad, unfold overhang);
3. every access `X[f(L)]` becomes `X'[S_X(f(S_Y^-1(L')))]` (`Layout.forward`),
   simplified with the loop ranges known, so `S_X == S_Y` on an element-wise
   access gives back exactly `X'[L']` and the loops of the two ops align.

A consumer that the plan says must read a producer through a conversion reads a
`layout_convert_*` op instead: an identity compute whose own layout is the
requested one, built by the very same rules. Nothing here knows any operator.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tvm import ir, sym, te, tirx

from compiler.passes.tensorize.mark import DOT_GROUP
from compiler.tir_util import key

from .primitives import AccessContext, substitute
from .tensor_layout import Layout

if TYPE_CHECKING:

    from .propagate import Plan

CONVERT_PREFIX = "layout_convert"


@dataclass(frozen=True)
class GroupedReduction:
    """The dot-product form of a complex op (`compiler.layout.templates`): reduce axis `axis` becomes
    `r = ro * group + g`, and the output dims `zero_padded` (original dims) lose their padding guard: their
    padding computes zero without it, every product there having a factor from a layout's zero padding (the
    weight's output channel tile is the output's), so the reduction has no branch (COM)."""

    axis: int
    group: int
    zero_padded: tuple[int, ...] = ()


def _var_names(layout: Layout) -> list[str]:
    names, seen = [], set()
    for k, label in enumerate(layout.labels):
        base = re.sub(r"\W+", "_", label).strip("_").lower() or f"i{k}"
        if base[0].isdigit():
            base = f"i{base}"
        name = base
        while name in seen:
            name += "_"
        seen.add(name)
        names.append(name)
    return names


def _free_vars(e: Any) -> list:
    return tirx.analysis.undefined_vars(e)


def _all(conds: list) -> Any:
    out = conds[0]
    for c in conds[1:]:
        out = tirx.And(out, c)
    return out


def compute_in_layout(
    op: Any,
    layout: Layout,
    read: Callable[[Any, list, list, list, AccessContext], Any],
    name: str | None = None,
    attrs: Any = None,
    split: GroupedReduction | None = None,
) -> te.Tensor:
    """Rebuilds compute `op` so that its output is stored in `layout`.

    Args:
        op: a TE ComputeOp with one output.
        layout: the output's layout (over the op's original shape).
        read: `read(tensor, new_indices, old_indices, new_loop_vars, ctx)` -> the
            expression that loads `tensor` (an input of `op`) at the given
            original-coordinate indices, in whatever layout the producer has.
        name: the new op's name (default: the old one).
        attrs: the new op's attributes (default: the old ones; they must not name old tensors).
        split: the dot-product form (`GroupedReduction`): reduce axis k becomes `r = ro * G + g` over
            `ceil(extent / G)` chunks `ro` (in its place) and a group `g` (the last reduce axis), and the op's
            attributes say so (`DOT_GROUP`). Past the extent, the loads read the zero padding of the layouts
            that the form's inputs have; so do the output's zero-padded dims, left unguarded.

    Returns:
        The new output tensor, of shape `layout.new_shape`.
    """
    assert op.num_outputs == 1, f"{op.name}: multi-output ops are not supported ({op.num_outputs})"
    out_shape = tuple(int(s) for s in op.output(0).shape)
    assert out_shape == layout.shape, f"{op.name}: {layout.name} is for {layout.shape}, op makes {out_shape}"
    body = op.body[0]
    reduce_axes = list(op.reduce_axis)
    grouped: dict[int, Any] = {}  # old reduce variable -> its value in the split axes
    unguarded: tuple[int, ...] = ()
    if split is not None:
        k, group, unguarded = split.axis, split.group, split.zero_padded
        rv = reduce_axes[k]
        assert int(rv.dom.min) == 0, f"{op.name}: reduce axis {rv.var.name} starts at {rv.dom.min}"
        chunks = te.reduce_axis((0, -(-int(rv.dom.extent) // group)), name=f"{rv.var.name}o")
        lane = te.reduce_axis((0, group), name="g")
        grouped[key(rv.var)] = chunks.var * group + lane.var
        reduce_axes = [*reduce_axes[:k], chunks, *reduce_axes[k + 1 :], lane]
        attrs = {**(dict(op.attrs) if attrs is None and op.attrs is not None else attrs or {}), DOT_GROUP: group}

    def fcompute(*new_vars: Any) -> Any:
        analyzer = sym.Analyzer()
        for v, extent in zip(new_vars, layout.new_shape):
            analyzer.bind(v, ir.Range(0, extent))
        for rv in reduce_axes:
            analyzer.bind(rv.var, rv.dom)
        old, conds = layout.backward(list(new_vars))
        vmap = {key(ax.var): analyzer.simplify(e) for ax, e in zip(op.axis, old)}
        vmap.update(grouped)
        ctx = AccessContext(analyzer, {key(rv.var): rv.dom.min for rv in reduce_axes})
        conds = [c for c in (analyzer.simplify(c) for c in conds) if not analyzer.can_prove(c)]
        if unguarded:  # a guard over the variables of a zero-padded output dim only: computes zero anyway
            padded = [{key(v) for v in _free_vars(old[d])} for d in unguarded]
            conds = [c for c in conds if not any({key(v) for v in _free_vars(c)} <= vs for vs in padded)]

        def load(tensor: Any, new_idx: list, old_idx: list) -> Any:
            return read(tensor, [analyzer.simplify(i) for i in new_idx], old_idx, list(new_vars), ctx)

        if isinstance(body, tirx.Reduce):
            source = substitute(body.source[0], vmap, load)
            if conds:
                # lazy if_then_else: the padded part of the output must not load out of bounds
                source = tirx.if_then_else(_all(conds), source, body.combiner.identity_element[0])
            cond = substitute(body.condition, vmap, load)
            return tirx.Reduce(body.combiner, [source], reduce_axes, cond, 0, list(body.init))
        value = substitute(body, vmap, load)
        if conds:
            value = tirx.if_then_else(_all(conds), value, tirx.const(0, op.output(0).dtype))
        return value

    return te.compute(
        layout.new_shape,
        fcompute,
        name=name or op.name,
        tag=op.tag,
        attrs=op.attrs if attrs is None else attrs,
        varargs_names=_var_names(layout),
    )


def conversion(source: te.Tensor, source_layout: Layout, target: Layout, name: str) -> te.Tensor:
    """An explicit layout conversion op: reads `source` (stored in `source_layout`), writes `target`."""
    assert source_layout.shape == target.shape, f"{source_layout.shape=} != {target.shape=}"
    identity = te.placeholder(target.shape, source.dtype, name=f"{name}_in")
    copy = te.compute(target.shape, lambda *i: identity(*i), name=name, tag="injective,layout_convert")

    def read(tensor: Any, idx: list, old: list, new_vars: list, ctx: AccessContext) -> Any:
        return source(*[ctx.simplify(e) for e in source_layout.forward(idx, ctx)])

    return compute_in_layout(copy.op, target, read, name=name)


@dataclass(frozen=True)
class Rewritten:
    """A rewritten graph: the new arguments in call order and the plan that produced them."""

    inputs: tuple[te.Tensor, ...]  # placeholders in their stored layouts (store_at guests dropped)
    outputs: tuple[te.Tensor, ...]
    conversions: tuple[str, ...]  # names of the conversion ops inserted

    def prim_func(self) -> Any:
        return te.create_prim_func([*self.inputs, *self.outputs]).with_attr("global_symbol", "main")


def rewrite(plan: Plan, splits: dict[str, GroupedReduction] | None = None) -> Rewritten:
    """Rebuilds every op of `plan.graph` in the layouts the plan chose.

    Args:
        plan: from `propagate`: a layout for every tensor, conversions on edges,
            guests of store_at, and the layouts the outputs must end in.
        splits: op name -> its dot-product form (`GroupedReduction`, `compute_in_layout`).

    Returns:
        The new placeholders and outputs (`Rewritten.prim_func()` makes the PrimFunc).
    """
    graph = plan.graph
    new: dict[int, te.Tensor] = {}
    converted: dict[tuple[int, Layout], te.Tensor] = {}
    conversion_names: list[str] = []
    hosts = {guest: host for guest, host in plan.guests.items()}

    def convert(producer_op: Any, target: Layout, suffix: str = "") -> te.Tensor:
        ck = (key(producer_op), target)
        if ck not in converted:
            name = f"{CONVERT_PREFIX}_{producer_op.name}{suffix}"
            converted[ck] = conversion(new[key(producer_op)], plan.layout(producer_op), target, name)
            conversion_names.append(name)
        return converted[ck]

    for op in graph.ops:
        layout = plan.layout(op)
        if graph.is_placeholder(op):
            if op.name in hosts:
                continue  # stored inside its host by store_at
            new[key(op)] = te.placeholder(layout.new_shape, op.output(0).dtype, name=op.name)
            continue

        def read(tensor: Any, idx: list, old: list, new_vars: list, ctx: AccessContext, consumer: Any = op) -> Any:
            producer = tensor.op
            pk = key(producer)
            edge = plan.conversions.get((key(consumer), pk))
            if edge is not None:
                return convert(producer, edge)(*[ctx.simplify(e) for e in edge.forward(idx, ctx)])
            if producer.name in hosts and graph.is_placeholder(producer):
                host = graph.op(hosts[producer.name])
                where = plan.layout(host).attached_forward(producer.name, idx, ctx)
                return new[key(host)](*[ctx.simplify(e) for e in where])
            src_layout = plan.layout(producer)
            if src_layout == plan.layout(consumer) and _is_identity_access(consumer, old):
                # the element-wise fast path: same layout, same loops -> same index
                return new[pk](*new_vars)
            return new[pk](*[ctx.simplify(e) for e in src_layout.forward(idx, ctx)])

        new[key(op)] = compute_in_layout(op, layout, read, attrs=_remap_attrs(op, new),
                                         split=(splits or {}).get(op.name))

    outputs = []
    for out in graph.outputs:
        t = new[key(out.op)]
        final = plan.output_layouts.get(key(out.op))
        if final is not None and final != plan.layout(out.op):
            t = convert(out.op, final, "_out")
        outputs.append(t)
    inputs = tuple(new[key(p.op)] for p in graph.inputs if p.op.name not in hosts)
    return Rewritten(inputs, tuple(outputs), tuple(conversion_names))


def _remap_attrs(op: Any, new: dict[int, Any]) -> dict:
    """The op's attributes with tensors (topi's "layout_free_placeholders") pointing at the new ones."""
    attrs = dict(op.attrs) if op.attrs is not None else {}
    free = attrs.pop("layout_free_placeholders", None)
    if free is not None:
        kept = [new[key(t.op)] for t in free if key(t.op) in new]
        if kept:
            attrs["layout_free_placeholders"] = kept
    return attrs


def _is_identity_access(consumer: Any, old: Sequence) -> bool:
    axes = list(consumer.axis)
    return len(old) == len(axes) and all(i.same_as(ax.var) for i, ax in zip(old, axes))
