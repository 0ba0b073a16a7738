"""Operator benchmark: ours vs TVM MetaSchedule (same number of measurements) vs torch, one run, one target.

    python -m bench.ops [--suite smoke|quick|full] [--cases NAME,...] [--spec FILE] [--budget N]
                        [--json PATH [--resume]] [--no-metaschedule] [--no-torch] [--no-untuned]
                        [--torch-variants eager,channels_last,compile] [--rounds N] [--ablation] [--no-seeds]
    python -m bench.ops --merge REPORT [REPORT ...] [--json PATH]
    python -m bench.ops --retime REPORT [--rounds N] [--json PATH]

For each case, every side at its best:

- ours: our tuner (`tuner.tune`: the ALT search, layouts and loops), the best few
  configurations re-measured at the end (`tune(remeasure=...)`, as a job does) and the
  pick built as the artifact is (our TIR pipeline, constants packed beforehand);
- ALT-OL, the ablation: ours, loops only in the fixed channels-last layout, same budget
  (column "ALT-OL", JSON `ours_loop_only_ms`);
- MetaSchedule: `tune_tir` with `max_trials_global` = the same budget on the same program
  as ours (`Workload.prim_func`: for conv2d_transpose the stride-phase form, not topi's
  zero-dilated one with about 4x the multiply-adds at stride 2), the constants marked
  layout-free as Relax marks weights and the layout rewrite run once beforehand, not in
  the timed function (`bench.baselines.metaschedule(layout_free=True)`);
- torch: eager NCHW, channels_last and `torch.compile` (inductor, `freezing=True`), the
  constants as module parameters, all cores; each variant is reported
  (`torch_variants_ms`) and the fastest is the baseline (`torch_ms`, `torch_best`).

Every program is checked against torch's output, then every program of the case is timed
in a fresh process of its own, one at a time, in shuffled order
(`bench.common.time_fresh`: TVM's thread pool spins for about 0.4 s after a run and would
steal a core from the next program; `--rounds N` times each N times, the median kept). A
reading is the median of 5 repeats of at least 50 ms (`time_evaluator`; torch: the same in
Python). Each run also measures the machine's fp32 FMA peak once (`bench.tensorize.peak_gflops`:
an FMA loop on every core, in a process of its own; report `peak`) and gives each fp32 pick's share
of it (column "%peak", JSON `<pick>_peak_share`): how much room a better search could still find.
Prints one table and writes the JSON report (`bench.common`) to --json or under
bench/results/. With --json the report is written after every case, so a stopped run
keeps what it finished, and the same command with --resume goes on from there (a suite
longer than one sitting runs in pieces); --merge joins reports of one target into one table;
--retime times a report's picks and torch again (no search, `--rounds` rounds, 3 by default), for
readings one round left in doubt.

`--ablation` also runs, at the same budget, (a) the seeds with random layouts, walks and ranking and (b) the
same ranked by the XGBoost model without the PPO agents, beside (c) full ALT and (d) ALT-OL (a second table).
`--no-seeds` runs every search of ours without its seeds (`tune(seeds=False)`: no known loop nests measured
first, no oneDNN-like first layout), so the ablation compares what each search finds on its own.

Suites: `smoke` (two tiny cases, for CI), `quick` (one case per operator kind,
ResNet/MobileNet/BERT-like shapes, the table of ../shared/DESIGN.md), `full`
(three shapes per operator kind: batch 1 and 16, channel counts from ALT's
sec. 7.1 set {3, 16, 32, 64, 512, 960, 1280}), `dot` (int8 and bfloat16 conv2d and
dense on the tensor-instruction paper's shapes: the dot-product instructions). `--spec` takes a JSON list of
operator job specs exactly as `POST /api/v1/jobs` accepts them.

This module runs the cases and is the command line; the suites and options are `bench.ops_cases`, the report,
`--merge`, `--resume` and the tables `bench.ops_report` (their names re-exported here).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from bench.baselines import metaschedule, untuned_latency
from bench.common import (TORCH_VARIANTS, MIN_REPEAT_MS, REPEAT, TorchProgram, TvmProgram, check_report, fmt_ms,
                          save_args, source_commit, speedup, time_fresh, write_json)
from bench.ops_cases import (ABLATIONS, DOT, FULL, QUICK, SMOKE, SUITES, Case, Options, SpecCase, load_specs,
                             select)
from bench.ops_report import PICKS, ablation_table, merge, report, resumable_rows, row_dtype, table
from bench.tensorize import bandwidth_gbs, peak_gflops
from bench.torch_operators import torch_operator
from compiler.arrays import arg_specs, check_close
from compiler.build import compile_module
from compiler.target import resolve_target, target_key
from compiler.workloads import make_workload
from tuner import apply_config, layout_of_config
from tuner.operator import task_from_request, tune_operator
from tuner.request import TuneRequest

__all__ = ["DOT", "FULL", "QUICK", "SMOKE", "SUITES", "Case", "Options", "SpecCase", "ablation_table", "build_pick",
           "load_specs", "main", "measure_peak", "merge", "report", "resumable_rows", "retime", "run", "run_case",
           "run_ours", "select", "table", "torch_programs"]


# ---------------------------------------------------------------------------
# Running


def _layout_of(trial: Any) -> str | None:
    """The data layout a trial chose, as text (the output layout; None: the user's layouts, loops only)."""
    return trial.extra.get("layout") if trial is not None else None


def run_ours(task: Any, request: Any, inputs: list, expected: Any, programs: dict[str, Any],
             folder: Path, *, prefix: str = "ours", **options: Any) -> dict:
    """Tunes `task` as an operator job does (`tuner.operator.tune_operator`; `options` go on to `tune`: the
    ablations), then builds and checks the configuration it picks.

    The best few configurations are measured again at the end (`remeasure_count(budget)`, as a job
    does) and the fastest then is the pick. A configuration in tuned layouts runs as the artifact
    does: data and output in the user's layouts, the constants packed once beforehand (not timed). A
    correct program goes into `programs` under `prefix` (exported to `folder`): `run_case` times it
    with the others.
    """

    start = time.perf_counter()
    result = tune_operator(task, request, **options)
    named = (lambda key: f"{prefix}_{key}") if prefix != "ours" else (lambda key: key)
    row: dict[str, Any] = {
        f"{prefix}_tune_s": time.perf_counter() - start,
        f"{prefix}_trials": len(result.trials),
        f"{prefix}_errors": sum(t.error is not None for t in result.trials),
        f"{prefix}_ms": None,
        f"{prefix}_correct": False,
        named("layout"): None,
        named("config"): None,
    }
    pick = result.final
    if pick is None:
        errors = {t.error for t in result.trials if t.error}
        row[named("error")] = (f"{prefix}: no correct trial in {len(result.trials)}"
                               + (f" (e.g. {sorted(errors)[0][:200]})" if errors else ""))
        return row
    row[named("config")] = pick.config
    row[named("layout")] = _layout_of(pick)
    row[f"{prefix}_search_ms"] = result.best.latency_ms  # the search's best reading (the winner's curse)
    row[f"{prefix}_final_ms"] = result.final_ms  # the pick's re-measured latency
    row[f"{prefix}_remeasured"] = len(result.remeasured_ms)
    program, error = build_pick(task, pick.config, inputs, expected, folder, prefix)
    row[f"{prefix}_correct"] = program is not None
    if program is None:
        row[named("error")] = error
        return row
    programs[prefix] = program
    return row


def build_pick(task: Any, config: dict, inputs: list, expected: Any, folder: Path,
               prefix: str) -> tuple[TvmProgram | None, str | None]:
    """`config` built as the artifact is (our pipeline; constants packed beforehand, not timed), exported to
    `folder` and checked against `expected`: (the program, None), or (None, why not)."""

    try:
        prog = layout_of_config(task, config)
        args = inputs if prog is None else prog.pack_inputs(inputs)
        program, out = _export(apply_config(task, config), task.prim_func, task.target, args, folder / prefix,
                               pipeline="licm")
    except Exception as e:  # noqa: BLE001 - a failed case is reported, the others still run
        return None, f"{prefix}: best configuration failed to build or run: {type(e).__name__}: {e}"[:500]
    mismatch = check_close(out, expected)
    return (program, None) if mismatch is None else (None, f"{prefix}: {mismatch}")


def _export(mod: Any, prim_func: Any, target: Any, args: list, path: Path,
            pipeline: str | None = None) -> tuple[TvmProgram, Any]:
    """`mod` built once (our pipeline, or TVM's default when None), exported with its arguments for
    `time_fresh`, and run once on them; (the program, its output)."""


    built = tvm.compile(mod, target=target) if pipeline is None else compile_module(mod, target, pipeline)
    built.export_library(str(path.with_suffix(".so")))
    shape, dtype = arg_specs(prim_func)[-1]
    arrays = [*args, np.zeros(shape, dtype)]
    tensors = [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays]
    built.jit()["main"](*tensors)
    program = TvmProgram(str(path.with_suffix(".so")), save_args(arrays, path.with_suffix(".npz")))
    return program, tensors[-1].numpy()


def torch_programs(case: Case, seed: int, variants: Sequence[str]) -> dict[str, TorchProgram]:
    """The torch variants of a case (channels_last only where an input is 4-D or 5-D)."""

    wl = make_workload(case.operator, case.params, case.dtype, case.epilogue)
    out = {}
    for variant in variants:
        if variant == "channels_last" and len(wl.inputs[0].shape) not in (4, 5):
            continue
        out[f"torch_{variant}"] = TorchProgram(torch_operator, (case.operator, dict(case.params), case.dtype,
                                                                case.epilogue, seed), variant)
    return out


def run_case(case: Case, target_name: str, budget: int, seed: int, options: Options) -> dict:
    """Runs ours and the baselines on one case, then times them; never raises for a failure of one of them."""


    # the task a job of this request would tune (the worker and `altune tune` build it the same way)
    request = TuneRequest(case.operator, case.params, case.dtype, case.epilogue, target_name, budget=budget, seed=seed,
                          layout_levels=options.layout_levels)
    task = task_from_request(request)
    wl, target = task.workload, task.target
    inputs = wl.random_inputs(seed)
    expected = wl.reference(inputs)
    row: dict[str, Any] = {
        "name": case.name,
        "operator": case.operator,
        "params": dict(wl.params),
        "epilogue": case.epilogue,
        "workload_key": wl.key,
        "flops": wl.flops,
        "budget": budget,
        "commit": source_commit(),  # a suite run in pieces (--resume, --merge) may span versions
        "untuned_ms": untuned_latency(wl.prim_func, target, inputs) if options.untuned else None,
    }
    task = replace(task, name=case.name, inputs=inputs, expected=expected)
    programs: dict[str, Any] = {}  # every correct program, timed together at the end
    with tempfile.TemporaryDirectory(prefix="altune-bench-programs-") as tmp:
        folder = Path(tmp)
        row["layout_levels"] = options.layout_levels
        row["seeds"] = options.seeds
        row.update(run_ours(task, request, inputs, expected, programs, folder, seeds=options.seeds))
        if options.loop_only:  # ALT-OL: loops only, in the fixed channels-last layout (NHWO / MN)
            row.update(run_ours(task, request, inputs, expected, programs, folder, prefix="ours_loop_only",
                                layout={}, seeds=options.seeds))
        if options.ablation:  # what the agents and the model add over the seeds, at the same budget
            for prefix, tune_options in ABLATIONS.items():
                row.update(run_ours(task, request, inputs, expected, programs, folder, prefix=prefix,
                                    seeds=options.seeds, **tune_options))

        row.update(metaschedule_ms=None, metaschedule_tune_s=None, metaschedule_trials=None,
                   metaschedule_correct=None, metaschedule_error=None)
        if options.metaschedule:
            # the same program as ours (the stride-phase conv2d_transpose too), constants layout-free
            ms = metaschedule(wl.prim_func, target, budget, options.work_dir, seed=seed, inputs=inputs,
                              expected=expected, layout_free=True)
            row.update(metaschedule_tune_s=ms.tune_s, metaschedule_trials=ms.trials, metaschedule_correct=ms.correct,
                       metaschedule_error=ms.error, metaschedule_alone_ms=ms.latency_ms,
                       metaschedule_rewritten=list(ms.prepacked.rewritten) if ms.prepacked else [])
            if ms.correct:
                programs["metaschedule"], _ = _export(ms.mod, wl.prim_func, target, ms.args(inputs, target),
                                                      folder / "metaschedule")
        if options.torch:
            programs.update(torch_programs(case, seed, options.torch_variants))
        # each in a fresh process, one at a time, in shuffled order
        timings = time_fresh(programs, seed=seed, rounds=options.rounds)
    _record_timings(row, timings)
    return row


def _record_timings(row: dict, timings: Any) -> None:
    """The readings of `timings` into `row` (ours, its ablations, MetaSchedule, each torch variant and the best),
    then the speedups and whether the row is correct (ours checked, MetaSchedule not found wrong)."""
    row["correct"] = bool(row.get("ours_correct")) and row.get("metaschedule_correct") is not False
    for name in ("ours", "ours_loop_only", "metaschedule", *ABLATIONS):
        if name in timings.ms:
            row[f"{name}_ms"] = timings.ms[name]
    variants = {name[len("torch_"):]: ms_ for name, ms_ in timings.ms.items() if name.startswith("torch_")}
    if variants:
        timed = {v: ms_ for v, ms_ in variants.items() if ms_ is not None}
        row["torch_variants_ms"] = variants
        row["torch_best"] = min(timed, key=timed.get) if timed else None
        row["torch_ms"] = timed[row["torch_best"]] if timed else None
    row.setdefault("torch_ms", None)  # --no-torch
    row.setdefault("metaschedule_ms", None)  # --no-metaschedule
    row["timing"] = "fresh-process"
    row["timing_order"] = [str(n) for n in timings.order]
    row["ours_gflops"] = row["flops"] / row["ours_ms"] / 1e6 if row["ours_ms"] else None
    row["vs_metaschedule"] = speedup(row["metaschedule_ms"], row["ours_ms"])
    row["vs_torch"] = speedup(row["torch_ms"], row["ours_ms"])
    row["vs_loop_only"] = speedup(row.get("ours_loop_only_ms"), row["ours_ms"])
    for prefix in ABLATIONS:
        if f"{prefix}_ms" in row:
            row[f"vs_{prefix}"] = speedup(row[f"{prefix}_ms"], row["ours_ms"])


def retime(earlier: dict, *, target: str = "host", seed: int = 0, rounds: int = 3,
           variants: Sequence[str] = TORCH_VARIANTS, log: Any = sys.stderr) -> dict:
    """The report `earlier` with its programs timed again, searching nothing: each row's picks (ours, ALT-OL and
    the ablations' configurations) rebuilt and checked, the torch variants, all in fresh processes, `rounds`
    rounds in shuffled order (the median kept). MetaSchedule's schedule is not in the report: its reading stays
    the earlier run's (`retimed` lists what was timed again).

    Raises:
        ValueError: the report was measured on another target than `target` resolves to here.
    """

    check_report(earlier)
    if earlier["target"] != target_key(target):
        raise ValueError(f"the report was measured on {earlier['target']!r}, this machine's {target!r} is "
                         f"{target_key(target)!r}: re-timing on another CPU says nothing about that run")
    rows = []
    for i, old in enumerate(earlier["cases"]):
        print(f"[{i + 1}/{len(earlier['cases'])}] {old['name']}: re-timing ...", file=log, flush=True)
        row = dict(old)
        case = Case(row["name"], row["operator"], dict(row["params"]), row.get("epilogue", "none"), row_dtype(row))
        task = task_from_request(TuneRequest(case.operator, case.params, case.dtype, case.epilogue, target))
        inputs = task.workload.random_inputs(seed)
        expected = task.workload.reference(inputs)
        task = replace(task, name=case.name, inputs=inputs, expected=expected)
        programs: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="altune-bench-retime-") as tmp:
            for name, key in PICKS.items():
                if row.get(key) is None:
                    continue
                program, error = build_pick(task, row[key], inputs, expected, Path(tmp), name)
                if program is None:
                    row[f"{name}_ms"], row[f"{name}_correct"] = None, False
                    row["error" if name == "ours" else f"{name}_error"] = error
                else:
                    programs[name] = program
            if variants:
                programs.update(torch_programs(case, seed, variants))
            timings = time_fresh(programs, seed=seed, rounds=rounds)
        _record_timings(row, timings)
        row["retimed"], row["rounds"] = sorted(programs), rounds
        rows.append(row)
    out = report(earlier["suite"], earlier["target"], earlier.get("budgets", [earlier["budget"]]), rows,
                 peak=measure_peak(target))
    out["retimed_from"] = earlier.get("environment", {}).get("date_utc")
    return out


def run(
    suite: str,
    cases: list[Case] | list[SpecCase],
    *,
    target: str = "host",
    budget: int | None = None,
    seed: int = 0,
    options: Options = Options(),
    log: Any = sys.stderr,
    done: Sequence[dict] = (),
    on_case: Callable[[dict], None] | None = None,
) -> dict:
    """Runs `cases` and returns the report (see `bench.common`).

    Args:
        suite: the suite's name (or "spec" for job specs), recorded in the report.
        cases: suite cases, or `SpecCase`s that carry their own target, budget and seed.
        target: target name for suite cases.
        budget: measurements per tuner; for spec cases, overrides the spec's budget when given.
        seed: seed of inputs, ours and MetaSchedule for suite cases.
        options: which baselines to run.
        log: where progress lines go.
        done: rows of an earlier run (interrupted, or of other cases); the cases they hold are not
            run again, and all of them stay in the report.
        on_case: called with the report so far after every case (to save it as it grows).
    """

    default_budget = SUITES[suite][1] if suite in SUITES else 64
    plan = []
    for c in cases:
        if isinstance(c, SpecCase):
            plan.append((c.case, c.target, budget if budget is not None else c.budget, c.seed))
        else:
            plan.append((c, target, budget if budget is not None else default_budget, seed))
    targets = {target_key(t) for _, t, _, _ in plan}
    if len(targets) > 1:
        raise ValueError(f"one benchmark runs on one target; the cases name {sorted(targets)}")
    budgets = sorted({b for _, _, b, _ in plan})
    target_text = targets.pop() if targets else target_key(target)
    finished = {r["name"]: r for r in done}
    planned = {c.name for c, _, _, _ in plan}
    # the earlier report's other cases stay in it: a run of some cases (--cases) adds to a report
    rows = [r for r in done if r["name"] not in planned]
    rows += [finished[c.name] for c, _, _, _ in plan if c.name in finished]
    peak = measure_peak(plan[0][1] if plan else target) if options.peak else None  # a target name, not its key

    with tempfile.TemporaryDirectory(prefix="altune-bench-") as tmp:
        work = options.work_dir if options.work_dir is not None else Path(tmp)
        opts = replace(options, work_dir=work)
        for i, (case, target_name, case_budget, case_seed) in enumerate(plan):
            if case.name in finished:
                print(f"[{i + 1}/{len(plan)}] {case.name}: done in the earlier run", file=log, flush=True)
                continue
            print(f"[{i + 1}/{len(plan)}] {case.name} (budget {case_budget}) ...", file=log, flush=True)
            row = run_case(case, target_name, case_budget, case_seed, opts)
            torch_text = ", ".join(f"{v} {fmt_ms(ms_)}" for v, ms_ in row.get("torch_variants_ms", {}).items())
            print(f"    ours {fmt_ms(row['ours_ms'])} ms ({row.get('layout')}), "
                  f"loop-only {fmt_ms(row.get('ours_loop_only_ms'))} ms, "
                  f"MetaSchedule {fmt_ms(row['metaschedule_ms'])} ms, "
                  f"torch {fmt_ms(row['torch_ms'])} ms ({torch_text})"
                  + (f"  [{row['error']}]" if row.get("error") else ""), file=log, flush=True)
            rows.append(row)
            if on_case is not None:
                on_case(report(suite, target_text, budgets or [budget or default_budget], rows, peak=peak))
    return report(suite, target_text, budgets or [budget or default_budget], rows, peak=peak)


def measure_peak(target: str) -> dict | None:
    """This machine's fp32 FMA peak (`bench.tensorize.peak_gflops`, in a process of its own); None if it fails."""

    try:
        return peak_gflops(resolve_target(target), REPEAT, int(MIN_REPEAT_MS))
    except Exception as e:  # noqa: BLE001 - a table without the peak column is still a table
        print(f"fp32 peak not measured: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return None


def measure_bandwidth(target: str) -> dict | None:
    """This machine's memory bandwidth (`bench.tensorize.bandwidth_gbs`, in a process of its own); None if it
    fails."""

    try:
        return bandwidth_gbs(resolve_target(target), REPEAT, int(MIN_REPEAT_MS))
    except Exception as e:  # noqa: BLE001 - a table without the bandwidth is still a table
        print(f"memory bandwidth not measured: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ops", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--suite", default="quick", choices=sorted(SUITES), help="case suite (default quick)")
    parser.add_argument("--cases", help="comma-separated case names of the suite (default: all)")
    parser.add_argument("--spec", type=Path, help="JSON list of operator job specs (POST /api/v1/jobs format)")
    parser.add_argument("--budget", type=int, help="on-device measurements per tuner (default: the suite's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="host", help="target name for suite cases (default host)")
    parser.add_argument("--json", type=Path, help="where to write the report (default bench/results/...)")
    parser.add_argument("--work-dir", type=Path, help="keep MetaSchedule's run folders (logs, database) here")
    parser.add_argument("--no-metaschedule", action="store_true", help="skip the MetaSchedule baseline")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch baseline")
    parser.add_argument("--no-untuned", action="store_true", help="skip timing the untuned program")
    parser.add_argument("--no-loop-only", action="store_true",
                        help="skip the ALT-OL ablation (ours, loops only, fixed channels-last layout)")
    parser.add_argument("--torch-variants", default=",".join(TORCH_VARIANTS),
                        help=f"comma-separated torch variants to time (default: all of {', '.join(TORCH_VARIANTS)})")
    parser.add_argument("--rounds", type=int,
                        help="fresh-process readings per program, in a new shuffled order each round (median)")
    parser.add_argument("--layout-levels", type=int, default=1, choices=(1, 2),
                        help="ours: one-level layout templates (default, the paper's) or two-level output tiling")
    parser.add_argument("--resume", action="store_true",
                        help="go on with the report at --json: its finished cases are kept, not run again")
    parser.add_argument("--ablation", action="store_true",
                        help="also (a) the seeds with random layouts and walks, (b) the XGBoost search without PPO, "
                             "at the same budget, beside (c) ALT and (d) ALT-OL")
    parser.add_argument("--no-seeds", action="store_true",
                        help="every search of ours (ALT, ALT-OL, the ablations) without its seeds: no known loop nests "
                             "measured first, no oneDNN-like first layout (what the search finds on its own)")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="REPORT",
                        help="run nothing: merge these reports (one target) into one table and --json")
    parser.add_argument("--retime", type=Path, metavar="REPORT",
                        help="search nothing: rebuild the picks of REPORT (this machine's target) and time them and "
                             "torch again in fresh processes, --rounds rounds (default here 3), into --json")
    args = parser.parse_args(argv)
    if args.budget is not None and args.budget < 1:
        parser.error("--budget must be >= 1")
    if args.resume and args.json is None:
        parser.error("--resume needs --json: the report to go on with")
    variants = tuple(v for v in args.torch_variants.split(",") if v)
    if not variants or set(variants) - set(TORCH_VARIANTS):
        parser.error(f"--torch-variants: each of {', '.join(TORCH_VARIANTS)}, got {args.torch_variants!r}")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be >= 1")

    if args.retime:
        try:
            retimed = retime(json.loads(args.retime.read_text()), target=args.target, seed=args.seed,
                             rounds=args.rounds or 3, variants=() if args.no_torch else variants)
        except (OSError, ValueError) as e:
            parser.error(f"--retime: {e}")
        print(table(retimed))
        if any("ablation_seeds_random_ms" in r for r in retimed["cases"]):
            print(ablation_table(retimed))
        print(f"wrote {write_json(retimed, args.json)}")
        return 0

    if args.merge:
        try:
            merged = merge([json.loads(Path(p).read_text()) for p in args.merge])
        except (OSError, ValueError) as e:
            parser.error(f"--merge: {e}")
        print(table(merged))
        print(f"wrote {write_json(merged, args.json)}")
        return 0

    try:
        if args.spec is not None:
            if args.cases:
                parser.error("--cases picks suite cases; a --spec file runs all its specs")
            suite, cases = "spec", load_specs(args.spec)
        else:
            suite, cases = args.suite, select(args.suite, args.cases.split(",") if args.cases else None)
        done = (resumable_rows(args.json, suite, args.target, args.budget)
                if args.resume and args.json.exists() else [])
    except ValueError as e:
        parser.error(str(e))
    options = Options(not args.no_metaschedule, not args.no_torch, not args.no_untuned, args.work_dir,
                      not args.no_loop_only, args.layout_levels, variants, args.rounds or 1, args.ablation,
                      seeds=not args.no_seeds)
    # with --json, the report is written after every case: an interrupted run keeps what it finished
    save = (lambda partial: write_json(partial, args.json)) if args.json is not None else None
    final = run(suite, cases, target=args.target, budget=args.budget, seed=args.seed, options=options, done=done,
                on_case=save)
    print(table(final))
    if args.ablation:
        print(ablation_table(final))
    path = write_json(final, args.json)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
