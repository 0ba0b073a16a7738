"""The entry point the tuner drives: a workload + a layout choice -> a transformed program.

    prog = apply_layout(workload, {"ot": 16, "ht": 4, "wt": 16})     # template factors
    prog = apply_layout(workload, {"output": Layout(...), "weight": Layout(...)})  # or explicit layouts
    task = tuner.Task(name=..., workload_key=workload.key, prim_func=prog.prim_func, target=target,
                      inputs=prog.pack_inputs(xs), expected=prog.pack_output(workload.reference(xs)))

`prog.prim_func` takes its arguments in the tuned layouts (`prog.args`) except
where `keep_interface` keeps the user's: the activation ("data") is then
converted inside the function (for free when a padding stage exists: the pad
writes the new layout) and the output is converted back at the end. Constants
(weight, bias) are always packed once, at build time: `prog.pack_constants`
(numpy) or the `prog.pack_func` PrimFunc; `prog.manifest()` says how to call both.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import te, tirx

from compiler.pipeline import compile_module
from compiler.tir_util import key
from compiler.workloads import TensorSpec
from compiler.workloads.model.layouts import dot_instruction

from .primitives import LayoutError
from .propagate import Graph, Plan, propagate
from .rewrite import conversion, rewrite
from .templates import GROUP_PARAM, OUTER_SUFFIX, LayoutTemplate, conv_template, gemm_template
from .tensor_layout import Layout

if TYPE_CHECKING:

    from compiler.workloads import TensorSpec, Workload

ACTIVATIONS = ("data",)  # the workload inputs computed on every call; the others are constants
DOT_OPERATORS = ("conv2d", "dense", "batch_matmul")  # the catalog operators with a dot-product form


def subgraph_layout(workload: Any, block: int) -> tvm.tirx.PrimFunc:
    """A subgraph's program (`compiler.workloads.subgraphs`) with every complex operator in blocked layouts.

    Each convolution computes and writes its output as `N H W O/block block` and reads its input and
    weight blocked the same way (the sec. 5.1 template with `ot = it = kot = kit = block`); each GEMM
    writes `M N/block block` and reads `M K/block block` and `K/block N/block block block` (`nt = kt =
    block`: a GEMM reading another's output reads it in the layout that one writes). A dimension the
    block does not divide is blocked whole up to 4 blocks (MobileNet-V2's 24 channels with 16 lanes: the
    weight's output channels innermost, so a vector over them loads it contiguously, where unblocked each
    lane would load from another row), beyond that left unblocked. Propagation carries each layout along the element-wise chain
    behind its operator, so two convolutions that agree meet with no conversion between them.

    The interface is the workload's own (`workload.prim_func`'s arguments): every input, weights
    included, is converted inside the function (the weights are small next to the convolutions: a
    copy per call), and the output is converted back at the end. basteln tiles that last conversion
    and fuses the operators into its tiles.

    Raises:
        LayoutError: the subgraph has no operator a template fits.
    """
    placeholders, out = workload.te_tensors()
    graph = Graph(placeholders, [out])
    requests: dict[str, dict[str, Layout]] = {}
    for op in graph.ops:
        if not graph.is_complex(op) or len(op.input_tensors) != 2:
            continue  # a row reduction (softmax's max and sum): it reads whatever its producer writes
        rank = len(graph.shape(op))
        if rank >= 4:
            template = conv_template(graph, op)
            blocked = {"ot", "it", "kot", "kit"}
        else:
            template = gemm_template(graph, op, weight_is_nk=_reads_transposed(op))
            blocked = {"nt", "kt"}
        choice = {p.name: (block if p.extent % block == 0 else p.extent if p.extent <= 4 * block else 1)
                  if p.name in blocked else 1 for p in template.params}
        requests[op.name] = template.layouts(choice)
    if not requests:
        raise LayoutError(f"{workload.operator}: no operator a layout template fits")
    plan = propagate(graph, requests, activations=[t.op.name for t in placeholders], keep_interface=True)
    return rewrite(plan).prim_func().with_attr("global_symbol", "main")


def _reads_transposed(op: Any) -> bool:
    """Whether a GEMM's right operand is read as (N, K): its last index is the reduction variable."""
    reduce_vars = {iv.var.name for iv in op.reduce_axis}
    weight = op.input_tensors[1]
    stack = [op.body[0].source[0] if isinstance(op.body[0], tirx.Reduce) else op.body[0]]
    while stack:
        e = stack.pop()
        args = list(getattr(e, "args", ()))
        if getattr(getattr(e, "op", None), "name", None) == "te.tensor_load":  # a tensor access: (tensor, *indices)
            if args[0].same_as(weight):
                last = args[-1]
                return isinstance(last, tirx.Var) and last.name in reduce_vars
            continue
        stack.extend(getattr(e, attr) for attr in ("a", "b", "value") if hasattr(e, attr))
        stack.extend(args)
    return False


def te_graph(workload: Workload) -> Graph:
    """The workload's TE graph (inputs data, weight[, bias]; the epilogue as separate ops).

    Mirrors `Workload.prim_func` stage by stage (same op names), so block names
    and results agree with the untransformed program.
    """
    placeholders, out = workload.te_tensors()
    return Graph(placeholders, [out])


def complex_op(graph: Graph) -> Any:
    ops = [op for op in graph.ops if graph.is_complex(op)]
    assert len(ops) == 1, f"expected one complex op, found {[o.name for o in ops]}"
    return ops[0]


def layout_template(workload: Workload, levels: int = 1, dot: tuple[int, int] | None = None) -> LayoutTemplate:
    """The sec. 5.1 layout space of a workload (convolution or GEMM template), one-level (the default) or
    the paper's two-level output tiling; `dot=(L, G)`, the dot-product form of an int8 or bfloat16 conv2d,
    dense or batch_matmul (`templates`' docstring; `dot_template` says whether a target has one).

    Raises:
        LayoutError: `dot` for an operator without that form.
    """
    graph = te_graph(workload)
    op = complex_op(graph)
    if dot is not None and workload.operator not in DOT_OPERATORS:
        raise LayoutError(f"{workload.operator} has no dot-product form (the ones that do: {', '.join(DOT_OPERATORS)})")
    if workload.operator in ("dense", "batch_matmul"):
        return gemm_template(graph, op, weight_is_nk=workload.operator == "dense", levels=levels, dot=dot)
    return conv_template(graph, op, levels=levels, weight_is_io=workload.operator == "conv2d_transpose", dot=dot)


def dot_template(workload: Workload, target: tvm.target.Target) -> tuple[int, int] | None:
    """(L, G) of the target's dot-product instruction for the workload's element type, where the workload is
    an int8 or bfloat16 operator that has the dot-product form (`DOT_OPERATORS`); None otherwise (float32,
    other operators, a target without an exact instruction: then the template is the plain one)."""
    if workload.dtype not in ("int8", "bfloat16") or workload.operator not in DOT_OPERATORS:
        return None
    return dot_instruction(target, workload.dtype)


def template_levels(choice: Mapping[str, int]) -> int:
    """How many levels the template of a factor choice has (2 when it names a second-level factor)."""
    return 2 if any(k.endswith(OUTER_SUFFIX) for k in choice) else 1


@dataclass(frozen=True)
class LayoutProgram:
    """A workload rewritten into chosen layouts, with the conversions to and from the user's."""

    workload: Workload
    requested: dict[str, Layout]  # what the complex op asked for ("output", tensors it reads)
    layouts: dict[str, Layout]  # stored layout of every argument of prim_func ("data", "weight", "bias", "output")
    prim_func: tvm.tirx.PrimFunc
    args: tuple[TensorSpec, ...]  # prim_func's arguments in call order, in their stored shapes
    guests: dict[str, str]  # constant -> host constant it is stored in (store_at)
    conversions: tuple[str, ...]  # conversion ops inside prim_func
    notes: tuple[str, ...]  # propagation decisions
    keep_interface: bool
    compute_block: str  # the complex op's block name (same as the workload's)
    _plan: Plan = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        """Display name: the requested layouts, e.g. "output N H/4 W/16 O/16 4 16 16; weight ..."."""
        return "; ".join(f"{k} {v.name}" for k, v in self.requested.items())

    @property
    def constants(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.workload.inputs if s.name not in ACTIVATIONS)

    # -- numpy conversions (build time, tests, the tuner's reference data) ----

    def pack_constants(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Constants in user layout -> stored layout (guests of store_at go into their host)."""
        out = {}
        for name, array in arrays.items():
            if name in self.guests:
                continue
            layout = self.layouts[name]
            attached = {g: arrays[g] for g, _ in layout.attachments}
            out[name] = layout.pack(array, attached)
        return out

    def pack_inputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """User-layout inputs (workload order) -> prim_func's input arguments (without the output)."""
        named = {s.name: a for s, a in zip(self.workload.inputs, inputs)}
        packed = self.pack_constants({k: v for k, v in named.items() if k not in ACTIVATIONS})
        for name in ACTIVATIONS:
            if name in named:
                packed[name] = self.layouts[name].pack(named[name])
        return [packed[s.name] for s in self.args[:-1]]

    def pack_output(self, output: np.ndarray) -> np.ndarray:
        """A user-layout output (e.g. the torch reference) in prim_func's output layout."""
        return self.layouts["output"].pack(output)

    def unpack_output(self, output: np.ndarray) -> np.ndarray:
        """prim_func's output -> the user's layout."""
        return self.layouts["output"].unpack(output)

    # -- in TVM -------------------------------------------------------------

    @functools.cached_property
    def pack_func(self) -> tvm.tirx.PrimFunc:
        """PrimFunc "pack_constants"(user constants..., packed constants...): run once at load time.

        Raises:
            LayoutError: store_at layouts (pack those with `pack_constants`).
        """
        sources, outs = [], []
        for spec in self.workload.inputs:
            if spec.name in ACTIVATIONS:
                continue
            if spec.name in self.guests or self.layouts[spec.name].attachments:
                raise LayoutError("pack_func does not support store_at; use pack_constants")
            src = te.placeholder(spec.shape, spec.dtype, name=spec.name)
            sources.append(src)
            outs.append(conversion(src, Layout.identity(spec.shape), self.layouts[spec.name], f"{spec.name}_packed"))
        return te.create_prim_func([*sources, *outs]).with_attr("global_symbol", "pack_constants")

    def manifest(self) -> dict:
        """How to call the artifact: arguments, their layouts and the packing step (JSON-ready)."""
        return {
            "layouts": {k: {"name": v.name, "shape": list(v.new_shape), "user_shape": list(v.shape)}
                        for k, v in self.layouts.items()},
            "args": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in self.args],
            "guests": dict(self.guests),
            "keep_interface": self.keep_interface,
            "conversions_in_function": list(self.conversions),
            "usage": (
                "packed = pack_constants(weight[, bias]) once (lib['pack_constants'] or numpy); then "
                "main(data, *packed, out) with data and out in the layouts above "
                + ("(data and output are the user's: converted inside main)" if self.keep_interface else
                   "(convert data with the data layout, read out back with its inverse)")
            ),
        }

    def run(self, inputs: Sequence[np.ndarray], target: Any = "llvm") -> np.ndarray:
        """Builds prim_func, runs it on user-layout inputs and returns the user-layout output (tests)."""
        lib = compile_module(tvm.IRModule({"main": self.prim_func}), tvm.target.Target(target))
        args = [tvm.runtime.tensor(a) for a in self.pack_inputs(inputs)]
        out = tvm.runtime.tensor(np.zeros(self.args[-1].shape, self.args[-1].dtype))
        lib["main"](*args, out)
        result = out.numpy()
        return result if self.keep_interface else self.unpack_output(result)


def apply_layout(
    workload: Workload,
    choice: Mapping[str, int] | Mapping[str, Layout] | None = None,
    *,
    keep_interface: bool = False,
) -> LayoutProgram:
    """Rewrites a workload into the layouts of `choice`.

    Args:
        workload: from `compiler.workloads.make_workload`.
        choice: template factors (`layout_template(workload).params`, e.g. {"ot": 16, "ht": 4}; with
            `group` > 1, the dot-product form's), or explicit layouts keyed "output" and by the names of the tensors the
            complex op reads ("pad_temp", "weight", ...). None or {}: no layout change.
        keep_interface: data and output in the user's layouts, converted inside the function.

    Returns:
        The transformed program with its conversions.

    Raises:
        LayoutError: a layout that does not fit (wrong shape, a tile too small for a window, ...).
    """
    graph = te_graph(workload)
    op = complex_op(graph)
    choice = {k: v for k, v in (choice or {}).items() if (k, v) != (GROUP_PARAM, 1)}  # group 1: the plain form
    splits = {}
    if choice and all(isinstance(v, int) for v in choice.values()):
        # the dot-product form's template (its candidates do not matter to `layouts`)
        dot = (1, choice[GROUP_PARAM]) if choice.get(GROUP_PARAM, 1) > 1 else None
        template = layout_template(workload, template_levels(choice), dot=dot)
        requested = template.layouts(choice)
        split = template.reduction_split(choice)
        if split is not None:
            splits[op.name] = split
    else:
        bad = {k: type(v).__name__ for k, v in choice.items() if not isinstance(v, Layout)}
        if bad:
            raise LayoutError(f"choice mixes template factors and layouts: {bad}")
        requested = dict(choice)
    plan = propagate(graph, {op.name: requested}, activations=ACTIVATIONS, keep_interface=keep_interface)
    rewritten = rewrite(plan, splits)
    prim_func = rewritten.prim_func()
    args = tuple(
        TensorSpec(t.op.name if k < len(rewritten.inputs) else "output", tuple(int(s) for s in t.shape), str(t.dtype))
        for k, t in enumerate([*rewritten.inputs, *rewritten.outputs])
    )
    layouts = {t.op.name: plan.layout(t.op) for t in graph.inputs if t.op.name not in plan.guests}
    out_op = graph.outputs[0].op
    layouts["output"] = plan.output_layouts.get(key(out_op), plan.layout(out_op))
    if keep_interface:
        for name in ACTIVATIONS:
            layouts[name] = Layout.identity(graph.shape(graph.op(name)))
    return LayoutProgram(
        workload=workload,
        requested=requested,
        layouts=layouts,
        prim_func=prim_func,
        args=args,
        guests=dict(plan.guests),
        conversions=rewritten.conversions,
        notes=tuple(plan.notes),
        keep_interface=keep_interface,
        compute_block=op.name,
        _plan=plan,
    )
