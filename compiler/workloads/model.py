"""Whole models: a `torch.export` file -> Relax -> fused tasks -> a tuned Relax VM executable -> an artifact.

    ep = load_exported_program(path)                   # safe: nothing from the file is evaluated (pt2.py)
    model = import_model(ep)                           # legalized and fused Relax, params, tasks
    model.tasks                                        # one per distinct fused PrimFunc, with its weight
    built = build_model(model, target, {task.workload_key: scheduled_mod, ...},
                        layouts={task.workload_key: TaskLayout(func_in_new_layouts, index_maps)})
    outs = run_model(built, inputs)                    # numpy in, numpy out
    write_model_artifact(dest, model, built, target, ...)  # lib.so, params.npz, manifest.json, run.py

Import: `relax.frontend.torch.from_exported_program(keep_params_as_input=True)`
(parameters stay arguments of "main", after the user inputs, so they ship
beside the library and are never baked into it), then `DecomposeOpsForInference`,
`LegalizeOps`, `AnnotateTIROpPattern`, `FoldConstant`, `FuseOps`, `FuseTIR`: the
fused PrimFuncs are what gets tuned. Tasks are deduplicated by the structural
hash of the PrimFunc (its name left out), and weighted by how many `call_tir`s
of "main" call one of its copies.

Build: scheduled PrimFuncs replace every copy of their task's function. A task
given a `TaskLayout` (its function rewritten for other buffer layouts) is swapped
in by `relax.transform.AlterOpImpl`, which wraps the call in `layout_transform`s;
`LiftTransformParams` then moves every parameter-only computation -- the weight
layout transforms, bias reshapes, batch-norm constants -- into
`main_transform_params`, which `build_model` runs once, so the parameters ship
already transformed; transforms of activations stay as conversions between
tasks. Element-wise producers and consumers inside a fused task share its
layout (FuseOps put them in the same PrimFunc); across tasks no propagation is
done yet (see docs/design.md).

Loading an upload safely: `load_exported_program` (`compiler.workloads.pt2`, re-exported here) checks
the archive and every string of the program's JSON that torch would evaluate, import or unpickle
before torch sees the file, and refuses what is not plain (see that module's docstring).

Layering: `compiler` never imports `tuner` or `service`. torch, TVM and numpy
are imported inside functions.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compiler.arrays import device

from .operators import TensorSpec
from .pt2 import DEFAULT_MAX_FILE_BYTES, ModelError, load_exported_program, short_error  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    import numpy as np
    import torch
    import tvm

DEFAULT_MAX_TENSOR_ELEMENTS = 1 << 28  # any input, parameter or intermediate tensor
MODEL_ARTIFACT_FILES = ("lib.so", "params.npz", "manifest.json", "run.py")
MODEL_MANIFEST_FORMAT = 1
COMPLEX_OPS = ("conv", "matmul", "dense")  # fused-function name parts that mark a complex op (ALT templates)


# ---------------------------------------------------------------------------
# Import and task extraction


@dataclass(frozen=True, eq=False)
class ModelTask:
    """One distinct fused PrimFunc of a model.

    Attributes:
        name: the fused function's name without numeric suffixes ("fused_conv2d_add_relu").
        workload_key: "<name>:<structural hash, 16 hex>:<arg shapes>:<dtype>", stable across imports.
        prim_func: the untuned PrimFunc, global symbol "main" (what `tuner.Task` takes).
        weight: how many times the model calls it.
        complex: it contains a convolution or a matrix product (ALT layout templates apply).
        functions: names of the model's global functions that are copies of it.
        args: its parameters (inputs, then outputs), with shapes and dtypes.
    """

    name: str
    workload_key: str
    prim_func: tvm.tirx.PrimFunc
    weight: int
    complex: bool
    functions: tuple[str, ...]
    args: tuple[TensorSpec, ...]


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
    """

    mod: tvm.IRModule
    params: list[np.ndarray]
    param_names: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    tasks: list[ModelTask] = field(default_factory=list)


def import_model(
    ep: torch.export.ExportedProgram,
    input_shapes: Sequence[Sequence[int]] | None = None,
    *,
    layout: str = "none",
    target: tvm.target.Target | str | None = None,
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS,
) -> ImportedModel:
    """torch.export program -> fused Relax, parameters and tasks.

    Args:
        ep: the exported program (static shapes).
        input_shapes: the user's input shapes, checked against the program's; None: the program's.
        layout: "none" (the operators' own layouts, NCHW) or "blocked" (graph-level layouts: every
            dense and depthwise conv2d in `N C/c H W c` with weights `O/o I/i KH KW i o`, the block factors from
            `conv_blocks`, propagated by `relax.transform.ConvertLayout`; see `MODEL_LAYOUTS`).
        target: what the block factors are chosen for (its vector width); None: "llvm" defaults.
        max_tensor_elements: largest accepted input, parameter or intermediate tensor.

    Raises:
        ModelError: "model" for unsupported operators (named) or a failed import;
            "input_shapes" for shapes that differ from the program's, dynamic
            shapes, or a tensor over `max_tensor_elements`.
    """
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.torch import from_exported_program

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

    try:
        mod = from_exported_program(ep, keep_params_as_input=True)
    except (AssertionError, ValueError, NotImplementedError, KeyError, TypeError) as e:
        found = re.search(r"Unsupported function types \[(.*?)\]", str(e))
        if found:
            ops = sorted(o.strip(" '\"") for o in found.group(1).split(","))
            raise ModelError("model", f"unsupported operator(s): {', '.join(ops)}") from e
        raise ModelError("model", f"import failed: {type(e).__name__}: {short_error(e)}") from e
    num_input = int(mod["main"].attrs["num_input"])
    mod, params = detach_params(mod)
    main = mod["main"]
    param_vars = list(main.params[num_input:])
    param_arrays = [p.numpy() for p in params.get("main", [])]
    assert len(param_arrays) == len(param_vars), f"{len(param_arrays)=} != {len(param_vars)=}"
    # the importer names "main"'s parameters after the fx placeholders ("p_conv1_weight")
    names_by_var = {s.arg.name: s.target for s in ep.graph_signature.input_specs if s.target}
    param_names = [names_by_var.get(v.name, v.name) for v in param_vars]
    inputs = [_spec(v.name, v.ty) for v in main.params[:num_input]]
    outputs = [_spec(f"output{i}", si) for i, si in enumerate(_flatten_sinfo(main.ret_ty))]
    for spec in [*inputs, *(TensorSpec(n, tuple(a.shape), str(a.dtype)) for n, a in
                            zip(param_names, param_arrays))]:
        if spec.size > max_tensor_elements:
            raise ModelError("input_shapes", f"tensor {spec.name} {'x'.join(map(str, spec.shape))} has "
                                             f"{spec.size} elements, more than the limit {max_tensor_elements}")

    if layout not in MODEL_LAYOUTS:
        raise ModelError("layout", f"unknown layout {layout!r}; one of {', '.join(MODEL_LAYOUTS)}")
    target = tvm.target.Target(target or "llvm") if not isinstance(target, tvm.target.Target) else target
    passes = [relax.transform.DecomposeOpsForInference()]
    if layout == "blocked":
        passes += [_clip_as_min_max(),
                   relax.transform.ConvertLayout({}, _blocked_conv_layouts(vector_lanes(target, "float32")))]
    # exp, erf, tanh and softmax as TVM's polynomial versions (`topi.fast_*`: float32-accurate, and unlike
    # the libm calls LLVM makes of the plain ones, they vectorize); after ConvertLayout, which they would stop
    passes += [_gelu_as_erf(), relax.transform.FastMathTransform()]
    seq = tvm.transform.Sequential([
        *passes,
        relax.transform.LegalizeOps({"relax.nn.conv2d": _legalize_conv2d}),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ])
    try:
        with target:  # topi's NCHWc conv2d asks for one
            fused = seq(mod)
    except Exception as e:  # an operator Relax imports but cannot legalize
        raise ModelError("model", f"lowering failed: {type(e).__name__}: {short_error(e)}") from e
    model = ImportedModel(fused, [np.ascontiguousarray(a) for a in param_arrays], param_names, inputs, outputs)
    model.tasks = extract_tasks(fused, max_tensor_elements=max_tensor_elements)
    return model


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
    from tvm.target.codegen import llvm_get_vector_width

    return max(1, llvm_get_vector_width(target) // bits)


def conv_blocks(out_channels: int, in_channels: int, lanes: int) -> tuple[int, int]:
    """(output block o, input block i) of a conv2d in the blocked layout: the largest power of two up
    to `lanes` that divides the channel count; a channel count below `lanes` that no power of two
    >= 4 divides (3 RGB channels) is one whole block."""

    def block(c: int) -> int:
        if c <= lanes and all(c % b for b in (4, 8, 16, 32, 64) if b <= c):
            return c
        return next(b for b in (64, 32, 16, 8, 4, 2, 1) if b <= lanes and c % b == 0)

    return block(out_channels), block(in_channels)


def _blocked_conv_layouts(lanes: int) -> Any:
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


def _clip_as_min_max() -> Any:
    """A pass: `clip(x, lo, hi)` -> `minimum(maximum(x, lo), hi)` (ReLU6). ConvertLayout has no layout
    rule for clip and would convert the blocked tensor back to NCHW around every ReLU6 (MobileNet-V2:
    70 conversions); the element-wise maximum and minimum with a scalar carry the layout through."""
    from tvm import relax
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

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
    from tvm import relax
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

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


def _legalize_conv2d(bb: Any, call: Any) -> Any:
    """Relax's conv2d legalization, plus the blocked layout (`topi.nn.conv2d_NCHWc`), which it leaves alone."""
    from tvm import relax, topi

    attrs = call.attrs
    if len(attrs.data_layout) == 4 and len(attrs.kernel_layout) == 4:
        return relax.transform.legalize_ops.nn._nn_conv2d(bb, call)
    args = (call.args[0], call.args[1], attrs.strides, attrs.padding, attrs.dilation, attrs.data_layout,
            attrs.out_layout, attrs.out_dtype or "float32")
    if int(attrs.groups) > 1:  # `_blocked_conv_layouts` blocks only depthwise among grouped convs
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


def _spec(name: str, sinfo: Any) -> TensorSpec:
    shape = tuple(int(d) for d in sinfo.shape)
    return TensorSpec(name, shape, str(sinfo.dtype))


def _flatten_sinfo(sinfo: Any) -> list[Any]:
    from tvm import relax

    if isinstance(sinfo, relax.TupleType):
        return [s for f in sinfo.fields for s in _flatten_sinfo(f)]
    return [sinfo]


def _call_counts(main: Any) -> dict[str, int]:
    """How often "main" calls each global function with call_tir on data that depends on a user
    input. Calls on parameters and constants alone (weight layout transforms, batch-norm constants)
    are left out: `build_model` moves them to build time."""
    import tvm
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    counts: dict[str, int] = {}
    live = set(main.params[:int(main.attrs["num_input"])])
    for block in main.body.blocks:
        for binding in block.bindings:
            if not any(v in live for v in relax.analysis.free_vars(binding.value)):
                continue
            live.add(binding.var)
            expr = binding.value
            if isinstance(expr, relax.Call) and expr.op.same_as(call_tir) and isinstance(expr.args[0], tvm.ir.GlobalVar):
                name = expr.args[0].name_hint
                counts[name] = counts.get(name, 0) + 1
    return counts


def _func_args(func: Any) -> tuple[TensorSpec, ...]:
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return tuple(TensorSpec(f"arg{i}", tuple(int(d) for d in a.shape), str(a.dtype))
                 for i, a in enumerate(ArgInfo.from_prim_func(func)))


def structural_key(func: Any) -> int:
    """The structural hash of a PrimFunc, its name and global symbol left out."""
    import tvm_ffi

    return int(tvm_ffi.structural_hash(func.without_attr("global_symbol"), map_free_vars=True))


def extract_tasks(mod: tvm.IRModule, *, max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS) -> list[ModelTask]:
    """One task per distinct PrimFunc called by "main" (structural hash), weighted by its calls.

    Raises:
        ModelError: "input_shapes" when an intermediate tensor exceeds `max_tensor_elements`.
    """
    import tvm

    counts = _call_counts(mod["main"])
    groups: dict[int, list[tuple[str, Any]]] = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and counts.get(gv.name_hint):
            groups.setdefault(structural_key(func), []).append((gv.name_hint, func))
    tasks = []
    for digest, members in groups.items():
        members.sort()
        name = re.sub(r"\d+(?=_|$)", "", members[0][0])
        func = members[0][1]
        args = _func_args(func)
        for spec in args:
            if spec.size > max_tensor_elements:
                raise ModelError("input_shapes", f"tensor {spec.name} {'x'.join(map(str, spec.shape))} of {name} "
                                                 f"has {spec.size} elements, more than the limit {max_tensor_elements}")
        shapes = ",".join("x".join(map(str, a.shape)) for a in args)
        dtypes = sorted({a.dtype for a in args})
        key = f"{name}:{digest & (2**64 - 1):016x}:{shapes}:{'/'.join(dtypes)}"
        tasks.append(ModelTask(
            name=name, workload_key=key, prim_func=func.with_attr("global_symbol", "main"),
            weight=sum(counts[n] for n, _ in members), complex=any(p in name for p in COMPLEX_OPS),
            functions=tuple(n for n, _ in members), args=args,
        ))
    tasks.sort(key=lambda t: (-t.weight, t.name, t.workload_key))
    return tasks


# ---------------------------------------------------------------------------
# Build and run


def _scheduled_func(scheduled: Any) -> Any:
    import tvm

    if isinstance(scheduled, tvm.IRModule):
        funcs = [f for _, f in scheduled.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
        assert len(funcs) == 1, f"a scheduled task module must hold one PrimFunc, got {len(funcs)}"
        scheduled = funcs[0]
    return scheduled


@dataclass(frozen=True, eq=False)
class TaskLayout:
    """A task's program in other buffer layouts (graph-level layout, ALT sec. 4.2).

    Attributes:
        prim_func: the task's PrimFunc rewritten for the new layouts (e.g. by `Schedule.transform_layout`
            or an ALT layout program); same arguments in the same order, new shapes.
        index_maps: one per argument (inputs, then outputs): old index -> new index, as an
            `IndexMap` or a lambda; None keeps that argument's layout.
    """

    prim_func: Any
    index_maps: tuple[Any, ...]


@dataclass(eq=False)
class BuiltModel:
    """A compiled model and the arguments it takes after the inputs.

    Attributes:
        ex: the `relax.VMExecutable`; `vm["main"](*inputs, *params)`.
        params: parameters transformed at build time (`main_transform_params` run once: packed
            weights for tasks with layouts, parameter-only arithmetic), in call order.
    """

    ex: Any
    params: list[np.ndarray]


def apply_schedules(model: ImportedModel, schedules: Mapping[str, Any],
                    layouts: Mapping[str, TaskLayout] | None = None) -> tvm.IRModule:
    """`model.mod` with the PrimFunc of every task in `schedules` (workload key -> scheduled
    IRModule or PrimFunc) replaced by its scheduled version. A scheduled function has the task's
    signature, or its layout's (`layouts[key].prim_func`) when the task has one; a task with a
    layout but no schedule gets the layout's function. Tasks with a layout are marked with an
    "operator_name" ("altune_task<i>") for `AlterOpImpl`; nothing else is changed here."""
    import tvm

    layouts = dict(layouts or {})
    mod = model.mod
    by_key = {t.workload_key: t for t in model.tasks}
    unknown = (set(schedules) | set(layouts)) - set(by_key)
    assert not unknown, f"schedules or layouts for workload keys the model does not have: {sorted(unknown)}"
    updates = {}
    for key in [*schedules, *(k for k in layouts if k not in schedules)]:
        task = by_key[key]
        func = _scheduled_func(schedules[key]) if key in schedules else layouts[key].prim_func
        want = _func_args(layouts[key].prim_func) if key in layouts else task.args
        got = _func_args(func)
        assert [(a.shape, a.dtype) for a in got] == [(a.shape, a.dtype) for a in want], (
            f"scheduled {task.name} has arguments {got}, expected {want}")
        for name in task.functions:
            if key in layouts:  # AlterOpImpl swaps the function in; the original stays, marked
                new = mod[name].with_attr("operator_name", _operator_name(model, key))
            else:
                new = func.without_attr("global_symbol")
                if key in schedules:  # tuned: the default schedule of `build_model` leaves it alone
                    new = new.with_attr("tirx.is_scheduled", True)
                original = mod[name]
                if original.attrs is not None and "global_symbol" in original.attrs:
                    new = new.with_attr("global_symbol", original.attrs["global_symbol"])
            updates[mod.get_global_var(name)] = new
    if not updates:
        return mod
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in updates.items():
        out[gv] = func
    return out


def default_cpu_schedule(func: tvm.tirx.PrimFunc, cores: int, lanes: int) -> tvm.tirx.PrimFunc:
    """A cheap schedule for a PrimFunc nobody tuned (element-wise, pooling, layout conversions, a task the
    budget did not reach). Without it such functions run on one thread in TE's loop order.

    dlight's preamble (`normalize_prim_func`, `try_inline_contiguous_spatial`), then for every block left:
    its leading spatial loops fused and parallel (until `cores * 8` iterations), its innermost loop
    vectorized when spatial and at most `4 * lanes` long. A step TVM refuses is skipped, and a function
    dlight cannot normalize is returned as it is, so the result is never wrong, at worst unscheduled.
    """
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline_contiguous_spatial

    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return func
    for info in try_inline_contiguous_spatial(sch, infos):
        loops = info.get_loops()
        kinds = [it.kind for it in info.iters]
        extents = [int(sch.get(loop).extent) for loop in loops]
        vector = bool(loops) and kinds[-1] == "S" and 1 < extents[-1] <= 4 * lanes
        picked, total = [], 1
        for i, (kind, extent) in enumerate(zip(kinds, extents)):
            if kind != "S" or total >= cores * 8 or (vector and i == len(loops) - 1 and picked):
                break
            picked.append(loops[i])
            total *= extent
        if vector:
            _try(sch.vectorize, loops[-1])
        if total > 1:
            _try(lambda: sch.parallel(sch.fuse(*picked) if len(picked) > 1 else picked[0]))
    return sch.mod["main"]


def _default_schedules(target: Any) -> Any:
    """dlight's `ApplyDefaultSchedule` pass with `default_cpu_schedule` as its one rule."""
    from tvm.s_tir.dlight.base import ApplyDefaultSchedule, ScheduleRule
    from tvm.s_tir import Schedule

    cores = int(target.attrs.get("num-cores", 1) or 1)
    lanes = vector_lanes(target)

    @ScheduleRule.from_callable("altune_cpu_default")
    def rule(func: Any, _target: Any, _tunable: bool) -> Any:
        return Schedule(default_cpu_schedule(func, cores, lanes))

    return ApplyDefaultSchedule(rule)


def _try(step: Any, *args: Any) -> None:
    try:
        step(*args)
    except Exception:  # noqa: BLE001 - a schedule step TVM refuses here is skipped (ScheduleError and kin)
        pass


def _operator_name(model: ImportedModel, key: str) -> str:
    return f"altune_task{[t.workload_key for t in model.tasks].index(key)}"


def _identity_map(ndim: int) -> Any:
    from tvm.tirx import IndexMap

    return IndexMap.from_func(lambda *idx: list(idx), ndim=ndim)


def alter_layouts(model: ImportedModel, mod: tvm.IRModule, schedules: Mapping[str, Any],
                  layouts: Mapping[str, TaskLayout]) -> tvm.IRModule:
    """Swaps in the layout functions with `relax.transform.AlterOpImpl`, which wraps each call in
    `layout_transform`s: on a parameter they are lifted to build time by `LiftTransformParams`
    (see `build_model`); on an activation they stay as runtime conversions."""
    from tvm import relax
    from tvm.tirx import IndexMap

    if not layouts:
        return mod
    impls, transforms = {}, {}
    for key, layout in layouts.items():
        name = _operator_name(model, key)
        func = _scheduled_func(schedules[key]) if key in schedules else layout.prim_func
        impls[name] = func.without_attr("global_symbol").with_attr("operator_name", name)
        if key in schedules:
            impls[name] = impls[name].with_attr("tirx.is_scheduled", True)
        task = next(t for t in model.tasks if t.workload_key == key)
        assert len(layout.index_maps) == len(task.args), (
            f"{task.name}: {len(layout.index_maps)} index maps for {len(task.args)} arguments")
        transforms[name] = [
            _identity_map(len(arg.shape)) if m is None else (m if isinstance(m, IndexMap) else IndexMap.from_func(m))
            for m, arg in zip(layout.index_maps, task.args)
        ]
    return relax.transform.AlterOpImpl(impls, transforms)(mod)


def build_model(
    model: ImportedModel, target: tvm.target.Target, schedules: Mapping[str, Any] | None = None,
    layouts: Mapping[str, TaskLayout] | None = None,
) -> BuiltModel:
    """Compiles the model with the given task schedules and layouts (untuned PrimFuncs elsewhere).

    Args:
        model: from `import_model`.
        target: the TVM target.
        schedules: workload key -> scheduled IRModule/PrimFunc (e.g. `tuner.apply_config`'s result).
        layouts: workload key -> the task in other buffer layouts; weights are transformed here,
            once, activations by conversions between the tasks.

    Returns:
        The executable and its (build-time transformed) parameters.
    """
    import numpy as np
    import tvm
    from tvm import relax

    schedules, layouts = dict(schedules or {}), dict(layouts or {})
    mod = apply_schedules(model, schedules, layouts)
    mod = alter_layouts(model, mod, schedules, layouts)
    # parameter-only work (layout transforms of weights, bias reshapes, batch-norm constants) moves to
    # "main_transform_params", run once below; what it adds is legalized like the rest
    mod = relax.transform.LiftTransformParams()(mod)
    mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.DeadCodeElimination()])(mod)
    lower = tvm.transform.Sequential(_lower_passes())
    with target:
        if target.kind.name == "llvm":  # every function not tuned (marked "tirx.is_scheduled") gets a cheap one
            mod = _default_schedules(target)(mod)
        ex = relax.build(mod, target=target, relax_pipeline=lower)
    dev = device(target)
    vm = relax.VirtualMachine(ex, dev)
    transformed = vm["main_transform_params"]([tvm.runtime.tensor(p, dev) for p in model.params])
    return BuiltModel(ex, [np.ascontiguousarray(t.numpy()) for t in _flatten_tensors(transformed)])


def _flatten_tensors(out: Any) -> list[Any]:
    if hasattr(out, "numpy"):
        return [out]
    return [a for item in out for a in _flatten_tensors(item)]


def _lower_passes() -> list[Any]:
    """What relax's default pipeline runs after fusion (the CPU backend's dataflow-lower and finalize lists)."""
    from tvm import relax

    return [
        relax.transform.RewriteDataflowReshape(),
        relax.transform.ToNonDataflow(),
        relax.transform.RemovePurityChecking(),
        relax.transform.CallTIRRewrite(),
        relax.transform.StaticPlanBlockMemory(),
        relax.transform.LowerAllocTensor(),
        relax.transform.KillAfterLastUse(),
        relax.transform.LowerRuntimeBuiltin(),
        relax.transform.ComputePrimValue(),
        relax.transform.VMShapeLower(),
        relax.transform.AttachGlobalSymbol(),
    ]


def flatten_outputs(out: Any) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [a for item in out for a in flatten_outputs(item)]


def run_model(built: BuiltModel, inputs: Sequence[np.ndarray], target: Any = "llvm") -> list[np.ndarray]:
    """Runs the built model once on numpy inputs; the outputs flattened, as numpy."""
    import numpy as np
    import tvm
    from tvm import relax

    dev = device(target)
    vm = relax.VirtualMachine(built.ex, dev)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    args += [tvm.runtime.tensor(p, dev) for p in built.params]
    return flatten_outputs(vm["main"](*args))


def time_model(built: BuiltModel, inputs: Sequence[np.ndarray], target: Any = "llvm", *,
               repeat: int = 5, min_repeat_ms: float = 50.0) -> float:
    """Median latency (ms) of one model run: `time_evaluator` over the VM's "main"."""
    import statistics

    import numpy as np
    import tvm
    from tvm import relax

    dev = device(target)
    vm = relax.VirtualMachine(built.ex, dev)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    args += [tvm.runtime.tensor(p, dev) for p in built.params]
    timer = vm.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=int(min_repeat_ms))
    return statistics.median(timer(*args).results) * 1e3


# ---------------------------------------------------------------------------
# The artifact

RUN_PY = '''"""Loads and runs this altune model artifact with TVM's runtime (no altune needed).

    python run.py                      # random inputs, prints output shapes
    python run.py inputs.npz out.npz   # inputs named as in manifest.json, outputs output0, output1, ...

From Python: `from run import load; run = load("."); outputs = run(*numpy_inputs)`.
"""

import json
import os
import sys
from pathlib import Path

# TVM's runtime runs one thread per two x86 cores unless told; the latencies in manifest.json used every core.
os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                             else os.cpu_count() or 1))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402


def load(folder="."):
    """A function numpy inputs -> list of numpy outputs, for the artifact unpacked in `folder`."""
    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    dev = tvm.device(manifest["device"], 0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(folder / "lib.so")), dev)
    with np.load(folder / "params.npz", allow_pickle=False) as npz:
        params = [tvm.runtime.tensor(npz[p["key"]], dev) for p in manifest["params"]]

    def flatten(out):
        return [out.numpy()] if hasattr(out, "numpy") else [a for o in out for a in flatten(o)]

    def run(*inputs):
        assert len(inputs) == len(manifest["inputs"]), f"{len(inputs)} inputs, expected {len(manifest['inputs'])}"
        args = [tvm.runtime.tensor(np.ascontiguousarray(a, dtype=s["dtype"]), dev)
                for a, s in zip(inputs, manifest["inputs"])]
        return flatten(vm["main"](*args, *params))

    run.manifest = manifest
    return run


def main(argv):
    run = load(Path(__file__).resolve().parent)
    specs = run.manifest["inputs"]
    if argv:
        with np.load(argv[0], allow_pickle=False) as npz:
            inputs = [npz[s["name"]] for s in specs]
    else:
        rng = np.random.default_rng(0)
        inputs = [rng.uniform(-1, 1, s["shape"]).astype(s["dtype"]) if s["dtype"].startswith("float")
                  else rng.integers(0, 100, s["shape"]).astype(s["dtype"]) for s in specs]
    outputs = run(*inputs)
    for i, out in enumerate(outputs):
        print(f"output{i}: shape {list(out.shape)} {out.dtype}")
    if len(argv) > 1:
        np.savez(argv[1], **{f"output{i}": o for i, o in enumerate(outputs)})


if __name__ == "__main__":
    main(sys.argv[1:])
'''


def make_model_manifest(model: ImportedModel, built: BuiltModel, target: Any, *, latency_ms: float | None = None,
                        tasks: Sequence[dict] = (), spec: dict | None = None) -> dict:
    """manifest.json of a model artifact: inputs, outputs, params (npz keys in call order), tasks."""
    import tvm

    def tensor(s: TensorSpec) -> dict:
        return {"name": s.name, "shape": list(s.shape), "dtype": s.dtype}

    kind = target.kind.name if hasattr(target, "kind") else str(target)
    return {
        "format": MODEL_MANIFEST_FORMAT,
        "kind": "model",
        "function": "main",
        "call": 'vm["main"](*inputs, *params)',
        "usage": "python run.py [inputs.npz [outputs.npz]]; or from run import load; outputs = load('.')(*inputs)",
        "inputs": [tensor(s) for s in model.inputs],
        "outputs": [tensor(s) for s in model.outputs],
        # the parameters "main" takes: the model's, transformed at build time (packed layouts), in call order
        "params": [{"key": f"p{i}", "shape": list(a.shape), "dtype": str(a.dtype)}
                   for i, a in enumerate(built.params)],
        "model_params": [{"name": n, "shape": list(a.shape), "dtype": str(a.dtype)}
                         for n, a in zip(model.param_names, model.params)],
        "tasks": list(tasks) or [{"name": t.name, "workload_key": t.workload_key, "weight": t.weight,
                                  "complex": t.complex} for t in model.tasks],
        "target": str(target),
        "device": "cpu" if kind == "llvm" else kind,
        "latency_ms": latency_ms,
        "spec": spec or {},
        "tvm_version": tvm.__version__,
    }


def write_model_artifact(dest: str | os.PathLike, model: ImportedModel, built: BuiltModel, target: Any, *,
                         latency_ms: float | None = None, tasks: Sequence[dict] = (),
                         spec: dict | None = None) -> Path:
    """Writes the model artifact (.tar.gz, atomically): lib.so, params.npz, manifest.json, run.py.

    Args:
        dest: the .tar.gz path (parents created, an existing file replaced).
        model: the imported model.
        built: `build_model`'s result (its library and transformed parameters are written).
        target: the target it was built for.
        latency_ms: measured end-to-end latency, if any.
        tasks: per-task facts for the manifest (name, key, weight, latency...); the model's tasks when empty.
        spec: the job spec, recorded as given.
    """
    import numpy as np

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    manifest = make_model_manifest(model, built, target, latency_ms=latency_ms, tasks=tasks, spec=spec)
    with tempfile.TemporaryDirectory(prefix="altune-model-") as tmp:
        folder = Path(tmp)
        built.ex.export_library(str(folder / "lib.so"))
        np.savez(folder / "params.npz", **{f"p{i}": a for i, a in enumerate(built.params)})
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        (folder / "run.py").write_text(RUN_PY)
        partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
        try:
            with tarfile.open(partial, "w:gz") as tar:
                for name in MODEL_ARTIFACT_FILES:
                    tar.add(folder / name, arcname=name)
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
    return dest


def extract_model_artifact(path: str | os.PathLike, dest_dir: str | os.PathLike) -> Path:
    """Extracts the known files of a model artifact (regular files only, no paths) into `dest_dir`."""
    from compiler.build import extract_artifact

    return extract_artifact(path, dest_dir, MODEL_ARTIFACT_FILES)


def torch_outputs(module: Any, inputs: Sequence[Any]) -> list[np.ndarray]:
    """A torch module's outputs on numpy or torch inputs, flattened, as numpy (the reference)."""
    import numpy as np
    import torch

    def flatten(out: Any) -> list[np.ndarray]:
        if isinstance(out, torch.Tensor):
            return [out.detach().numpy()]
        return [a for o in out for a in flatten(o)]

    tensors = [torch.from_numpy(np.asarray(a)) if not isinstance(a, torch.Tensor) else a for a in inputs]
    with torch.no_grad():
        return flatten(module(*tensors))
