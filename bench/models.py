"""End-to-end benchmark: whole models, ours vs TVM MetaSchedule (Relax integration, same budget) vs torch.

    python -m bench.models [--models NAME,...] [--budget N] [--json PATH] [--trials-per-round 8]
                           [--ms-trials-per-iter N]
                           [--layout blocked|search|none] [--also-layouts L,...] [--no-metaschedule] [--no-torch] [--no-untuned]
                           [--torch-variants eager,channels_last,compile] [--no-onnxruntime] [--rounds N]
                           [--quantize]

Models from `compiler.workloads.zoo` (ALT sec. 7.2 setup, batch 1): resnet18 and
mobilenet_v2 on 3x224x224, bert_tiny on 128 tokens. For each model, every side at its best:

- ours: what a model job with the same spec serves, by the same functions: the program translated
  (`translate_model`, as the job's sandbox does), `tuner.model.tune_model` (graph-level layouts: `--layout`,
  default "blocked", convs in N C/c H W c carried through the graph; "search" runs ALT's joint stage first;
  `--also-layouts blocked+chains` also tunes the model with chains of complex operators as one basteln task each,
  a job's `"fusion": "chains"`; every tunable task searched in rounds the gradient scheduler spreads, stored
  picks by re-measurement, kept only where they beat the task's default schedule) and `tuner.model.serve_model`
  (built, checked whole against torch with wrong schedules removed, the untuned build served when faster end to
  end, written as the artifact); the artifact's library and packed weights are what is timed. The one difference
  from a job: it runs in this process, not in the worker's confined children;
- MetaSchedule: TVM's own static-shape tuning flow with CPU weight prepacking
  (`relax.pipeline.static_shape_tuning_pipeline(cpu_weight_prepack=True)`, with our
  builder): the weights are parameters marked layout-free (`AttachAttrLayoutFreeBuffers`),
  `tune_relax`'s steps with `max_trials_global` = the same budget (`num_trials_per_iter`: `--ms-trials-per-iter`,
  by default our round size, at most the budget's share per task, since its task scheduler first gives every task
  one iteration; the row's `metaschedule_trials_per_iter`, and `metaschedule_tuned_tasks` of `metaschedule_tasks`
  have a record), the database applied, the
  layout rewrites split off and lifted into `main_transform_params`
  (`SplitLayoutRewritePreproc`, `LiftTransformParams`), run once; one change to TVM's flow: a weight
  that a function reads only in part (BERT's position table, sliced) is not marked layout-free there
  (`whole_layout_free`, `metaschedule_not_layout_free`), because `RewriteLayout` packs such a buffer
  wrongly (its rows not read overwrite the ones read); checked; an output that does not
  match is traced to the tasks whose tuned function computes something else than its untuned one on
  random inputs (`wrong_tasks`, `metaschedule_wrong_tasks`), and is not timed;
- torch: eager NCHW, channels_last and `torch.compile` (inductor, `freezing=True`), each
  reported (`torch_variants_ms`), the fastest the baseline (`torch_ms`);
- ONNX Runtime (CPU): the model exported by `torch.onnx.export` (dynamo), every graph
  optimization on (its NCHWc layout rewrite for x86 included), as many intra-op threads
  as torch; checked against torch once, then timed like the others (`onnxruntime_ms`,
  `vs_onnxruntime`).

`--quantize` benchmarks each model quantized by torchao's PT2E flow (`zoo.quantized`: uint8 activations,
int8 per-channel weights) on every side: ours imports it with its quantized convs and linears in integers
(`compiler.workloads.model.quantized`; in the dot-product form where the CPU has VNNI), MetaSchedule gets the
same translation, torch's variants run the quantized module (`compile`: inductor's int8 lowering to oneDNN);
ONNX Runtime is not run; results are checked within a quantization step (`QUANTIZED_RTOL`).

`--bf16` benchmarks each model in bfloat16 (`module.to(torch.bfloat16)`, floating inputs too): ours with its
convs and linears in the bf16 dot-product form (`vdpbf16ps` on AVX512_BF16), MetaSchedule from our translation,
torch's variants of the bf16 module (oneDNN's bf16 kernels); ONNX Runtime is not run; results are checked within
bfloat16's tolerance.

Every program (the untuned build, ours, MetaSchedule's, each torch variant, ONNX Runtime's) is timed in a
fresh process of its own, one at a time, in shuffled order (`bench.common.time_fresh`):
medians of `time_evaluator` repeats of at least 50 ms (torch: the same calibration in
Python); a row's latencies are the medians over `--rounds`, and `readings_ms` keeps every round's reading
(program -> ms, in the order taken). Prints a table and writes the report (the `bench.common` shape) to --json or
under bench/results/; with --json, also after every model but the last, so that an interrupted run keeps the
models it finished.

MetaSchedule's flow and its checks are `bench.models_metaschedule`, the torch factories `bench.torch_programs`,
ONNX Runtime's session `bench.timing_onnx` (their names re-exported here).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tvm
from tvm import relax

from bench.common import (TORCH_VARIANTS, Column, OnnxProgram, TorchProgram, TvmProgram, fmt_ms, fmt_s, fmt_x,
                          format_table, geomean, geomeans, save_args, speedup, time_fresh, write_json)
from bench.environment import environment
from bench.models_metaschedule import partly_read, run_metaschedule, whole_layout_free, wrong_tasks
from bench.timing_onnx import onnx_session
from bench.torch_programs import bf16, torch_bf16_model, torch_model, torch_quantized_model
from compiler.arrays import check_close, to_numpy
from compiler.target import resolve_target, target_key
from compiler.workloads import zoo
from compiler.workloads.model import (QUANTIZED_ATOL, QUANTIZED_RTOL, build_model, flatten_outputs, import_model,
                                      torch_outputs)
from compiler.workloads.model.artifact import extract_model_artifact
from compiler.workloads.model.importer import translate_model
from tuner import Measurer, make_measurer
from tuner.model import ModelTuneHooks, ModelTuneResult, serve_model, tune_model
from tuner.request import ModelTuneRequest
from tuner.task import best_trial

# what the tests and earlier callers reach through this module
__all__ = ["DEFAULT_MODELS", "artifact_program", "bf16", "main", "onnxruntime_program", "partly_read", "run_model",
           "run_metaschedule", "table", "torch_bf16_model", "torch_model", "torch_programs", "torch_quantized_model",
           "tune_ours", "whole_layout_free", "wrong_tasks"]


DEFAULT_MODELS = ("resnet18", "mobilenet_v2", "bert_tiny")


def _check(outs: list, expected: list, *, quantized: bool = False) -> str | None:
    """None when `outs` match `expected`; a quantized model's within `compiler.workloads.model.tolerance`'s bound
    (a value rounded across a quantization step moves what follows by one step)."""
    if len(outs) != len(expected):
        return f"{len(outs)} outputs, expected {len(expected)}"
    bounds = {"rtol": QUANTIZED_RTOL, "atol": QUANTIZED_ATOL} if quantized else {}
    for i, (out, ref) in enumerate(zip(outs, expected)):
        mismatch = check_close(out, ref, **bounds)
        if mismatch is not None:
            return f"output {i}: {mismatch}"
    return None


class _LogHooks(ModelTuneHooks):
    """Prints each round of the loop stage and the joint stage's choice to the benchmark's log."""

    def __init__(self, log: Any) -> None:
        self.log = log

    def on_layouts(self, blocks: dict, report: dict) -> None:
        print(f"    layout search: {len(report['rounds'])} choices, {report['measurements']} measurements, estimate "
              f"{fmt_ms(report['rule_estimate_ms'])} ms (rule) -> {fmt_ms(report['chosen_estimate_ms'])} ms",
              file=self.log, flush=True)

    def on_round(self, task: Any, result: Any) -> None:
        latency = result.best.latency_ms if result.best is not None else None
        print(f"      round: {task.name} (weight {task.weight}) +{len(result.trials)} trials, best "
              f"{fmt_ms(latency)} ms (untuned {fmt_ms(result.baseline_ms)})", file=self.log, flush=True)


def tune_ours(ep: Any, request: ModelTuneRequest, inputs: list, expected: list, dest: Path, log: Any,
              measurer: Measurer | None = None) -> tuple[dict, ModelTuneResult, dict]:
    """Ours as a model job runs it: the program translated (`translate_model`, what the job's sandbox does), tuned
    by `tuner.model.tune_model` and served by `tuner.model.serve_model` (built, checked whole against `expected`,
    timed, written as the artifact at `dest`): the functions the worker calls, here in this process. Returns the
    row's facts, the tuning result and `serve_model`'s answer."""
    measurer = measurer or make_measurer("local", pipeline=request.pipeline)
    start = time.perf_counter()
    try:
        tuned = tune_model(translate_model(ep), request, measurer=measurer, hooks=_LogHooks(log))
    finally:
        measurer.close()
    tune_s = time.perf_counter() - start
    served = serve_model(tuned.model, request, tuned.schedules, inputs, expected, dest=dest, facts=tuned.facts,
                         report=tuned.report)
    trials = [t for o in tuned.outcomes for t in o.trials]
    facts: dict[str, Any] = {
        "ours_tune_s": tune_s,
        "tasks": len(tuned.model.tasks),
        "tunable_tasks": len(tuned.outcomes),
        "tuned_tasks": len(served["served"]),
        "ours_trials": tuned.measurements,
        "ours_errors": sum(t.error is not None for t in trials),
        "ours_served": served["report"].get("served"),
        "task_rows": [
            {"name": o.model_task.name, "workload_key": o.task.workload_key, "weight": o.model_task.weight,
             "trials": len(o.trials), "best_ms": best_trial(o.trials).latency_ms if best_trial(o.trials) else None,
             "picked_ms": o.pick.latency_ms if o.pick else None, "default_ms": o.default_ms,
             "untuned_ms": o.untuned_ms}
            for o in tuned.outcomes
        ],
    }
    if tuned.layout_search is not None:
        facts["layout_search"] = {k: v for k, v in tuned.layout_search.items() if k != "note"}
    return facts, tuned, served


def artifact_program(artifact: Path, inputs: list, folder: Path) -> TvmProgram:
    """The served artifact (lib.so, its packed params) as a program for `time_fresh`."""
    extract_model_artifact(artifact, folder)
    with np.load(folder / "params.npz", allow_pickle=False) as npz:
        params = [npz[f"p{i}"] for i in range(len(npz.files))]
    return TvmProgram(str(folder / "lib.so"), save_args([*inputs, *params], folder / "args.npz"), vm=True)


def _ours_in(variant: str, ep: Any, target_name: str, budget: int, seed: int, options: dict, inputs: list,
             expected: list, folder: Path, log: Any) -> tuple[dict, Any]:
    """Ours in one graph-level layout ("search": the joint stage first, as a model job), "<layout>+chains" with
    chains of complex operators grouped into one basteln task each (a model job's `"fusion": "chains"`): the row's
    facts (ours_*, error) and the served artifact as a program (None when it failed)."""
    layout, _, fusion = variant.partition("+")
    request = ModelTuneRequest(target=target_name, budget=budget, seed=seed, layout=layout, fusion=fusion or "none",
                               trials_per_round=options["trials_per_round"])
    facts: dict[str, Any] = {"ours_ms": None, "ours_correct": False, "error": None, "ours_tune_s": 0.0}
    try:
        dest = folder / f"ours-{layout}-{request.fusion}.tar.gz"
        found, _, served = tune_ours(ep, request, inputs, expected, dest, log)
        facts.update(found)
        facts["ours_correct"] = served["error"] is None
        if served["error"] is None:
            return facts, artifact_program(dest, inputs, folder / f"ours-{layout}-{request.fusion}")
        facts["error"] = f"ours ({variant}): {served['error']}"
    except Exception as e:  # noqa: BLE001
        facts["error"] = f"ours ({variant}): {type(e).__name__}: {str(e)[:300]}"
    return facts, None


def _run_vm(ex: Any, inputs: list, params: list) -> list:
    """Runs a VM executable once on the inputs and the parameters it takes; its outputs."""
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    args += [tvm.runtime.tensor(p, dev) for p in params]
    return flatten_outputs(vm["main"](*args))


def _export_vm(ex: Any, inputs: list, params: list, path: Path) -> TvmProgram:
    """A VM executable exported with its arguments (inputs, then parameters), for `time_fresh`."""
    ex.export_library(str(path.with_suffix(".so")))
    return TvmProgram(str(path.with_suffix(".so")), save_args([*inputs, *params], path.with_suffix(".npz")), vm=True)


def torch_programs(name: str, seed: int, variants: Sequence[str], quantized: bool = False,
                   bfloat16: bool = False) -> dict[str, TorchProgram]:
    """The torch variants of zoo model `name` (channels_last only where an input is 4-D or 5-D), of its
    PT2E-quantized form where `quantized`, in bfloat16 where `bfloat16`."""
    _, inputs = zoo.create(name, seed)
    spatial = any(x.dim() in (4, 5) for x in inputs)
    factory = torch_quantized_model if quantized else torch_bf16_model if bfloat16 else torch_model
    return {f"torch_{v}": TorchProgram(factory, (name, seed), v) for v in variants
            if v != "channels_last" or spatial}


def onnxruntime_program(module: Any, torch_inputs: list, expected: list, folder: Path) -> tuple[dict, OnnxProgram | None]:
    """ONNX Runtime's side: `module` exported to ONNX (`torch.onnx.export`, dynamo), run once and checked
    against torch's `expected`; (facts for the row, the program to time or None when it failed)."""
    facts: dict[str, Any] = {"onnxruntime_correct": None, "onnxruntime_error": None}
    path = folder / "model.onnx"
    try:
        start = time.perf_counter()
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" per operator
        torch.onnx.export(module, tuple(torch_inputs), str(path), dynamo=True, verbose=False)
        facts["onnxruntime_export_s"] = round(time.perf_counter() - start, 2)
        arrays = [t.numpy() for t in torch_inputs]
        session = onnx_session(str(path), 1, spin=False)
        feeds = {spec.name: a for spec, a in zip(session.get_inputs(), arrays, strict=True)}
        mismatch = _check(session.run(None, feeds), expected)
        del session
    except Exception as e:  # noqa: BLE001
        facts["onnxruntime_error"] = f"ONNX Runtime failed: {type(e).__name__}: {str(e)[:300]}"
        return facts, None
    facts["onnxruntime_correct"] = mismatch is None
    if mismatch is not None:
        facts["onnxruntime_error"] = f"ONNX Runtime: {mismatch}"
        return facts, None
    return facts, OnnxProgram(str(path), save_args(arrays, folder / "onnx-inputs.npz"))


def run_model(name: str, target_name: str, budget: int, seed: int, options: dict, log: Any) -> dict:
    """All three on one zoo model; a failure of one is reported in the row, never raised."""
    target = resolve_target(target_name)
    quantized, bfloat16 = options.get("quantize", False), options.get("bf16", False)
    module, torch_inputs = zoo.quantized(name, seed) if quantized else zoo.create(name, seed)
    if bfloat16:
        module, torch_inputs = bf16(module, torch_inputs)
    ep = torch.export.export(module, tuple(torch_inputs))
    inputs = [to_numpy(t) for t in torch_inputs]
    expected = torch_outputs(module, torch_inputs)
    model = import_model(ep, layout=options["layout"], target=target)
    row: dict[str, Any] = {"name": name, "budget": budget, "layout": options["layout"], "inputs": [list(s.shape) for s in
                                                                                      model.inputs],
                           "quantized": quantized, "bf16": bfloat16}
    print(f"  {name}: {len(model.tasks)} tasks, {sum(t.weight for t in model.tasks)} calls", file=log, flush=True)

    programs: dict[str, Any] = {}  # every correct program, timed at the end, each in a fresh process
    folder = Path(tempfile.mkdtemp(prefix=f"programs-{name}-", dir=options["work_dir"]))
    row["untuned_ms"] = None
    if options["untuned"]:
        untuned = build_model(model, target)
        programs["untuned"] = _export_vm(untuned.ex, inputs, untuned.params, folder / "untuned")

    # ours in the main layout ("ours"), then in each `--also-layouts` one ("ours@<layout>"), all timed together
    for layout in (options["layout"], *options.get("also_layouts", ())):
        facts, program = _ours_in(layout, ep, target_name, budget, seed, options, inputs, expected, folder, log)
        if layout == options["layout"]:
            row.update(facts)
            key = "ours"
        else:
            row.setdefault("also", {})[layout] = facts
            key = f"ours@{layout}"
        if program is not None:
            programs[key] = program

    row.update(metaschedule_ms=None, metaschedule_tune_s=None, metaschedule_correct=None, metaschedule_error=None)
    if options["metaschedule"]:
        try:
            row["metaschedule_trials_per_iter"] = options["ms_trials_per_iter"]
            ms = run_metaschedule(ep, target, budget, seed, options["work_dir"], options["ms_trials_per_iter"],
                                  quantized=quantized, translated=bfloat16)
            ex, params, check = ms.pop("ex"), ms.pop("params"), ms.pop("check")
            row.update(ms)
            mismatch = _check(_run_vm(ex, inputs, params), expected, quantized=quantized)
            row["metaschedule_correct"] = mismatch is None
            if mismatch is None:
                programs["metaschedule"] = _export_vm(ex, inputs, params, folder / "metaschedule")
            else:
                row["metaschedule_error"] = f"MetaSchedule: {mismatch}"
                row["metaschedule_wrong_tasks"] = wrong = check()
                row["metaschedule_error"] += (f"; tasks whose schedule computes something else: {', '.join(wrong)}"
                                              if wrong else "; every task's schedule matches its function on random "
                                              "inputs (the fault is between tasks: layout rewrites, lifted params)")
        except Exception as e:  # noqa: BLE001
            row["metaschedule_error"] = f"MetaSchedule failed: {type(e).__name__}: {str(e)[:300]}"
    if options["torch"]:
        programs.update(torch_programs(name, seed, options["torch_variants"], quantized, bfloat16))
    row["onnxruntime_ms"] = None
    if options.get("onnxruntime") and quantized:
        row["onnxruntime_error"] = "not run: torch.onnx does not export the quantized_decomposed operators"
    elif options.get("onnxruntime") and bfloat16:
        row["onnxruntime_error"] = "not run for bfloat16 models (its bf16 export and CPU kernels not tried)"
    elif options.get("onnxruntime"):
        facts, program = onnxruntime_program(module, torch_inputs, expected, folder)
        row.update(facts)
        if program is not None:
            programs["onnxruntime"] = program
    timings = time_fresh(programs, seed=seed, rounds=options["rounds"], log=log)
    row["readings_ms"] = timings.readings  # each round's reading: the spread
    for key in ("untuned", "ours", "metaschedule", "onnxruntime"):
        if key in timings.ms:
            row[f"{key}_ms"] = timings.ms[key]
    for layout, facts in row.get("also", {}).items():
        facts["ours_ms"] = timings.ms.get(f"ours@{layout}")
        facts["vs_main"] = speedup(row.get("ours_ms"), facts["ours_ms"])
    variants = {k[len("torch_"):]: v for k, v in timings.ms.items() if k.startswith("torch_")}
    timed = {k: v for k, v in variants.items() if v is not None}
    row["torch_variants_ms"] = variants
    row["torch_best"] = min(timed, key=timed.get) if timed else None
    row["torch_ms"] = timed[row["torch_best"]] if timed else None
    row["timing"] = "fresh-process"
    row["correct"] = (bool(row["ours_correct"]) and all(f["ours_correct"] for f in row.get("also", {}).values())
                      and row["metaschedule_correct"] is not False)
    row["vs_metaschedule"] = speedup(row["metaschedule_ms"], row["ours_ms"])
    row["vs_torch"] = speedup(row["torch_ms"], row["ours_ms"])
    row["vs_onnxruntime"] = speedup(row["onnxruntime_ms"], row["ours_ms"])
    return row


COLUMNS = (
    Column("model", lambda r: r["name"], right=False),
    Column("tasks", lambda r: f"{r.get('tuned_tasks', '-')}/{r.get('tasks', '-')}"),
    Column("untuned ms", lambda r: fmt_ms(r.get("untuned_ms"))),
    Column("ours ms", lambda r: fmt_ms(r.get("ours_ms"))),
    Column("also", lambda r: " ".join(f"{k} {fmt_ms(v.get('ours_ms'))} ({fmt_x(v.get('vs_main'))})"
                                      for k, v in r.get("also", {}).items()) or "-", right=False),
    Column("MS tasks", lambda r: f"{r.get('metaschedule_tuned_tasks', '-')}/{r.get('metaschedule_tasks', '-')}"),
    Column("MS ms", lambda r: fmt_ms(r.get("metaschedule_ms"))),
    Column("torch ms", lambda r: fmt_ms(r.get("torch_ms")) + (f" ({r['torch_best']})" if r.get("torch_best") else "")),
    Column("ORT ms", lambda r: fmt_ms(r.get("onnxruntime_ms"))),
    Column("vs MS", lambda r: fmt_x(r.get("vs_metaschedule"))),
    Column("vs torch", lambda r: fmt_x(r.get("vs_torch"))),
    Column("vs ORT", lambda r: fmt_x(r.get("vs_onnxruntime"))),
    Column("ours tune s", lambda r: fmt_s(r.get("ours_tune_s"))),
    Column("MS tune s", lambda r: fmt_s(r.get("metaschedule_tune_s"))),
    Column("correct", lambda r: "yes" if r["correct"] else ("NO (ours)" if not r.get("ours_correct") else "NO (MS)"),
           right=False),
)


def _cpu(report: dict) -> str:
    env = report.get("environment", {})
    return ", ".join(str(v) for v in (env.get("cpu_model"), env.get("cpu")) if v) or "CPU unknown"


def table(report: dict) -> str:
    g = report["geomean"]
    footer = [{"name": "geomean", "vs_metaschedule": g["vs_metaschedule"], "vs_torch": g["vs_torch"],
               "vs_onnxruntime": g.get("vs_onnxruntime"), "correct": all(r["correct"] for r in report["cases"]),
               "ours_correct": True}]
    head = (f"models, target {report['target']} ({_cpu(report)}), budget "
            f"{report['budget']} on-device measurements per model (ours and MetaSchedule); tasks, MS tasks = "
            f"tuned/all; torch = the best of its variants; each program timed in a fresh process; speedup = "
            f"baseline ms / ours ms")
    notes = [f"  {r['name']}: {r['error']}" for r in report["cases"] if r.get("error")]
    notes += [f"  {r['name']}: {r['metaschedule_error']}" for r in report["cases"] if r.get("metaschedule_error")]
    notes += [f"  {r['name']}: MetaSchedule: left in its layout (read only in part): "
              f"{', '.join(r['metaschedule_not_layout_free'])}"
              for r in report["cases"] if r.get("metaschedule_not_layout_free")]
    notes += [f"  {r['name']}: {r['onnxruntime_error']}" for r in report["cases"] if r.get("onnxruntime_error")]
    notes += [f"  {r['name']}: {f['error']}" for r in report["cases"] for f in r.get("also", {}).values()
              if f.get("error")]
    notes += [f"  {r['name']} ({layout}): layout search {f['layout_search']['rounds']} choices, estimate "
              f"{fmt_ms(f['layout_search']['rule_estimate_ms'])} ms (rule) -> "
              f"{fmt_ms(f['layout_search']['chosen_estimate_ms'])} ms"
              for r in report["cases"] for layout, f in [(r.get("layout"), r), *r.get("also", {}).items()]
              if f.get("layout_search")]
    return "\n".join([head, format_table(COLUMNS, report["cases"], footer), *notes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo names")
    parser.add_argument("--budget", type=int, default=64, help="on-device measurements per model (default 64)")
    parser.add_argument("--trials-per-round", type=int, default=8,
                        help="most measurements per scheduler round (fewer when the budget could not otherwise "
                             "reach every task); MetaSchedule's trials per iteration too unless --ms-trials-per-iter")
    parser.add_argument("--ms-trials-per-iter", type=int,
                        help="MetaSchedule's num_trials_per_iter (default: --trials-per-round; TVM's own default is "
                             "64). Its evolutionary search costs about the same per iteration whatever the size "
                             "(68 s on ResNet-18 on 2 cores), so at 8 that search, not the measuring, is most of its "
                             "tuning time; fewer, larger iterations also mean fewer cost-model updates. At most the "
                             "budget's share per MetaSchedule task (its scheduler gives every task one iteration "
                             "first)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", default="blocked", choices=("blocked", "search", "none"),
                        help="our graph-level layouts (compiler.workloads.model.MODEL_LAYOUTS; search: ALT's joint "
                             "stage on 30%% of the budget first, as a model job)")
    parser.add_argument("--also-layouts", default="",
                        help="comma-separated other layouts for ours, each tuned at the same budget and timed in the "
                             "same run (column 'also': its ms and its speedup over ours in --layout); "
                             "'<layout>+chains' groups chains of complex operators into basteln tasks")
    parser.add_argument("--target", default="host")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--work-dir", type=Path, help="keep MetaSchedule's run folders here")
    parser.add_argument("--no-metaschedule", action="store_true")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-untuned", action="store_true")
    parser.add_argument("--no-onnxruntime", action="store_true", help="leave ONNX Runtime (CPU) out")
    parser.add_argument("--torch-variants", default=",".join(TORCH_VARIANTS),
                        help=f"comma-separated torch variants to time (default: all of {', '.join(TORCH_VARIANTS)})")
    parser.add_argument("--quantize", action="store_true",
                        help="each model quantized by torchao's PT2E flow (X86 quantizer: uint8 activations, int8 "
                             "per-channel weights), on every side: ours and MetaSchedule from it, torch's variants "
                             "of it (compile: inductor's oneDNN int8 kernels); ONNX Runtime not run")
    parser.add_argument("--bf16", action="store_true",
                        help="each model in bfloat16 (module.to(torch.bfloat16)), on every side: ours (convs and "
                             "linears in the bf16 dot-product form), MetaSchedule from our translation, torch's "
                             "variants in bf16 (oneDNN); ONNX Runtime not run")
    parser.add_argument("--rounds", type=int, default=1,
                        help="fresh-process readings per program, in a new shuffled order each round (median)")
    args = parser.parse_args(argv)
    variants = tuple(v for v in args.torch_variants.split(",") if v)
    if not variants or set(variants) - set(TORCH_VARIANTS):
        parser.error(f"--torch-variants: each of {', '.join(TORCH_VARIANTS)}, got {args.torch_variants!r}")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.bf16 and args.quantize:
        parser.error("--bf16 and --quantize are two precisions: one at a time")
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in zoo.MODELS]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(zoo.MODELS)}")
    if args.budget < 1:
        parser.error("--budget must be >= 1")
    if args.ms_trials_per_iter is not None and args.ms_trials_per_iter < 1:
        parser.error("--ms-trials-per-iter must be >= 1")
    also = tuple(v for v in args.also_layouts.split(",") if v)
    if {v.removesuffix("+chains") for v in also} - {"blocked", "search", "none"} or args.layout in also:
        parser.error(f"--also-layouts: others of blocked, search, none (each optionally +chains) than --layout, "
                     f"got {args.also_layouts!r}")

    with tempfile.TemporaryDirectory(prefix="altune-bench-models-") as tmp:
        options = {"metaschedule": not args.no_metaschedule, "torch": not args.no_torch,
                   "untuned": not args.no_untuned, "onnxruntime": not args.no_onnxruntime, "layout": args.layout, "trials_per_round": args.trials_per_round,
                   "ms_trials_per_iter": args.ms_trials_per_iter or args.trials_per_round,
                   "work_dir": args.work_dir or Path(tmp), "torch_variants": variants, "rounds": args.rounds,
                   "also_layouts": also, "quantize": args.quantize, "bf16": args.bf16}

        def report_of(rows: list[dict]) -> dict:
            return {"suite": "models", "target": target_key(args.target), "budget": args.budget,
                    "quantized": args.quantize, "bf16": args.bf16, "cases": rows,
                    "geomean": geomeans(rows) | {"vs_onnxruntime": geomean(r.get("vs_onnxruntime") for r in rows)},
                    "environment": environment()}

        rows = []
        for i, name in enumerate(names):
            print(f"[{i + 1}/{len(names)}] {name} (budget {args.budget}) ...", file=sys.stderr, flush=True)
            rows.append(run_model(name, args.target, args.budget, args.seed, options, sys.stderr))
            if args.json is not None and i + 1 < len(names):  # an interrupted run keeps the models it finished
                write_json(report_of(rows), args.json, bench="models")
    report = report_of(rows)
    print(table(report))
    path = write_json(report, args.json, bench="models")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
