"""Build: scheduled (and re-laid-out) tasks swapped into the model, parameters transformed once, a Relax VM
executable; running and timing it.

Layering: `compiler` never imports `tuner` or `service`. torch is imported inside the functions that run the
exported program: building and running the model needs only TVM.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax, s_tir
from tvm.s_tir import Schedule
from tvm.s_tir.dlight.analysis import SBlockInfo, normalize_prim_func
from tvm.s_tir.dlight.base import ApplyDefaultSchedule, ScheduleRule, try_inline_contiguous_spatial
from tvm.tirx import IndexMap

from compiler.arrays import device
from compiler.passes.basteln import basteln
from compiler.pipeline import Pipeline, tir_pipeline
from compiler.target import target_info, vector_lanes

from .glue import GLUE_RULES, GlueRule
from .importer import ImportedModel
from .tasks import func_args


def _scheduled_func(scheduled: Any) -> Any:
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
    layouts = dict(layouts or {})
    mod = model.mod
    by_key = {t.workload_key: t for t in model.tasks}
    unknown = (set(schedules) | set(layouts)) - set(by_key)
    assert not unknown, f"schedules or layouts for workload keys the model does not have: {sorted(unknown)}"
    updates = {}
    for key in [*schedules, *(k for k in layouts if k not in schedules)]:
        task = by_key[key]
        func = _scheduled_func(schedules[key]) if key in schedules else layouts[key].prim_func
        want = func_args(layouts[key].prim_func) if key in layouts else task.args
        got = func_args(func)
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


# a block whose loop nest runs fewer iterations than this stays on one thread: waking the thread pool for a
# parallel loop costs a few microseconds (about 2 us on a 2-core VM), more than a small function's whole work
PARALLEL_MIN_WORK = 1 << 14


def default_cpu_schedule(func: tvm.tirx.PrimFunc, cores: int, lanes: int,
                         min_parallel_work: int = PARALLEL_MIN_WORK, *, glue: bool = True) -> tvm.tirx.PrimFunc:
    """A cheap schedule for a PrimFunc nobody tuned (element-wise, pooling, layout conversions, a task the
    budget did not reach). Without it such functions run on one thread in TE's loop order. A grouped chain of
    complex operators gets basteln's default tiling and fusion instead.

    dlight's preamble (`normalize_prim_func`, `try_inline_contiguous_spatial`), then for every block left: the
    first of `glue.GLUE_RULES` that takes it (means and pools in NCHWc, softmax's and layer norm's reductions
    along the contiguous axis, layout conversions: see `compiler.workloads.model.glue`), or the plain rule: its leading spatial loops
    fused and parallel (until `cores * 8` iterations), its innermost loop vectorized when spatial and at most
    `4 * lanes` long. Loops are parallel only in a block of at least `min_parallel_work` iterations. A step the
    plain rule cannot take is skipped; a glue rule TVM refuses half way sends the whole function to the plain
    rule; a function dlight cannot normalize is returned as it is. So the result is never wrong, at worst
    unscheduled.

    Args:
        glue: False: the plain rule for every block (what `bench.glue` compares the glue rules with).
    """
    if _grouped(func):  # a chain of complex operators (`compiler.passes.grouping`): basteln tiles and fuses it

        try:
            return basteln(func, None, 1.0, vector=4 * lanes).sch.mod["main"]
        except Exception:  # noqa: BLE001 - a program basteln cannot tile gets the plain schedule below
            pass
    if glue:
        try:
            return _schedule_blocks(func, cores, lanes, min_parallel_work, GLUE_RULES)
        except Exception:  # noqa: BLE001 - a glue rule TVM refused half way: the plain rule, from the start
            pass
    return _schedule_blocks(func, cores, lanes, min_parallel_work, ())


def _schedule_blocks(func: tvm.tirx.PrimFunc, cores: int, lanes: int, min_parallel_work: int,
                     rules: Sequence[GlueRule]) -> tvm.tirx.PrimFunc:
    """dlight's preamble, then each block by the first of `rules` that takes it, else by `_plain_block`."""
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return func
    for info in try_inline_contiguous_spatial(sch, infos):
        if not any(rule(sch, info, cores, lanes, min_parallel_work) for rule in rules):
            _plain_block(sch, info, cores, lanes, min_parallel_work)
    return sch.mod["main"]


def _plain_block(sch: Schedule, info: SBlockInfo, cores: int, lanes: int, min_parallel_work: int) -> None:
    """Leading spatial loops fused and parallel, the innermost vectorized when spatial and short; a step TVM
    refuses is skipped."""
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
    if total > 1 and math.prod(extents) >= min_parallel_work:
        _try(lambda: sch.parallel(sch.fuse(*picked) if len(picked) > 1 else picked[0]))


def _grouped(func: Any) -> bool:
    """A function `compiler.passes.grouping` merged from a chain (its "altune.grouped" attribute)."""
    attrs = getattr(func, "attrs", None)
    return attrs is not None and "altune.grouped" in attrs


def default_schedule(func: tvm.tirx.PrimFunc, target: Any) -> tvm.tirx.PrimFunc:
    """What `build_model` runs for a task without a tuned schedule on `target`: `default_cpu_schedule` with the
    target's cores and vector width on CPUs, the function as it is elsewhere. A tuned schedule is worth keeping
    only when it beats this."""
    if not target_info(target).is_cpu:
        return func
    cores = int(target.attrs.get("num-cores", 1) or 1)
    return default_cpu_schedule(func, cores, vector_lanes(target))


def _default_schedules(target: Any) -> Any:
    """dlight's `ApplyDefaultSchedule` pass with `default_cpu_schedule` as its one rule."""
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
    return IndexMap.from_func(lambda *idx: list(idx), ndim=ndim)


def alter_layouts(model: ImportedModel, mod: tvm.IRModule, schedules: Mapping[str, Any],
                  layouts: Mapping[str, TaskLayout]) -> tvm.IRModule:
    """Swaps in the layout functions with `relax.transform.AlterOpImpl`, which wraps each call in
    `layout_transform`s: on a parameter they are lifted to build time by `LiftTransformParams`
    (see `build_model`); on an activation they stay as runtime conversions."""
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
    layouts: Mapping[str, TaskLayout] | None = None, pipeline: Pipeline = "licm",
) -> BuiltModel:
    """Compiles the model with the given task schedules and layouts (untuned PrimFuncs elsewhere).

    Args:
        model: from `import_model`.
        target: the TVM target.
        schedules: workload key -> scheduled IRModule/PrimFunc (e.g. `tuner.apply_config`'s result).
        layouts: workload key -> the task in other buffer layouts; weights are transformed here,
            once, activations by conversions between the tasks.
        pipeline: the TIR pipeline of every function (`compiler.pipeline.tir_pipeline`; our LICM by default).

    Returns:
        The executable and its (build-time transformed) parameters.
    """
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
        if target_info(target).is_cpu:  # every function not tuned (marked "tirx.is_scheduled") gets a cheap one
            mod = _default_schedules(target)(mod)
        ex = relax.build(mod, target=target, relax_pipeline=lower, tir_pipeline=tir_pipeline(pipeline))
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
    dev = device(target)
    vm = relax.VirtualMachine(built.ex, dev)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    args += [tvm.runtime.tensor(p, dev) for p in built.params]
    return flatten_outputs(vm["main"](*args))


def time_model(built: BuiltModel, inputs: Sequence[np.ndarray], target: Any = "llvm", *,
               repeat: int = 5, min_repeat_ms: float = 50.0) -> float:
    """Median latency (ms) of one model run: `time_evaluator` over the VM's "main"."""
    dev = device(target)
    vm = relax.VirtualMachine(built.ex, dev)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    args += [tvm.runtime.tensor(p, dev) for p in built.params]
    timer = vm.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=int(min_repeat_ms))
    return statistics.median(timer(*args).results) * 1e3
