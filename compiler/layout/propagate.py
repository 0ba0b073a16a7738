"""Layout propagation over a small TE graph (paper sec. 4.2 and 6).

A *complex* operator is a compute op with a reduction (convolutions, GEMMs); the
others are *simple* (padding, bias, relu, layout conversions). Complex operators
ask for layouts of their output and of the tensors they read (`requests`);
`propagate` then decides the stored layout of every tensor:

* a complex op's output gets its requested layout, and the layout is copied to
  element-wise consumers of the same shape, recursively (constraint 1), if it
  has only basic primitives (constraint 2) -- so bias/relu loops align with the
  conv's and fusion stays possible;
* a tensor a complex op reads gets the requested layout if nobody chose one
  yet: its producer (padding, a constant, a graph input) then writes the new
  layout directly, no conversion op; the layout is copied further up element-
  wise same-shape edges when basic;
* a tensor that already has another layout -- the output of another complex op
  (constraint 3), or one propagated from it -- is read through an explicit
  conversion op inserted on that edge.

The result is a `Plan`; `rewrite.rewrite(plan)` applies it.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compiler.tir_util import key

from .primitives import LayoutError, substitute
from .tensor_layout import Layout

if TYPE_CHECKING:
    from tvm import te


class Graph:
    """A TE graph given by its inputs (placeholders, in call order) and outputs."""

    def __init__(self, inputs: Sequence[te.Tensor], outputs: Sequence[te.Tensor]):
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        order: list[Any] = []
        seen: set[int] = set()

        def visit(op: Any) -> None:
            if key(op) in seen:
                return
            seen.add(key(op))
            for t in op.input_tensors:
                visit(t.op)
            order.append(op)

        for t in self.outputs:
            visit(t.op)
        self.ops = tuple(order)
        self.consumers: dict[int, list[Any]] = {key(op): [] for op in order}
        for op in order:
            for t in op.input_tensors:
                if op not in self.consumers[key(t.op)]:
                    self.consumers[key(t.op)].append(op)
        placeholders = {key(op) for op in order if self.is_placeholder(op)}
        missing = placeholders - {key(t.op) for t in self.inputs}
        assert not missing, f"placeholders not listed as inputs: {[o.name for o in order if key(o) in missing]}"

    @staticmethod
    def is_placeholder(op: Any) -> bool:
        return not hasattr(op, "body")

    @staticmethod
    def is_complex(op: Any) -> bool:
        return hasattr(op, "body") and len(op.reduce_axis) > 0

    def op(self, name: str) -> Any:
        found = [op for op in self.ops if op.name == name]
        if len(found) != 1:
            raise LayoutError(f"{len(found)} ops named {name!r} in the graph; names: {[o.name for o in self.ops]}")
        return found[0]

    def shape(self, op: Any) -> tuple[int, ...]:
        return tuple(int(s) for s in op.output(0).shape)

    def is_elementwise(self, consumer: Any, producer: Any) -> bool:
        """Y[i] = F(X[i], ...): a simple consumer reading the producer at its own loop indices, same shape."""
        if self.is_placeholder(consumer) or self.is_complex(consumer):
            return False
        if self.shape(consumer) != self.shape(producer):
            return False
        axes = list(consumer.axis)
        ok = [True]

        def load(tensor: Any, new: list, old: list) -> Any:
            if key(tensor.op) == key(producer):
                same = len(old) == len(axes) and all(i.same_as(ax.var) for i, ax in zip(old, axes))
                ok[0] = ok[0] and same
            return tensor(*new)

        substitute(consumer.body[0], {}, load)
        return ok[0]


@dataclass
class Plan:
    """Where every tensor of a graph lives, and which edges read through a conversion."""

    graph: Graph
    layouts: dict[int, Layout] = field(default_factory=dict)  # op handle -> stored layout
    conversions: dict[tuple[int, int], Layout] = field(default_factory=dict)  # (consumer, producer) -> layout read
    guests: dict[str, str] = field(default_factory=dict)  # placeholder stored inside a host by store_at
    output_layouts: dict[int, Layout] = field(default_factory=dict)  # layout an output must be returned in
    notes: list[str] = field(default_factory=list)  # the decisions, readable

    def layout(self, op: Any) -> Layout:
        """The stored layout of `op`'s output (identity where none was chosen)."""
        found = self.layouts.get(key(op))
        if found is not None:
            return found
        return Layout.identity(self.graph.shape(op))

    def layout_of(self, name: str) -> Layout:
        return self.layout(self.graph.op(name))

    @property
    def conversion_edges(self) -> list[tuple[str, str]]:
        """(producer, consumer) names of the edges that read through a conversion op."""
        by_key = {key(op): op for op in self.graph.ops}
        return [(by_key[p].name, by_key[c].name) for c, p in self.conversions]


def propagate(
    graph: Graph,
    requests: Mapping[str, Mapping[str, Layout]],
    *,
    activations: Sequence[str] = (),
    keep_interface: bool = False,
) -> Plan:
    """Decides the layout of every tensor from the layouts complex ops ask for.

    Args:
        graph: the TE graph.
        requests: complex op name -> {"output": layout, <name of a tensor it reads>: layout}.
        activations: names of graph inputs that are not constants (computed by the caller
            on every call, e.g. "data"). With `keep_interface`, they stay in the user's
            layout and are converted inside the function; constants are always packed
            once at build time (see `LayoutProgram.pack`).
        keep_interface: also return every output in its original layout (a final conversion).

    Returns:
        The plan; `plan.notes` says what was propagated and where conversions went.
    """
    plan = Plan(graph)
    for name, req in requests.items():
        op = graph.op(name)
        if not graph.is_complex(op):
            raise LayoutError(f"{name} is not a complex operator (no reduction); layouts are requested by those")
        inputs = {t.op.name: t.op for t in op.input_tensors}
        for role in req:
            if role != "output" and role not in inputs:
                raise LayoutError(f"{name} reads {sorted(inputs)}, not {role!r}")

    def assign(op: Any, layout: Layout, why: str) -> None:
        if layout.shape != graph.shape(op):
            raise LayoutError(f"layout {layout.name} is for shape {layout.shape}, {op.name} has {graph.shape(op)}")
        plan.layouts[key(op)] = layout
        for guest, _ in layout.attachments:
            plan.guests[guest] = op.name
        plan.notes.append(f"{op.name}: {layout.name} ({why})")

    def spread_down(src: Any) -> None:
        layout = plan.layout(src)
        if not layout.is_basic or layout.is_identity:
            return
        for consumer in graph.consumers[key(src)]:
            if key(consumer) in plan.layouts or not graph.is_elementwise(consumer, src):
                continue
            assign(consumer, layout, f"propagated from {src.name}, element-wise")
            spread_down(consumer)

    def spread_up(dst: Any) -> None:
        layout = plan.layout(dst)
        if graph.is_placeholder(dst) or not layout.is_basic or layout.is_identity:
            return
        for t in dst.input_tensors:
            producer = t.op
            if key(producer) in plan.layouts or graph.is_complex(producer) or not graph.is_elementwise(dst, producer):
                continue
            if graph.is_placeholder(producer) and keep_interface and producer.name in activations:
                continue
            assign(producer, layout, f"propagated from {dst.name}, element-wise")
            spread_up(producer)

    for op in graph.ops:  # topological order, as ALT tunes complex ops one after another
        if not graph.is_complex(op) or op.name not in requests:
            continue
        req = requests[op.name]
        if "output" in req:
            assign(op, req["output"], "requested")
            spread_down(op)
        for t in op.input_tensors:
            producer = t.op
            want = req.get(producer.name)
            if want is None or want == plan.layout(producer):
                continue
            user_input = graph.is_placeholder(producer) and keep_interface and producer.name in activations
            if key(producer) not in plan.layouts and not graph.is_complex(producer) and not user_input:
                assign(producer, want, f"requested by {op.name}; its producer writes it directly")
                spread_up(producer)
            else:
                plan.conversions[(key(op), key(producer))] = want
                plan.notes.append(f"{producer.name} -> {op.name}: conversion to {want.name}")

    if keep_interface:
        for out in graph.outputs:
            plan.output_layouts[key(out.op)] = Layout.identity(graph.shape(out.op))
    return plan
