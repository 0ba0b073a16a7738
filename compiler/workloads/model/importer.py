"""Import: a loaded `torch.export` program -> legalized and fused Relax with its parameters and tasks.

Layering: `compiler` never imports `tuner` or `service`. torch is imported inside the functions that run the
exported program: building and running the model needs only TVM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard
from tvm.relax.frontend import detach_params

from compiler.passes.grouping import MAX_BYTES, Chain, find_chains, group_chains, grouped_name
from compiler.target import host_caches, vector_lanes

from ..operators import TensorSpec
from ..pt2 import ModelError, short_error
from .converters import translate
from .fold import fold_batch_norms
from .layouts import (
    MODEL_LAYOUTS,
    PLAIN,
    conv_sites,
    convert_layouts,
    group_blocks,
    layout_groups,
    unlegalized,
)
from .legalize import legalize_conv2d
from .tasks import DEFAULT_MAX_TENSOR_ELEMENTS, ModelTask, extract_tasks, flatten_sinfo, tensor_spec

if TYPE_CHECKING:
    import torch


# "chains": `compiler.passes.grouping` merges chains of complex operators; "auto": the chains whose intermediates
# exceed this machine's L2 are options a job decides by measuring (`lower_graph`)
MODEL_FUSIONS = ("none", "chains", "auto")


@dataclass(eq=False)
class ImportedModel:
    """A model as Relax, fused and legalized, with its parameters and tasks.

    Attributes:
        mod: the IRModule: "main" (Relax; inputs, then parameters) and the fused PrimFuncs.
        params: parameter arrays in "main"'s order after the inputs.
        param_names: their names ("conv1.weight").
        inputs: the user inputs ("x", shapes, dtypes).
        outputs: the outputs in flattened order.
        tasks: one per distinct fused PrimFunc, by descending weight then name.
        notes: what the import changed from the requested policy, in words (convolutions left in their own
            layout because TVM's layout pass or lowering failed with them blocked).
        blocks: the blocked convs' [input block, output block], by their weight's torch name ([0, 0], `PLAIN`:
            one the chosen blocks keep in NCHW); {} with no blocked conv.
        quantized: the program quantizes tensors (`quantize_per_tensor`, a PT2E-quantized model): its convs and
            linears compute in integers (`quantized`), and its outputs are checked with `check.tolerance`'s
            looser bound, since a value rounded to the other side of a quantization step moves what follows.
        chains: the chains of complex operators merged into one task each (`compiler.passes.grouping`).
        chain_options: fusion "auto": the chains a job may merge, left unmerged here (`fusion_options` gives
            each one's merged task; `with_chains` merges the ones it chose).
    """

    mod: tvm.IRModule
    params: list[np.ndarray]
    param_names: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    tasks: list[ModelTask] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    blocks: dict[str, list[int]] = field(default_factory=dict)
    quantized: bool = False
    chains: list[Chain] = field(default_factory=list)
    chain_options: list[Chain] = field(default_factory=list)


@dataclass(eq=False)
class ModelGraph:
    """A translated program before its layouts are chosen: what `lower_graph` lowers, once per layout choice
    (the graph-level layout search lowers one program many times and translates it once).

    Attributes:
        mod: Relax "main" (inputs, then parameters), inference-decomposed, not yet legalized.
        params, param_names, inputs, outputs: as in `ImportedModel`.
        names_by_var: "main"'s parameter names -> the torch names of the parameters ("p_conv1_weight" ->
            "conv1.weight").
        quantized: as in `ImportedModel`.
    """

    mod: tvm.IRModule
    params: list[np.ndarray]
    param_names: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    names_by_var: dict[str, str]
    quantized: bool = False

    def torch_name(self, var: str) -> str:
        return self.names_by_var.get(var, var)

    def var_name(self, torch_name: str) -> str | None:
        """The "main" parameter named after torch's `torch_name`, None when there is none."""
        return next((v for v, t in self.names_by_var.items() if t == torch_name), None)


def import_model(
    ep: torch.export.ExportedProgram,
    input_shapes: Sequence[Sequence[int]] | None = None,
    *,
    layout: str = "none",
    target: tvm.target.Target | str | None = None,
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS,
    fusion: str = "none",
    blocks: dict[str, Sequence[int]] | None = None,
) -> ImportedModel:
    """torch.export program -> fused Relax, parameters and tasks (`translate_model`, then `lower_graph`).

    Args:
        ep: the exported program (static shapes).
        input_shapes: the user's input shapes, checked against the program's; None: the program's.
        layout: "none" (the operators' own layouts, NCHW), "blocked" or "search" (graph-level layouts: every
            dense and depthwise conv2d in `N C/c H W c` with weights `O/o I/i KH KW i o`, the block factors from
            each layout group's default (`layout_groups`) or `blocks`, propagated by `relax.transform.ConvertLayout`
            and `carry_layouts`; see `MODEL_LAYOUTS`). Convs
            the layout pass fails on keep NCHW; a converted graph that fails to lower is lowered unconverted (see
            `notes`). "search" imports like "blocked": the job's graph-level search (`tuner.graph_layout`) then
            chooses the blocks.
        target: what the block factors are chosen for (its vector width); None: "llvm" defaults.
        max_tensor_elements: largest accepted input, parameter or intermediate tensor.
        fusion: "none" (Relax's own fusion: element-wise operators into a complex one), "chains" (also
            chains of complex operators into one task, `compiler.passes.grouping`, tiled and fused by basteln) or
            "auto" (the chains whose intermediates exceed the L2 cache left as options, `chain_options`).
        blocks: with "blocked", the (input block, output block) of convs named by their weight's torch name
            ("layer1.0.conv1.weight"), as the graph-level layout search chose them ([0, 0]: the conv keeps NCHW);
            the others by `conv_blocks`.

    Raises:
        ModelError: "model" for unsupported operators (named with their fx nodes), a failed conversion (operator
            and node) or an operator that cannot be lowered even in the model's own layouts;
            "input_shapes" for shapes that differ from the program's, dynamic
            shapes, or a tensor over `max_tensor_elements`; "layout" for an unknown layout or a block that
            names no conv or does not divide its channels.
    """
    graph = translate_model(ep, input_shapes, max_tensor_elements=max_tensor_elements)
    if blocks:
        blocks = graph_blocks(graph, blocks, target)
    return lower_graph(graph, layout=layout, target=target, max_tensor_elements=max_tensor_elements, fusion=fusion,
                       blocks=blocks)


def graph_blocks(graph: ModelGraph, blocks: dict[str, Sequence[int]], target: Any) -> dict[str, tuple[int, int]]:
    """User-facing blocks (torch weight names) -> "main"'s weight names, each checked against the conv's
    candidates (`ConvSite.in_blocks`, `out_blocks`).

    Raises:
        ModelError: "layout", naming the weight and what it accepts.
    """
    target = tvm.target.Target(target or "llvm") if not isinstance(target, tvm.target.Target) else target
    sites = {s.weight: s for s in conv_sites(graph.mod, vector_lanes(target, "float32"), target)}
    out: dict[str, tuple[int, int]] = {}
    for name, pair in blocks.items():
        var = graph.var_name(name) or (name if name in sites else None)
        site = sites.get(var) if var is not None else None
        if site is None:
            known = ", ".join(graph.torch_name(w) for w in sites) or "none"
            raise ModelError("layout", f"blocks: {name!r} is not the weight of a conv2d the blocked layout applies "
                                       f"to; the model's are: {known}")
        ib, ob = (int(b) for b in pair)
        if (ib, ob) == (PLAIN, PLAIN):  # the conv keeps the model's own layout
            out[site.weight] = (ib, ob)
            continue
        if ib not in site.in_blocks or ob not in site.out_blocks or (site.depthwise and ib != ob):
            raise ModelError("layout", f"blocks: {name!r} takes an input block in {list(site.in_blocks)} and an "
                                       f"output block in {list(site.out_blocks)}"
                                       f"{' (equal: a depthwise conv)' if site.depthwise else ''}, or "
                                       f"[{PLAIN}, {PLAIN}] to keep its own layout; got {[ib, ob]}")
        out[site.weight] = (ib, ob)
    return out


def translate_model(ep: torch.export.ExportedProgram, input_shapes: Sequence[Sequence[int]] | None = None, *,
                    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS) -> ModelGraph:
    """torch.export program -> Relax with its parameters detached, before layouts (see `import_model`)."""
    user_inputs = [s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    program_shapes = []
    for spec in user_inputs:
        val = placeholders[spec.arg.name].meta.get("val")
        shape = tuple(getattr(val, "shape", ()))
        if not all(isinstance(d, int) for d in shape):
            raise ModelError("input_shapes", f"input {spec.arg.name!r} has a dynamic shape {tuple(map(str, shape))}; "
                                             "export with static shapes")
        program_shapes.append(tuple(int(d) for d in shape))
    if input_shapes is not None:
        given = [tuple(int(d) for d in s) for s in input_shapes]
        if given != program_shapes:
            raise ModelError("input_shapes", f"the program was exported for input shapes {program_shapes}, "
                                             f"got {given}; export it again with these shapes")

    mod = translate(ep)
    num_input = int(mod["main"].attrs["num_input"])
    mod, params = detach_params(mod)
    main = mod["main"]
    param_vars = list(main.params[num_input:])
    param_arrays = [p.numpy() for p in params.get("main", [])]
    assert len(param_arrays) == len(param_vars), f"{len(param_arrays)=} != {len(param_vars)=}"
    main, param_arrays, _ = fold_batch_norms(main, param_vars, param_arrays)
    mod.update_func(mod.get_global_var("main"), main)
    # the importer names "main"'s parameters after the fx placeholders ("p_conv1_weight")
    names_by_var = {s.arg.name: s.target for s in ep.graph_signature.input_specs if s.target}
    param_names = [names_by_var.get(v.name, v.name) for v in param_vars]
    inputs = [tensor_spec(v.name, v.ty) for v in main.params[:num_input]]
    outputs = [tensor_spec(f"output{i}", si) for i, si in enumerate(flatten_sinfo(main.ret_ty))]
    for spec in [*inputs, *(TensorSpec(n, tuple(a.shape), str(a.dtype)) for n, a in
                            zip(param_names, param_arrays))]:
        if spec.size > max_tensor_elements:
            raise ModelError("input_shapes", f"tensor {spec.name} {'x'.join(map(str, spec.shape))} has "
                                             f"{spec.size} elements, more than the limit {max_tensor_elements}")

    mod = relax.transform.DecomposeOpsForInference()(mod)
    quantized = any(n.op == "call_function" and str(n.target).startswith("quantized_decomposed.quantize_")
                    for n in ep.graph.nodes)
    return ModelGraph(mod, [np.ascontiguousarray(a) for a in param_arrays], param_names, inputs, outputs,
                      names_by_var, quantized)


def lower_graph(graph: ModelGraph, *, layout: str = "none", target: tvm.target.Target | str | None = None,
                max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS, fusion: str = "none",
                blocks: dict[str, tuple[int, int]] | None = None) -> ImportedModel:
    """A translated program in a layout policy -> fused, legalized Relax and its tasks (see `import_model`;
    `blocks` is keyed by "main"'s weight names, as `graph_blocks` gives them).

    With fusion "auto" the chains of complex operators whose intermediates together exceed this machine's L2
    cache (smaller ones stay in cache between the calls) are the model's `chain_options`, left unmerged
    (`with_chains` merges the ones a job chose)."""
    names_by_var = graph.names_by_var
    mod = graph.mod
    if layout not in MODEL_LAYOUTS:
        raise ModelError("layout", f"unknown layout {layout!r}; one of {', '.join(MODEL_LAYOUTS)}")
    target = tvm.target.Target(target or "llvm") if not isinstance(target, tvm.target.Target) else target
    notes: list[str] = []
    fused, chosen = None, {}
    if layout in ("blocked", "search"):
        mod = _clip_as_min_max()(mod)
        # convolutions whose blocked layout TVM's layout pass or legalization cannot carry (a concat of other
        # blocks, ...) keep their own, with conversions at their boundary
        lanes = vector_lanes(target, "float32")
        if blocks is None:  # the rule: each layout group's default block (one for the tensors a concat joins)
            blocks = group_blocks(layout_groups(mod, lanes, target), {}, conv_sites(mod, lanes, target))
        for legalize in (False, True):  # the quick search first; the one that legalizes every try if it failed
            converted, left = convert_layouts(mod, lanes, target, legalize=legalize, blocks=blocks)
            try:
                fused = _lower(converted, target)
                chosen = {graph.torch_name(s.weight): list((blocks or {}).get(s.weight, s.default))
                          for s in conv_sites(mod, lanes, target) if s.weight not in left}
                break
            except Exception as e:  # noqa: BLE001 - TVM failed on the converted graph after the layout pass
                failed = f"{type(e).__name__}: {short_error(e, 160)}"
        if fused is None:
            chosen = {}
            notes.append(f"the blocked layout failed to lower ({failed}); every operator kept its own layout")
        elif left:
            named = [names_by_var.get(v, v) for v in left]
            notes.append(f"{len(left)} conv2d kept their own layout (NCHW), with conversions at their boundary: "
                         f"TVM's layout pass fails with them blocked ({', '.join(named[:8])}"
                         f"{', ...' if len(named) > 8 else ''})")
    if fused is None:
        try:
            fused = _lower(mod, target)
        except Exception as e:  # noqa: BLE001 - an operator Relax imports but cannot legalize: named if found
            raise ModelError("model", f"lowering failed{_failing_operator(mod, target)}: {type(e).__name__}: "
                                      f"{short_error(e)}") from e
    model = ImportedModel(fused, graph.params, graph.param_names, graph.inputs, graph.outputs, notes=notes,
                          blocks=chosen, quantized=graph.quantized)
    model.tasks = extract_tasks(fused, max_tensor_elements=max_tensor_elements)
    if fusion not in MODEL_FUSIONS:
        raise ModelError("fusion", f"unknown fusion {fusion!r}; one of {', '.join(MODEL_FUSIONS)}")
    if fusion == "chains":  # chains of complex operators become one task each, tiled and fused by basteln
        grouped = group_model(model, max_tensor_elements=max_tensor_elements)
        if grouped:
            model.notes.append(f"{len(grouped)} chain(s) of complex operators grouped into one task each")
    elif fusion == "auto":
        model.chain_options = find_chains(model.mod, min_bytes=host_caches().l2)
    return model


def with_chains(model: ImportedModel, chains: list[Chain], max_tensor_elements: int | None = None) -> ImportedModel:
    """A copy of `model` (fusion "auto", unmerged) with `chains`, some of its `chain_options`, merged; `model`
    itself when there are none."""
    if not chains:
        return model
    out = replace(model, notes=list(model.notes), chain_options=[])
    group_model(out, chains=list(chains), max_tensor_elements=max_tensor_elements)
    return out


def fusion_options(model: ImportedModel, max_tensor_elements: int | None = None) -> list[ModelTask | None]:
    """Each of `model.chain_options` merged into one function, as its task (None where the merged function is not
    one of its own: TVM fused it with another); the model itself is left unmerged."""
    if not model.chain_options:
        return []
    limit = {} if max_tensor_elements is None else {"max_tensor_elements": max_tensor_elements}
    mod, chains = group_chains(model.mod, chains=model.chain_options)
    tasks = extract_tasks(mod, **limit)
    by_function = {f: t for t in tasks for f in t.functions}
    return [by_function.get(grouped_name(c, k)) for k, c in enumerate(chains)]


def _lower(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Graph (Relax) after layout conversion -> legalized, fused PrimFuncs (what gets tuned)."""
    # exp, erf, tanh and softmax as TVM's polynomial versions (`topi.fast_*`: float32-accurate, and unlike
    # the libm calls LLVM makes of the plain ones, they vectorize); after ConvertLayout, which they would stop
    seq = tvm.transform.Sequential([
        _gelu_as_erf(),
        relax.transform.FastMathTransform(),
        relax.transform.LegalizeOps({"relax.nn.conv2d": legalize_conv2d}),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ])
    with target:  # topi's NCHWc conv2d asks for one
        lowered = seq(mod)
    left = unlegalized(lowered)
    if left:
        raise ValueError(f"operators not legalized in their layouts: {', '.join(left)}")
    return lowered


def _failing_operator(mod: tvm.IRModule, target: tvm.target.Target) -> str:
    """' at operator relax.X (lv3)' for the first call of "main" that cannot be lowered on its own, or '' when
    none can be singled out (the error is then in how operators combine)."""
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
                continue
            free = [a for a in call.args if isinstance(a, relax.Var)]
            args = [relax.Var(f"a{i}", a.ty) for i, a in enumerate(free)]
            params = dict(zip(free, args))
            body = relax.Call(call.op, [params.get(a, a) for a in call.args], call.attrs, call.ty_args)
            try:
                single = tvm.IRModule({"main": relax.Function(args, body, binding.var.ty)})
                _lower(single, target)
            except Exception:  # noqa: BLE001 - this one fails
                return f" at operator {call.op.name} ({binding.var.name})"
    return ""


def _clip_as_min_max() -> Any:
    """A pass: `clip(x, lo, hi)` -> `minimum(maximum(x, lo), hi)` (ReLU6). ConvertLayout has no layout
    rule for clip and would convert the blocked tensor back to NCHW around every ReLU6 (MobileNet-V2:
    70 conversions); the element-wise maximum and minimum with a scalar carry the layout through."""
    x, lo, hi = wildcard(), wildcard(), wildcard()
    pattern = is_op("relax.clip")(x, lo, hi)

    def rewrite(expr: Any, matches: Any) -> Any:
        dtype = expr.ty.dtype
        bounds = [getattr(matches[v], "value", None) for v in (lo, hi)]  # IntImm / FloatImm
        if not all(isinstance(b, int | float) for b in bounds):
            return expr
        low, high = (relax.const(float(b), dtype) for b in bounds)
        return relax.op.minimum(relax.op.maximum(matches[x], low), high)

    @relax.transform.function_pass(opt_level=0, name="ClipAsMinMax")
    def clip_as_min_max(func: Any, _mod: Any, _ctx: Any) -> Any:
        return rewrite_call(pattern, rewrite, func)

    return clip_as_min_max


def _gelu_as_erf() -> Any:
    """A pass: `gelu(x)` -> `x * (0.5 + 0.5 * erf(x / sqrt(2)))` and `gelu_tanh(x)` -> its tanh formula, in
    Relax element-wise ops, so `relax.transform.FastMathTransform` (which knows `erf` and `tanh`, not
    gelu) gives them its vectorizable polynomial `erf` / `tanh`."""
    x = wildcard()
    exact, tanh = is_op("relax.nn.gelu")(x), is_op("relax.nn.gelu_tanh")(x)

    def rewrite(expr: Any, matches: Any) -> Any:
        v, dtype = matches[x], str(expr.ty.dtype)
        if not dtype.startswith("float"):
            return expr
        c = lambda value: relax.const(value, dtype)  # noqa: E731
        if expr.op.name == "relax.nn.gelu":
            inner = relax.op.erf(relax.op.multiply(v, c(0.7071067811865476)))
        else:  # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
            cube = relax.op.multiply(relax.op.multiply(v, v), v)
            inner = relax.op.tanh(relax.op.multiply(
                relax.op.add(v, relax.op.multiply(cube, c(0.044715))), c(0.7978845608028654)))
        return relax.op.multiply(v, relax.op.add(c(0.5), relax.op.multiply(inner, c(0.5))))

    @relax.transform.function_pass(opt_level=0, name="GeluAsErf")
    def gelu_as_erf(func: Any, _mod: Any, _ctx: Any) -> Any:
        return rewrite_call(exact | tanh, rewrite, func)

    return gelu_as_erf


def group_model(model: ImportedModel, *, min_bytes: int | None = None, max_bytes: int = MAX_BYTES,
                max_tensor_elements: int | None = None, chains: list[Chain] | None = None) -> list[Chain]:
    """`compiler.passes.grouping.group_chains` on an imported model, in place: its module gets the merged
    functions and its tasks are extracted again (a merged chain is one task). `chains`: merge these (of this
    model's `find_chains`) instead of every chain found.

    Returns:
        The chains merged (none: the model is left as it was).
    """
    mod, chains = group_chains(model.mod, min_bytes=min_bytes, max_bytes=max_bytes, chains=chains)
    if chains:
        limit = {} if max_tensor_elements is None else {"max_tensor_elements": max_tensor_elements}
        model.mod = mod
        model.tasks = extract_tasks(mod, **limit)
        model.chains = list(chains)
    return chains
