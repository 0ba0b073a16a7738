"""MetaSchedule on a whole model (`bench.models`): TVM's Relax tuning flow at our budget, and the checks that trace a
wrong whole-model output to its tasks.

Its weights are marked layout-free and prepacked once, as `relax.pipeline.static_shape_tuning_pipeline(
cpu_weight_prepack=True)` does, step by step so that the tuning gets our builder; one change to TVM's flow: a weight
that a function reads only in part is not marked layout-free (`whole_layout_free`), because `RewriteLayout` packs
such a buffer wrongly.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from torch.export import ExportedProgram
from tvm import relax, s_tir, sym, tirx
from tvm.relax.frontend.torch import from_exported_program
from tvm.s_tir import meta_schedule as ms
from tvm_ffi import structural_equal

from bench.baselines import build_and_run, fast_tvmscript_import, quiet_metaschedule, random_args, target_cores
from compiler.arrays import check_close
from compiler.workloads.model import translate


def run_metaschedule(ep: ExportedProgram, target: tvm.target.Target, budget: int, seed: int, work_dir: Path,
                     trials_per_iter: int, quantized: bool = False, translated: bool = False) -> dict:
    """MetaSchedule's Relax flow at the same budget, weights layout-free and prepacked once (TVM's
    `static_shape_tuning_pipeline(cpu_weight_prepack=True)`, step by step so that the tuning gets our builder);
    returns its executable, the transformed parameters and the tuning time. A `quantized` program, which TVM's
    importer cannot read (torch's quantized_decomposed operators), is given our translation
    (`compiler.workloads.model.translate`: the quantized convs and linears as u8 x s8 -> s32 operators, the
    program ours starts from too); so is a bfloat16 one (`translated`: TVM's converters make its convs and matmuls
    float32 and then fail on the bf16 bias), and one with an operator TVM's importer lacks (text_cnn's `amax`;
    `metaschedule_importer` says which importer made the program MetaSchedule tuned)."""
    importer = "ours" if quantized or translated else "tvm"
    if importer == "tvm":
        try:
            program = from_exported_program(ep, keep_params_as_input=True)
        except AssertionError as e:  # "Unsupported function types ['amax.default']"
            if "Unsupported function types" not in str(e):
                raise
            importer = "ours"
    if importer == "ours":
        program = translate(ep)
    mod, params = relax.frontend.detach_params(program)
    cores = target_cores(target)
    fast_tvmscript_import()
    # here, not at the top: only after `fast_tvmscript_import` does it take seconds instead of a minute
    import tvm.s_tir.tensor_intrin  # noqa: F401 - start-up, not search

    run_dir = Path(tempfile.mkdtemp(prefix="ms-model-", dir=work_dir))
    start = time.perf_counter()
    with target:
        # the steps of static_shape_tuning_pipeline before tuning: the weights (parameters after the
        # inputs) marked layout-free in the fused PrimFuncs
        mod = tvm.transform.Sequential([
            relax.transform.DecomposeOpsForInference(), relax.transform.CanonicalizeBindings(),
            relax.get_pipeline("zero"), relax.transform.AttachAttrLayoutFreeBuffers(),
        ])(mod)
    mod, partly = whole_layout_free(mod)
    with quiet_metaschedule(run_dir / "logs"):
        extracted = ms.relax_integration.extract_tasks(mod, target)
        # its task scheduler first gives every task one iteration in turn: iterations larger than the budget's
        # share per task would spend it all before the last tasks (MobileNet-V2's 34 at 64 reached 18 of 34)
        trials_per_iter = min(trials_per_iter, max(1, budget // max(1, len(extracted))))
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(extracted, str(run_dir), seed=seed)
        database = ms.tune.tune_tasks(
            tasks=contexts, task_weights=weights, work_dir=str(run_dir), max_trials_global=budget,
            num_trials_per_iter=trials_per_iter,
            builder=ms.builder.LocalBuilder(max_workers=cores, initializer=fast_tvmscript_import),
        )
    tune_s = time.perf_counter() - start
    records = database.get_all_tuning_records()
    with target, tvm.transform.PassContext(opt_level=3):
        # and after: the database applied, the layout rewrites split off and lifted into main_transform_params
        applied = relax.transform.MetaScheduleApplyDatabase(str(run_dir))(mod)
        final = tvm.transform.Sequential([
            relax.transform.SplitLayoutRewritePreproc(), relax.transform.LiftTransformParams(),
            relax.transform.FoldConstant(),
        ])(applied)
        ex = tvm.compile(final, target=target)
    vm = relax.VirtualMachine(ex, tvm.cpu(0))
    transformed = vm["main_transform_params"]([tvm.runtime.tensor(p, tvm.cpu(0)) for p in params["main"]])
    return {"ex": ex, "params": [np.ascontiguousarray(t.numpy()) for t in transformed],
            "check": lambda: wrong_tasks(mod, applied, target), "metaschedule_not_layout_free": partly,
            "metaschedule_importer": importer,
            "metaschedule_tune_s": tune_s, "metaschedule_trials": len(records),
            "metaschedule_trials_per_iter": trials_per_iter, "metaschedule_tasks": len(extracted),
            "metaschedule_tuned_tasks": len({tvm_ffi.structural_hash(r.workload.mod) for r in records})}


def partly_read(prim_func: Any) -> list[int]:
    """The parameters of `prim_func` that some block reads only part of: a read region that, over the block's
    iteration domain, covers less than the buffer (a `strided_slice` of a weight, as BERT's position table)."""
    sch = s_tir.Schedule(prim_func)
    func = sch.mod["main"]
    params = list(enumerate(func.params))
    analyzer = sym.Analyzer()
    partly = set()
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        dom = {iv.var: sym.IntervalSet(iv.dom.min, iv.dom.min + iv.dom.extent - 1) for iv in block.iter_vars}
        for region in block.reads:
            i = next((j for j, b in params if b.same_as(region.source)), None)
            if i is None:
                continue
            for r, size in zip(region.region, region.source.shape):
                lo = analyzer.int_set(r.min, dom).min_value
                hi = analyzer.int_set(r.min + r.extent - 1, dom).max_value
                bounded = isinstance(lo, tirx.IntImm) and isinstance(hi, tirx.IntImm)  # not a gather's index
                if bounded and (lo.value > 0 or hi.value < int(size) - 1):
                    partly.add(i)
    return sorted(partly)


def whole_layout_free(mod: Any) -> tuple[Any, list[str]]:
    """`mod` with every partly read parameter (`partly_read`) taken out of its PrimFunc's `layout_free_buffers`,
    and the names of those taken out (`function: parameter`). MetaSchedule's `RewriteLayout` packs a layout-free
    buffer by the index map of the part that is read, over the whole buffer, so the rows not read overwrite the
    ones read (BERT-tiny's position table, 128 of 512 rows read: `p_positions_global[v1 % 128, v2]`); such a
    buffer is left in its layout, and everything else stays as TVM's flow marks it."""
    out, taken = {}, []
    for gv, func in mod.functions.items():
        free = func.attrs.get("layout_free_buffers") if isinstance(func, tvm.tirx.PrimFunc) and func.attrs else None
        if free:
            partly = set(partly_read(func))
            kept = [int(i) for i in free if int(i) not in partly]
            taken += [f"{gv.name_hint}: {func.params[int(i)].name}" for i in free if int(i) in partly]
            if len(kept) < len(free):
                func = func.with_attr("layout_free_buffers", kept)
        out[gv] = func
    return tvm.IRModule(out, attrs=mod.attrs), taken


def wrong_tasks(before: Any, after: Any, target: Any, seed: int = 0) -> list[str]:
    """The PrimFuncs whose schedule (in `after`, the database applied, layout rewrites still inside) computes
    something other than the same function in `before` on random inputs: how a wrong whole-model output is
    traced to a task. Integer inputs are 0 (indices in range: TVM's fast `take` does not check them); where a
    function has several outputs, the last is compared."""
    originals = {gv.name_hint: func for gv, func in before.functions.items() if isinstance(func, tvm.tirx.PrimFunc)}
    wrong = []
    for gv, func in after.functions.items():
        orig = originals.get(gv.name_hint)
        if orig is None or not isinstance(func, tvm.tirx.PrimFunc) or structural_equal(orig, func):
            continue
        inputs = [a if a.dtype.kind == "f" or str(a.dtype) == "bfloat16" else np.zeros_like(a)
                  for a in random_args(orig, seed)]
        outs = []
        for f in (orig, func):
            mod = tvm.IRModule({"main": f.with_attr("global_symbol", "main")})
            outs.append(build_and_run(mod, orig, target, inputs)[2])
        if check_close(outs[1], outs[0]) is not None:  # a task's tolerance, as our own measurements check
            wrong.append(gv.name_hint)
    return wrong
