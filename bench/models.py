"""End-to-end benchmark: whole models, ours vs TVM MetaSchedule (Relax integration, same budget) vs torch.

    python -m bench.models [--models NAME,...|corpus] [--budgets B,...] [--json PATH] [--trials-per-round 8]
                           [--ms-trials-per-iter N] [--metaschedule-models NAME,...|all]
                           [--layout blocked|search|none] [--also-layouts L,...] [--no-metaschedule] [--no-torch] [--no-untuned]
                           [--torch-variants eager,channels_last,compile] [--no-onnxruntime] [--rounds N]
                           [--quantize]
    python -m bench.models --models corpus --budgets 0,default,2000 --rounds 3 --ms-trials-per-iter 64   # issue 61

Models by name, from `compiler.workloads.zoo` (ALT sec. 7.2 setup, batch 1: resnet18 and mobilenet_v2 on
3x224x224, bert_tiny on 128 tokens, the default) or from the real-model corpus (`bench.corpus`, `python -m
bench.corpus --list`: torchvision's classifiers at 1x3x224x224, torch's `TransformerEncoder`/`TransformerDecoder`,
a GPT block; each exported as a user exports it, `torch.export.export(module, args, kwargs)`, its fixed random
weights whatever `--seed`); a name in both (resnet18, mobilenet_v2) is the zoo's. `--models corpus` is issue 61's
set (`CORPUS_DEFAULT`): ResNet-50, SqueezeNet 1.1, EfficientNet-B0, MobileNet-V3-small, ShuffleNet-V2 x0.5, the
Transformer encoder, the GPT block.

`--budgets` (default "default") tunes ours at each budget, one row per model and budget, every row's programs
timed in the same rounds: a number (0: nothing measured, the untuned build with its default schedules served) or
"default", the budget a model job gets when its spec names none (`default_budget`: `tuner.model.default_budget`
of the model once it exists, else the API's 64). `--budget N` is `--budgets N`. The untuned build, torch and ONNX
Runtime do not depend on the budget: timed once per model, shared by its rows; MetaSchedule runs at each budget
from 1 (`--metaschedule-models`: by default every zoo model and, of the corpus, resnet50 only: at 2,000 it tunes
for hours).

For each model, every side at its best:

- ours: what a model job with the same spec serves, by the same functions: the program translated
  (`translate_model`, as the job's sandbox does), `tuner.model.tune_model` (graph-level layouts: `--layout`,
  default "blocked", convs in N C/c H W c carried through the graph; "search" runs ALT's joint stage first;
  the job's default fusion, "auto": chains of complex operators whose intermediates exceed the L2 cache tuned fused
  and unfused, fused where faster; `--also-layouts blocked+none` also tunes the model without that,
  `blocked+chains` with every chain fused unmeasured; every tunable task searched in rounds the gradient scheduler spreads, stored
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

Time to beat torch.compile: while ours tunes, every change of the model's estimated latency (the `on_estimate`
hook: the sum over its tunable tasks of calls x the best measured latency, the untuned one until a task has a
trial; published once every task had a round) is recorded with the seconds since tuning began (translation
included, the clock of `ours_tune_s`) and the measurements so far (`estimate_curve`: [s, measurements, ms]). A
row's `estimate_beats_compile_s` (and `_measurements`) is the first point where that estimate is below
torch.compile's timed latency: an estimate, not a timed artifact (it leaves out the untunable tasks and what runs
between kernels; `ours_estimate_ms`, its last value, sits beside the artifact's `ours_ms`). Issue 61's "ResNet-50
beats torch.compile within 10 minutes of tuning on 2 cores" is read from it at budget 2,000.

Every program (the untuned build, ours at each budget, MetaSchedule's, each torch variant, ONNX Runtime's) is
timed in a fresh process of its own, one at a time, in shuffled order (`bench.common.time_fresh`):
medians of `time_evaluator` repeats of at least 50 ms (torch: the same calibration in
Python); a row's latencies are the medians over `--rounds`, and `readings_ms` keeps every round's reading
(program -> ms, in the order taken; its budget's and the model's shared programs). Prints a table (the target with
its `-mcpu` and the CPU's name in its header; per model and budget ours' ms, its speedup over torch.compile, the
best torch variant, eager, ONNX Runtime and MetaSchedule, the tuning seconds, the estimate's seconds to beat
torch.compile, the measurements; a geomean per budget) and writes the report (the `bench.common` shape; its
"budget" the largest a row has, "budgets" as given, "geomean" over the rows of the last of them,
"geomean_by_budget" per budget) to --json or under bench/results/; with --json, also after every model but the
last, so that an interrupted run keeps the models it finished.

MetaSchedule's flow and its checks are `bench.models_metaschedule`, the torch factories `bench.torch_programs`
(a corpus model's: `torch_corpus_model`, built from `bench.corpus_models` in a child without TVM), ONNX Runtime's
session `bench.timing_onnx` (their names re-exported here).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import (TORCH_VARIANTS, TorchProgram, fmt_ms, speedup, time_fresh, write_json)
from bench.corpus_models import CORPUS, flat_call
from bench.environment import environment
from bench.models_programs import artifact_program, check_outputs, export_vm, onnxruntime_program, run_vm
from bench.models_report import by_budget, geomeans_of, table
from bench.models_metaschedule import partly_read, run_metaschedule, whole_layout_free, wrong_tasks
from bench.torch_programs import bf16, torch_bf16_model, torch_corpus_model, torch_model, torch_quantized_model
from compiler.arrays import to_numpy
from compiler.target import resolve_target, target_key
from compiler.workloads import zoo
from compiler.workloads.model import (ImportedModel, ModelTask, build_model,
                                      import_model, torch_outputs)
from compiler.workloads.model.importer import translate_model
from service.schemas import default_model_budget
from tuner import Measurer, make_measurer
from tuner.model import ModelTuneHooks, ModelTuneResult, serve_model, tune_model
from tuner.request import ModelTuneRequest
from tuner.task import Trial, best_trial

# what the tests and earlier callers reach through this module
__all__ = ["CORPUS_DEFAULT", "DEFAULT_MODELS", "artifact_program", "bf16", "default_budget", "load_model", "main",
           "onnxruntime_program", "parse_budgets", "partly_read", "run_model", "run_metaschedule", "table",
           "time_to_beat", "torch_bf16_model", "torch_corpus_model", "torch_model", "torch_programs",
           "torch_quantized_model", "tune_ours", "whole_layout_free", "wrong_tasks"]


DEFAULT_MODELS = ("resnet18", "mobilenet_v2", "bert_tiny")
# issue 61's real models (`--models corpus`): names in bench.corpus
CORPUS_DEFAULT = ("resnet50", "squeezenet1_1", "efficientnet_b0", "mobilenet_v3_small", "shufflenet_v2_x0_5",
                  "transformer_encoder", "gpt_block")
PRESETS = {"corpus": CORPUS_DEFAULT}
# of the corpus, the models MetaSchedule runs on unless --metaschedule-models says otherwise (it is hours at 2,000)
METASCHEDULE_CORPUS = ("resnet50",)


def parse_budgets(text: str) -> tuple[int | str, ...]:
    """`--budgets`: comma-separated budgets, each a number >= 0 or "default" (resolved per model by
    `default_budget`), in order, repeats dropped.

    Raises:
        ValueError: an item is neither.
    """
    budgets: list[int | str] = []
    for item in (i.strip() for i in text.split(",")):
        if item != "default" and not (item.isdigit() and item.isascii()):
            raise ValueError(f"a budget is a number >= 0 or 'default', got {item!r}")
        budget = item if item == "default" else int(item)
        if budget not in budgets:
            budgets.append(budget)
    return tuple(budgets)


def default_budget(model: ImportedModel) -> int:
    """The budget a model job gets for `model` when its spec names none (`service.schemas.default_model_budget`:
    8 per conv or matmul task, between 64 and 512), from the tasks of `model` as the API counts them."""
    return default_model_budget(sum(t.complex for t in model.tasks))


def resolve_budgets(budgets: Sequence[int | str], model: ImportedModel) -> list[tuple[int, str]]:
    """Each of `budgets` as (measurements, how it was given: the number, or "default"), repeats after resolution
    dropped (the first kept)."""
    resolved: list[tuple[int, str]] = []
    for b in budgets:
        n = default_budget(model) if b == "default" else int(b)
        if n not in (r[0] for r in resolved):
            resolved.append((n, str(b)))
    return resolved


def time_to_beat(curve: Sequence[Sequence[float]], baseline_ms: float | None) -> tuple[float, int] | None:
    """The first point of an estimate curve ([seconds, measurements, estimate ms], in order) whose estimate is
    below `baseline_ms`: (seconds, measurements); None when none is, or there is no baseline."""
    if baseline_ms is None:
        return None
    for seconds, measurements, estimate_ms in curve:
        if estimate_ms < baseline_ms:
            return seconds, int(measurements)
    return None


def model_source(name: str) -> str:
    """Where model `name` comes from: "zoo" (`compiler.workloads.zoo`, first) or "corpus" (`bench.corpus`).

    Raises:
        KeyError: neither has it.
    """
    if name in zoo.MODELS:
        return "zoo"
    if name in CORPUS:
        return "corpus"
    raise KeyError(name)


def load_model(name: str, seed: int, quantized: bool = False, bfloat16: bool = False
               ) -> tuple[Any, list, torch.export.ExportedProgram]:
    """Model `name` as torch runs it (called on its inputs positionally), its inputs (torch tensors: a corpus
    model's are its arguments' tensor leaves, `flat_call`), and its export. A zoo model's weights and inputs come
    from `seed`, quantized or in bfloat16 where asked; a corpus model's are fixed (`bench.corpus`), exported as a
    user exports it, with its own arguments."""
    if model_source(name) == "corpus":
        assert not (quantized or bfloat16), f"{name}: --quantize and --bf16 take zoo models only"
        module, args, kwargs = CORPUS[name]()
        with torch.no_grad():
            ep = torch.export.export(module, args, kwargs)
        fn, inputs = flat_call(module, args, kwargs)
        return fn, inputs, ep
    module, torch_inputs = zoo.quantized(name, seed) if quantized else zoo.create(name, seed)
    if bfloat16:
        module, torch_inputs = bf16(module, torch_inputs)
    return module, list(torch_inputs), torch.export.export(module, tuple(torch_inputs))


class _BenchHooks(ModelTuneHooks):
    """Prints each round of the loop stage and the joint stage's choice to the benchmark's log, and records the
    model's estimate at each change: `curve`, [seconds since `start`, measurements so far, estimate ms]."""

    def __init__(self, log: Any, start: float) -> None:
        self.log, self.start = log, start
        self.measurements = 0
        self.curve: list[list[float]] = []

    def on_trial(self, task: ModelTask, trial: Trial) -> None:
        self.measurements += 1

    def on_estimate(self, latency_ms: float) -> None:
        self.curve.append([round(time.perf_counter() - self.start, 3), self.measurements, latency_ms])

    def on_layouts(self, blocks: dict, report: dict) -> None:
        print(f"    layout search: {len(report['rounds'])} choices, {report['measurements']} measurements, estimate "
              f"{fmt_ms(report['rule_estimate_ms'])} ms (rule) -> {fmt_ms(report['chosen_estimate_ms'])} ms",
              file=self.log, flush=True)

    def on_round(self, task: Any, result: Any) -> None:
        latency = result.best.latency_ms if result.best is not None else None
        print(f"      round: {task.name} (weight {task.weight}) +{result.spent} trials, best "
              f"{fmt_ms(latency)} ms (untuned {fmt_ms(result.baseline_ms)})", file=self.log, flush=True)


def tune_ours(ep: Any, request: ModelTuneRequest, inputs: list, expected: list, dest: Path, log: Any,
              measurer: Measurer | None = None) -> tuple[dict, ModelTuneResult, dict]:
    """Ours as a model job runs it: the program translated (`translate_model`, what the job's sandbox does), tuned
    by `tuner.model.tune_model` and served by `tuner.model.serve_model` (built, checked whole against `expected`,
    timed, written as the artifact at `dest`): the functions the worker calls, here in this process. Returns the
    row's facts (`estimate_curve`: the model's estimate at each change during tuning, [seconds since the start,
    measurements, ms]; `ours_estimate_ms` its last), the tuning result and `serve_model`'s answer."""
    measurer = measurer or make_measurer("local", pipeline=request.pipeline)
    start = time.perf_counter()
    hooks = _BenchHooks(log, start)
    try:
        tuned = tune_model(translate_model(ep), request, measurer=measurer, hooks=hooks)
    finally:
        measurer.close()
    tune_s = time.perf_counter() - start
    served = serve_model(tuned.model, request, tuned.schedules, inputs, expected, dest=dest, facts=tuned.facts,
                         report=tuned.report, alternatives=tuned.alternatives)
    trials = [t for o in tuned.outcomes for t in o.trials]
    facts: dict[str, Any] = {
        "ours_tune_s": tune_s,
        "tasks": len(tuned.model.tasks),
        "tunable_tasks": len(tuned.outcomes),
        "tuned_tasks": len(served["served"]),
        "ours_trials": tuned.measurements,
        "ours_errors": sum(t.error is not None for t in trials),
        "ours_served": served["report"].get("served"),
        # fusion "auto": each chain option's decision, and which model was served after timing both whole
        "fusion": served["report"].get("fusion"),
        "micro_kernel": served["report"].get("schedules", {}).get("micro_kernel"),
        "estimate_curve": hooks.curve,
        "ours_estimate_ms": hooks.curve[-1][2] if hooks.curve else None,
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


def _ours_in(variant: str, ep: Any, target_name: str, budget: int, seed: int, options: dict, inputs: list,
             expected: list, folder: Path, log: Any) -> tuple[dict, Any]:
    """Ours in one graph-level layout ("search": the joint stage first, as a model job), with a model job's fusion
    ("<layout>+none", "<layout>+chains", "<layout>+auto"; "<layout>" alone: the job's default, "auto"): the row's
    facts (ours_*, error) and the served artifact as a program (None when it failed)."""
    layout, _, fusion = variant.partition("+")
    request = ModelTuneRequest(target=target_name, budget=budget, seed=seed, layout=layout,
                               **({"fusion": fusion} if fusion else {}),
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


def torch_programs(name: str, seed: int, variants: Sequence[str], quantized: bool = False,
                   bfloat16: bool = False) -> dict[str, TorchProgram]:
    """The torch variants of model `name` (channels_last only where an input is 4-D or 5-D): a zoo model's of its
    PT2E-quantized form where `quantized`, in bfloat16 where `bfloat16`; a corpus model's on its inputs' tensor
    leaves (`torch_corpus_model`)."""
    if model_source(name) == "corpus":
        factory, args = torch_corpus_model, (name,)
        _, inputs = torch_corpus_model(name)
    else:
        factory = torch_quantized_model if quantized else torch_bf16_model if bfloat16 else torch_model
        args = (name, seed)
        _, inputs = zoo.create(name, seed)
    spatial = any(x.dim() in (4, 5) for x in inputs)
    return {f"torch_{v}": TorchProgram(factory, args, v) for v in variants if v != "channels_last" or spatial}


def run_model(name: str, target_name: str, budgets: Sequence[int | str], seed: int, options: dict, log: Any
              ) -> list[dict]:
    """Every side on model `name`, ours (and MetaSchedule, where it runs) at each of `budgets` (`parse_budgets`'
    items, "default" resolved for the model): one row per budget, the untuned build, torch's variants and ONNX
    Runtime shared by them, every program timed in the same rounds. A failure of one side is reported in its row,
    never raised."""
    target = resolve_target(target_name)
    quantized, bfloat16 = options.get("quantize", False), options.get("bf16", False)
    module, torch_inputs, ep = load_model(name, seed, quantized, bfloat16)
    inputs = [to_numpy(t) for t in torch_inputs]
    expected = torch_outputs(module, torch_inputs)
    model = import_model(ep, layout=options["layout"], target=target)
    print(f"  {name}: {len(model.tasks)} tasks, {sum(t.weight for t in model.tasks)} calls", file=log, flush=True)
    metaschedule = options["metaschedule"] and name in options.get("metaschedule_models", (name,))

    programs: dict[str, Any] = {}  # every correct program, timed at the end, each in a fresh process
    folder = Path(tempfile.mkdtemp(prefix=f"programs-{name}-", dir=options["work_dir"]))
    if options["untuned"]:
        untuned = build_model(model, target)
        programs["untuned"] = export_vm(untuned.ex, inputs, untuned.params, folder / "untuned")

    rows: list[dict] = []
    for budget, given in resolve_budgets(budgets, model):
        # this budget's programs are "b<budget>:<program>"; the untuned build's, torch's and ONNX Runtime's shared
        prefix, here = f"b{budget}:", folder / f"b{budget}"
        here.mkdir()
        print(f"  {name} at budget {budget}{' (default)' if given == 'default' else ''}", file=log, flush=True)
        row: dict[str, Any] = {"name": name, "source": model_source(name), "budget": budget, "budget_given": given,
                               "layout": options["layout"], "inputs": [list(s.shape) for s in model.inputs],
                               "quantized": quantized, "bf16": bfloat16}
        # ours in the main layout ("ours"), then in each `--also-layouts` one ("ours@<layout>"), all timed together
        for layout in (options["layout"], *options.get("also_layouts", ())):
            facts, program = _ours_in(layout, ep, target_name, budget, seed, options, inputs, expected, here, log)
            if layout == options["layout"]:
                row.update(facts)
                key = "ours"
            else:
                row.setdefault("also", {})[layout] = facts
                key = f"ours@{layout}"
            if program is not None:
                programs[prefix + key] = program

        row.update(metaschedule_ms=None, metaschedule_tune_s=None, metaschedule_correct=None, metaschedule_error=None)
        if metaschedule and budget > 0:
            try:
                row["metaschedule_trials_per_iter"] = options["ms_trials_per_iter"]
                ms = run_metaschedule(ep, target, budget, seed, options["work_dir"], options["ms_trials_per_iter"],
                                      quantized=quantized, translated=bfloat16)
                ex, params, check = ms.pop("ex"), ms.pop("params"), ms.pop("check")
                row.update(ms)
                mismatch = check_outputs(run_vm(ex, inputs, params), expected, quantized=quantized)
                row["metaschedule_correct"] = mismatch is None
                if mismatch is None:
                    programs[prefix + "metaschedule"] = export_vm(ex, inputs, params, here / "metaschedule")
                else:
                    row["metaschedule_error"] = f"MetaSchedule: {mismatch}"
                    row["metaschedule_wrong_tasks"] = wrong = check()
                    row["metaschedule_error"] += (f"; tasks whose schedule computes something else: {', '.join(wrong)}"
                                                  if wrong else "; every task's schedule matches its function on "
                                                  "random inputs (the fault is between tasks: layout rewrites, lifted "
                                                  "params)")
            except Exception as e:  # noqa: BLE001
                row["metaschedule_error"] = f"MetaSchedule failed: {type(e).__name__}: {str(e)[:300]}"
        rows.append(row)

    shared: dict[str, Any] = {}  # the facts every row of this model shares
    if options["torch"]:
        programs.update(torch_programs(name, seed, options["torch_variants"], quantized, bfloat16))
    if options.get("onnxruntime") and quantized:
        shared["onnxruntime_error"] = "not run: torch.onnx does not export the quantized_decomposed operators"
    elif options.get("onnxruntime") and bfloat16:
        shared["onnxruntime_error"] = "not run for bfloat16 models (its bf16 export and CPU kernels not tried)"
    elif options.get("onnxruntime"):
        facts, program = onnxruntime_program(module, torch_inputs, expected, folder)
        shared.update(facts)
        if program is not None:
            programs["onnxruntime"] = program
    timings = time_fresh(programs, seed=seed, rounds=options["rounds"], log=log)
    variants = {k[len("torch_"):]: v for k, v in timings.ms.items() if k.startswith("torch_")}
    timed = {k: v for k, v in variants.items() if v is not None}
    best = min(timed, key=timed.get) if timed else None
    for row in rows:
        prefix = f"b{row['budget']}:"
        row.update(shared)
        # each round's reading of this row's programs (its budget's, and the shared ones): the spread
        row["readings_ms"] = {k.removeprefix(prefix): v for k, v in timings.readings.items()
                              if ":" not in k or k.startswith(prefix)}
        row["untuned_ms"] = timings.ms.get("untuned")
        row["onnxruntime_ms"] = timings.ms.get("onnxruntime")
        row["ours_ms"] = timings.ms.get(prefix + "ours")
        row["metaschedule_ms"] = timings.ms.get(prefix + "metaschedule")
        for layout, facts in row.get("also", {}).items():
            facts["ours_ms"] = timings.ms.get(f"{prefix}ours@{layout}")
            facts["vs_main"] = speedup(row["ours_ms"], facts["ours_ms"])
        row["torch_variants_ms"] = dict(variants)
        row["torch_best"] = best
        row["torch_ms"] = timed[best] if best is not None else None
        row["timing"] = "fresh-process"
        row["correct"] = (bool(row["ours_correct"]) and all(f["ours_correct"] for f in row.get("also", {}).values())
                          and row["metaschedule_correct"] is not False)
        row["vs_metaschedule"] = speedup(row["metaschedule_ms"], row["ours_ms"])
        row["vs_torch"] = speedup(row["torch_ms"], row["ours_ms"])
        row["vs_compile"] = speedup(variants.get("compile"), row["ours_ms"])
        row["vs_eager"] = speedup(variants.get("eager"), row["ours_ms"])
        row["vs_onnxruntime"] = speedup(row["onnxruntime_ms"], row["ours_ms"])
        # the tuning seconds (and measurements) until ours' estimate first fell below torch.compile's timed latency
        beat = time_to_beat(row.get("estimate_curve", []), variants.get("compile"))
        row["estimate_beats_compile_s"], row["estimate_beats_compile_measurements"] = beat or (None, None)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="comma-separated names of compiler.workloads.zoo or bench.corpus (python -m bench.corpus "
                             f"--list; the zoo's first), or 'corpus': issue 61's set, {','.join(CORPUS_DEFAULT)} "
                             f"(default: {','.join(DEFAULT_MODELS)})")
    parser.add_argument("--budgets", default=None,
                        help="comma-separated on-device measurements per model, ours (and MetaSchedule from 1) tuned "
                             "at each, one row per model and budget: numbers >= 0 or 'default', the budget a model job "
                             "gets when its spec names none (8 per conv or matmul task, 64-512; default: 'default')")
    parser.add_argument("--budget", type=int, help="one budget: --budgets N")
    parser.add_argument("--metaschedule-models",
                        help="comma-separated models (of --models) MetaSchedule runs on, or 'all' (default: every zoo "
                             f"model and, of the corpus, {','.join(METASCHEDULE_CORPUS)}: at 2,000 it tunes for hours)")
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
                             "'<layout>+none', '+chains' or '+auto': a job's fusion (alone: its default, auto)")
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
    names = list(dict.fromkeys(m for n in args.models.split(",") if n for m in PRESETS.get(n, (n,))))
    unknown = [n for n in names if n not in zoo.MODELS and n not in CORPUS]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(zoo.MODELS)}, 'corpus', and the "
                     f"corpus' (python -m bench.corpus --list)")
    corpus_named = [n for n in names if model_source(n) == "corpus"]
    if corpus_named and (args.quantize or args.bf16):
        parser.error(f"--quantize and --bf16 take zoo models only, got {', '.join(corpus_named)}")
    if args.budget is not None and args.budgets is not None:
        parser.error("--budget N is --budgets N: one of them")
    try:
        budgets = parse_budgets(str(args.budget) if args.budget is not None else args.budgets or "default")
    except ValueError as e:
        parser.error(f"--budgets: {e}")
    if args.metaschedule_models in (None, "all"):
        ms_models = [n for n in names if args.metaschedule_models == "all" or model_source(n) == "zoo"
                     or n in METASCHEDULE_CORPUS]
    else:
        ms_models = [n for n in args.metaschedule_models.split(",") if n]
        if set(ms_models) - set(names):
            parser.error(f"--metaschedule-models: names of --models or 'all', got {args.metaschedule_models!r}")
    if args.no_metaschedule:
        ms_models = []
    if args.ms_trials_per_iter is not None and args.ms_trials_per_iter < 1:
        parser.error("--ms-trials-per-iter must be >= 1")
    also = tuple(v for v in args.also_layouts.split(",") if v)
    if {v.partition("+")[0] for v in also} - {"blocked", "search", "none"} \
            or {v.partition("+")[2] for v in also} - {"", "none", "chains", "auto"} or args.layout in also:
        parser.error(f"--also-layouts: others of blocked, search, none (each optionally +none, +chains or +auto) "
                     f"than --layout, "
                     f"got {args.also_layouts!r}")

    with tempfile.TemporaryDirectory(prefix="altune-bench-models-") as tmp:
        options = {"metaschedule": not args.no_metaschedule, "metaschedule_models": set(ms_models),
                   "torch": not args.no_torch, "untuned": not args.no_untuned, "onnxruntime": not args.no_onnxruntime,
                   "layout": args.layout, "trials_per_round": args.trials_per_round,
                   "ms_trials_per_iter": args.ms_trials_per_iter or args.trials_per_round,
                   "work_dir": args.work_dir or Path(tmp), "torch_variants": variants, "rounds": args.rounds,
                   "also_layouts": also, "quantize": args.quantize, "bf16": args.bf16}

        def report_of(rows: list[dict]) -> dict:
            groups = by_budget(rows)
            return {"suite": "models", "target": target_key(args.target),
                    "budget": max((r["budget"] for r in rows), default=0), "budgets": list(budgets),
                    "rounds": args.rounds, "metaschedule_models": ms_models, "quantized": args.quantize,
                    "bf16": args.bf16, "cases": rows,
                    "geomean": geomeans_of(groups.get(str(budgets[-1]), [])),
                    "geomean_by_budget": {given: geomeans_of(group) for given, group in groups.items()},
                    "environment": environment()}

        rows = []
        for i, name in enumerate(names):
            print(f"[{i + 1}/{len(names)}] {name} (budgets {', '.join(map(str, budgets))}) ...", file=sys.stderr,
                  flush=True)
            rows.extend(run_model(name, args.target, budgets, args.seed, options, sys.stderr))
            if args.json is not None and i + 1 < len(names):  # an interrupted run keeps the models it finished
                write_json(report_of(rows), args.json, bench="models")
    report = report_of(rows)
    print(table(report))
    path = write_json(report, args.json, bench="models")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
