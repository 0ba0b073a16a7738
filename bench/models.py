"""End-to-end benchmark: whole models, ours vs TVM MetaSchedule (Relax integration, same budget) vs torch eager.

    python -m bench.models [--models NAME,...] [--budget N] [--json PATH] [--trials-per-round 8]
                           [--layout blocked|none] [--no-metaschedule] [--no-torch] [--no-untuned]

Models from `compiler.workloads.zoo` (ALT sec. 7.2 setup, batch 1): resnet18 and
mobilenet_v2 on 3x224x224, bert_tiny on 128 tokens. For each model:

- ours: `compiler.workloads.model.import_model` (torch.export -> Relax,
  graph-level layouts (`--layout`, default "blocked": convs in N C/c H W c, carried
  through the graph), fused tasks), every task our loop space can tune searched with `tuner.tune` in rounds
  that `tuner.scheduler.GradientScheduler` spreads over the tasks (weight = calls),
  `--budget` measurements in all; the best configuration of every tuned task
  applied, the model built into a Relax VM executable, checked against torch
  and timed;
- MetaSchedule: `ms.relax_integration.tune_relax` with `max_trials_global` = the
  same budget (its own gradient task scheduler), `compile_relax`, checked and timed;
- torch: the eager module, all cores, timed in a fresh process (TVM's thread
  pool slows torch down in a process where TVM has run).

Latencies are medians of `time_evaluator` repeats of at least 50 ms (torch: the
same calibration in Python). Prints a table and writes the report (the
`bench.common` shape) to --json or under bench/results/.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Column, fmt_ms, fmt_s, fmt_x, format_table, geomeans, speedup, write_json

DEFAULT_MODELS = ("resnet18", "mobilenet_v2", "bert_tiny")


def torch_model_latency(module: Any, inputs: tuple, *, repeat: int = 5, min_repeat_ms: float = 50.0) -> float:
    """Median latency (ms) of the eager module, timed like `bench.baselines.torch_latency`."""
    import torch

    from bench.baselines import affinity_cores, calibrate, torch_threads

    with torch_threads(affinity_cores()), torch.inference_mode():
        number = calibrate(lambda: module(*inputs), min_repeat_ms)
        means = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                module(*inputs)
            means.append((time.perf_counter() - start) / number)
    return statistics.median(means) * 1e3


def torch_latency_fresh(name: str, seed: int) -> float:
    """`torch_model_latency` of zoo model `name` in a fresh process.

    In a process where TVM has run, its spinning thread pool competes with
    torch's OpenMP threads for the two cores: BERT-tiny measured 60 ms there
    and 1.35 ms in a fresh process. So torch is always timed alone.
    """
    import json
    import subprocess

    done = subprocess.run([sys.executable, "-m", "bench.models", "--torch-only", name, "--seed", str(seed)],
                          capture_output=True, text=True, timeout=600, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["torch_ms"])


def _check(outs: list, expected: list) -> str | None:
    from compiler.arrays import check_close

    if len(outs) != len(expected):
        return f"{len(outs)} outputs, expected {len(expected)}"
    for i, (out, ref) in enumerate(zip(outs, expected)):
        mismatch = check_close(out, ref)
        if mismatch is not None:
            return f"output {i}: {mismatch}"
    return None


def tunable(prim_func: Any) -> bool:
    """Whether our loop space can tune `prim_func` (it needs one reduction block to tile)."""
    from tuner import LoopSpace

    try:
        LoopSpace(prim_func)
    except Exception:  # noqa: BLE001 - element-wise and multi-reduction functions stay untuned
        return False
    return True


def run_ours(model: Any, target: Any, budget: int, seed: int, trials_per_round: int, log: Any) -> dict:
    """Tunes the model's tasks under the gradient scheduler, builds the best, returns facts and the executable."""
    from compiler.workloads.model import build_model
    from tuner import LocalMeasurer, Task, apply_config, tune
    from tuner.scheduler import GradientScheduler, RoundResult, round_size

    start = time.perf_counter()
    picked = [t for t in model.tasks if tunable(t.prim_func)]
    tasks = [Task(t.name, t.workload_key, t.prim_func, target) for t in picked]
    trials: list[list] = [[] for _ in tasks]
    best: list[Any] = [None] * len(tasks)
    baselines: list[float | None] = [None] * len(tasks)
    measurer = LocalMeasurer()

    def tune_round(i: int, n: int) -> RoundResult:
        result = tune(tasks[i], len(trials[i]) + n, seed=seed, prior=trials[i], measurer=measurer, replay=False)
        trials[i] += result.trials
        best[i] = result.best
        baselines[i] = result.baseline_ms
        latency = result.best.latency_ms if result.best is not None else None
        print(f"      round: {tasks[i].name} (weight {picked[i].weight}) +{len(result.trials)} trials, best "
              f"{fmt_ms(latency)} ms (untuned {fmt_ms(result.baseline_ms)})", file=log, flush=True)
        return RoundResult(latency, len(result.trials))

    try:
        # as the model worker: rounds of up to `trials_per_round`, small enough that every task gets one
        scheduler = GradientScheduler([t.weight for t in picked], tune_round, budget,
                                      trials_per_round=round_size(budget, len(tasks), trials_per_round), seed=seed)
        scheduler.run()
    finally:
        measurer.close()
    schedules = {}
    for task, trial, untuned in zip(tasks, best, baselines):
        # a schedule slower than the untransformed program (measured the same way) is not used
        if trial is not None and (untuned is None or trial.latency_ms < untuned):
            schedules[task.workload_key] = apply_config(task, trial.config)
    tune_s = time.perf_counter() - start
    built = build_model(model, target, schedules)
    return {
        "built": built,
        "ours_tune_s": tune_s,
        "tasks": len(model.tasks),
        "tunable_tasks": len(picked),
        "tuned_tasks": len(schedules),
        "ours_trials": sum(len(t) for t in trials),
        "ours_errors": sum(t.error is not None for ts in trials for t in ts),
        "task_rows": [
            {"name": p.name, "workload_key": p.workload_key, "weight": p.weight, "trials": len(ts),
             "best_ms": b.latency_ms if b is not None else None, "untuned_ms": u}
            for p, ts, b, u in zip(picked, trials, best, baselines)
        ],
    }


def run_metaschedule(ep: Any, target: Any, budget: int, seed: int, work_dir: Path, trials_per_round: int) -> dict:
    """MetaSchedule's Relax integration at the same budget; returns its executable and tuning time."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program
    from tvm.s_tir import meta_schedule as ms

    from bench.baselines import quiet_metaschedule, target_cores, fast_tvmscript_import

    mod = relax.transform.DecomposeOpsForInference()(from_exported_program(ep))
    cores = target_cores(target)
    fast_tvmscript_import()
    import tvm.s_tir.tensor_intrin  # noqa: F401 - start-up, not search

    run_dir = Path(tempfile.mkdtemp(prefix="ms-model-", dir=work_dir))
    start = time.perf_counter()
    # tune_relax extracts the call_tir PrimFuncs it finds, so it gets the fused module; compile_relax
    # fuses the plain one with the same passes, so the database keys match
    fused = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
        relax.transform.FuseOps(), relax.transform.FuseTIR(),
    ])(mod)
    with quiet_metaschedule(run_dir / "logs"):
        database = ms.relax_integration.tune_relax(
            fused, None, target, str(run_dir), max_trials_global=budget, num_trials_per_iter=trials_per_round,
            builder=ms.builder.LocalBuilder(max_workers=cores, initializer=fast_tvmscript_import),
            seed=seed,
        )
    tune_s = time.perf_counter() - start
    with tvm.transform.PassContext(opt_level=3):
        ex = ms.relax_integration.compile_relax(database, mod, target, None)
    return {"ex": ex, "metaschedule_tune_s": tune_s,
            "metaschedule_trials": len(database.get_all_tuning_records())}


def _run_vm(ex: Any, inputs: list, params: list, target: Any, time_it: bool) -> tuple[list, float | None]:
    """Runs (and times) a VM executable on the inputs and the parameters it takes."""
    import numpy as np
    import tvm
    from tvm import relax

    from compiler.workloads.model import flatten_outputs

    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    args += [tvm.runtime.tensor(p, dev) for p in params]
    outs = flatten_outputs(vm["main"](*args))
    if not time_it:
        return outs, None
    timer = vm.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=50)
    return outs, statistics.median(timer(*args).results) * 1e3


def run_model(name: str, target_name: str, budget: int, seed: int, options: dict, log: Any) -> dict:
    """All three on one zoo model; a failure of one is reported in the row, never raised."""
    from compiler.target import resolve_target
    from compiler.workloads import zoo
    from compiler.workloads.model import build_model, import_model, torch_outputs

    target = resolve_target(target_name)
    module, torch_inputs = zoo.create(name, seed)
    import torch

    ep = torch.export.export(module, torch_inputs)
    inputs = [t.numpy() for t in torch_inputs]
    expected = torch_outputs(module, torch_inputs)
    model = import_model(ep, layout=options["layout"], target=target)
    row: dict[str, Any] = {"name": name, "budget": budget, "layout": options["layout"], "inputs": [list(s.shape) for s in
                                                                                      model.inputs]}
    print(f"  {name}: {len(model.tasks)} tasks, {sum(t.weight for t in model.tasks)} calls", file=log, flush=True)

    row["untuned_ms"] = None
    if options["untuned"]:
        untuned = build_model(model, target)
        _, row["untuned_ms"] = _run_vm(untuned.ex, inputs, untuned.params, target, True)

    row.update(ours_ms=None, ours_correct=False, error=None)
    try:
        ours = run_ours(model, target, budget, seed, options["trials_per_round"], log)
        built = ours.pop("built")
        row.update(ours)
        outs, ms_ = _run_vm(built.ex, inputs, built.params, target, True)
        mismatch = _check(outs, expected)
        row["ours_correct"] = mismatch is None
        if mismatch is None:
            row["ours_ms"] = ms_
        else:
            row["error"] = f"ours: {mismatch}"
    except Exception as e:  # noqa: BLE001
        row.setdefault("ours_tune_s", 0.0)
        row["error"] = f"ours: {type(e).__name__}: {str(e)[:300]}"
    row.setdefault("ours_tune_s", 0.0)

    row.update(metaschedule_ms=None, metaschedule_tune_s=None, metaschedule_correct=None, metaschedule_error=None)
    if options["metaschedule"]:
        try:
            ms = run_metaschedule(ep, target, budget, seed, options["work_dir"], options["trials_per_round"])
            ex = ms.pop("ex")
            row.update(ms)
            outs, ms_ = _run_vm(ex, inputs, [], target, True)
            mismatch = _check(outs, expected)
            row["metaschedule_correct"] = mismatch is None
            if mismatch is None:
                row["metaschedule_ms"] = ms_
            else:
                row["metaschedule_error"] = f"MetaSchedule: {mismatch}"
        except Exception as e:  # noqa: BLE001
            row["metaschedule_error"] = f"MetaSchedule failed: {type(e).__name__}: {str(e)[:300]}"
    row["torch_ms"] = torch_latency_fresh(name, seed) if options["torch"] else None
    row["correct"] = bool(row["ours_correct"]) and row["metaschedule_correct"] is not False
    row["vs_metaschedule"] = speedup(row["metaschedule_ms"], row["ours_ms"])
    row["vs_torch"] = speedup(row["torch_ms"], row["ours_ms"])
    return row


COLUMNS = (
    Column("model", lambda r: r["name"], right=False),
    Column("tasks", lambda r: f"{r.get('tuned_tasks', '-')}/{r.get('tasks', '-')}"),
    Column("untuned ms", lambda r: fmt_ms(r.get("untuned_ms"))),
    Column("ours ms", lambda r: fmt_ms(r.get("ours_ms"))),
    Column("MS ms", lambda r: fmt_ms(r.get("metaschedule_ms"))),
    Column("torch ms", lambda r: fmt_ms(r.get("torch_ms"))),
    Column("vs MS", lambda r: fmt_x(r.get("vs_metaschedule"))),
    Column("vs torch", lambda r: fmt_x(r.get("vs_torch"))),
    Column("ours tune s", lambda r: fmt_s(r.get("ours_tune_s"))),
    Column("MS tune s", lambda r: fmt_s(r.get("metaschedule_tune_s"))),
    Column("correct", lambda r: "yes" if r["correct"] else ("NO (ours)" if not r.get("ours_correct") else "NO (MS)"),
           right=False),
)


def table(report: dict) -> str:
    g = report["geomean"]
    footer = [{"name": "geomean", "vs_metaschedule": g["vs_metaschedule"], "vs_torch": g["vs_torch"],
               "correct": all(r["correct"] for r in report["cases"]), "ours_correct": True}]
    head = (f"models, target {report['target']}, budget {report['budget']} on-device measurements per model "
            f"(ours and MetaSchedule); tasks = tuned/all; speedup = baseline ms / ours ms")
    notes = [f"  {r['name']}: {r['error']}" for r in report["cases"] if r.get("error")]
    notes += [f"  {r['name']}: {r['metaschedule_error']}" for r in report["cases"] if r.get("metaschedule_error")]
    return "\n".join([head, format_table(COLUMNS, report["cases"], footer), *notes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo names")
    parser.add_argument("--budget", type=int, default=64, help="on-device measurements per model (default 64)")
    parser.add_argument("--trials-per-round", type=int, default=8,
                        help="most measurements per scheduler round (fewer when the budget could not otherwise "
                             "reach every task); MetaSchedule's trials per iteration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", default="blocked", choices=("blocked", "none"),
                        help="our graph-level layouts (compiler.workloads.model.MODEL_LAYOUTS)")
    parser.add_argument("--target", default="host")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--work-dir", type=Path, help="keep MetaSchedule's run folders here")
    parser.add_argument("--no-metaschedule", action="store_true")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-untuned", action="store_true")
    parser.add_argument("--torch-only", metavar="NAME", help=argparse.SUPPRESS)  # torch_latency_fresh's child
    args = parser.parse_args(argv)
    from compiler.workloads import zoo

    if args.torch_only:
        import json

        module, inputs = zoo.create(args.torch_only, args.seed)
        print(json.dumps({"torch_ms": torch_model_latency(module, inputs)}))
        return 0

    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in zoo.MODELS]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(zoo.MODELS)}")
    if args.budget < 1:
        parser.error("--budget must be >= 1")

    from bench.common import environment
    from compiler.target import target_key

    with tempfile.TemporaryDirectory(prefix="altune-bench-models-") as tmp:
        options = {"metaschedule": not args.no_metaschedule, "torch": not args.no_torch,
                   "untuned": not args.no_untuned, "layout": args.layout, "trials_per_round": args.trials_per_round,
                   "work_dir": args.work_dir or Path(tmp)}
        rows = []
        for i, name in enumerate(names):
            print(f"[{i + 1}/{len(names)}] {name} (budget {args.budget}) ...", file=sys.stderr, flush=True)
            rows.append(run_model(name, args.target, args.budget, args.seed, options, sys.stderr))
    report = {"suite": "models", "target": target_key(args.target), "budget": args.budget, "cases": rows,
              "geomean": geomeans(rows), "environment": environment()}
    print(table(report))
    path = write_json(report, args.json, bench="models")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
