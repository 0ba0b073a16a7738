"""Running a model job (kind "model"): prepare in the sandbox, tune every tunable task, build in a child, store.

`service.worker` calls `run_model_job(run)` with its `JobRun` for a job of kind
"model"; the lease, heartbeat, cancel, deadline and trial recording are the worker's.

1. Nothing of the upload runs in this process. The sandbox (`service.sandbox`, `prepare`: the confined child the
   API's upload check uses) loads the stored file (`spec["model_file"]`) with the checking loader, translates it
   to Relax, runs the exported program on the job's random inputs (the reference outputs) and times torch eager;
   it writes the translated graph, weights and outputs as files, which this process copies (regular files only)
   and reads as hostile data (`compiler.workloads.model.exchange.load_graph`: node types and operators on an
   allowlist, arrays without pickle, every tensor bounded). The graph is lowered in the job's layouts here; the
   job's tasks (made by the API, one per distinct fused subgraph) are matched by workload key.
   With `"layout": "search"` the joint stage (`tuner.graph_layout`, `JOINT_SHARE` of the budget) first chooses
   the convs' channel blocks; the job's model is lowered in them (kept in `spec["blocks"]`).
2. Tasks with a known schedule on this target (`schedules` table) get one
   measurement of it (`start_from`) and no more, so a re-submitted model
   finishes quickly; the other tunable tasks share the rest of the budget under
   `tuner.scheduler.GradientScheduler` (rounds of `tune(prior=...)`, so a
   resumed job continues from its stored trials).
3. After every trial the job's `best_latency_ms` is the model's estimated
   latency, sum of weight x (best, else untuned) over the tuned tasks.
4. At the end: each task's pick is its best few trials measured again (`tuner.tune.remeasure_best`, one per 32
   trials, none below 32), the fastest reading; it is applied only when it beats the task's default schedule (what
   `build_model` gives an untuned function, measured once here by the same measurer; the raw unscheduled
   function when that fails). The whole model is then built, checked against the reference outputs, timed and
   written as the artifact in a child with memory, CPU and time limits (`service.model_build`; a schedule whose
   model does not match is removed and never stored in `schedules`; when even the untuned model does not match,
   the job fails and nothing is served; when the untuned model is faster end to end, timed twice, it is served).
5. The report (import notes, the check, removed schedules, latencies) is written to `spec["report"]` (the
   job's public spec; `service/schemas.py` has no field for it) and to the artifact's manifest.

A cancel, a lost lease or the job's deadline stops the job within seconds, mid-build included (the build's child
is killed); a cancelled job keeps its trials and builds nothing. Every write goes through the worker's retry, so a
database outage shorter than `db_retry_seconds` loses nothing.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import update

from compiler.target import resolve_target, target_key
from compiler.workloads.model.exchange import load_graph
from compiler.workloads.model.importer import graph_blocks, lower_graph
from compiler.workloads.pt2 import ModelError
from service import sandbox
from service.db import session_scope
from service.model_build import GRAPH_FILES, build_in_child, copy_regular
from service.models import Job, Schedule, TrialRow, TuningTask
from service.settings import Settings
from service.worker import LeaseLost
from tuner import LocalMeasurer, Task, Trial, apply_config, build_pipeline, tune
from tuner.graph_layout import tunable
from tuner.scheduler import GradientScheduler, RoundResult, estimated_latency, round_size
from tuner.tune import remeasure_best, remeasure_count

if TYPE_CHECKING:
    from service.worker import JobRun

log = logging.getLogger("altune.model_worker")
TRIALS_PER_ROUND = 8


def _task_rows(s: Any, job_id: int, model_tasks: list) -> dict[str, TuningTask]:
    """The job's task rows by workload key, with a row added for each of `model_tasks` that has none (a task of a
    layout the joint stage tried, or of a job made before tasks were stored at submission)."""
    by_key = {r.workload_key: r for r in TuningTask.where_job(s, job_id)}
    for t in model_tasks:
        if t.workload_key not in by_key:
            row = TuningTask(job_id=job_id, index=len(by_key), name=t.name[:128], workload_key=t.workload_key,
                             weight=t.weight, budget=0)
            s.add(row)
            s.flush()
            by_key[t.workload_key] = row
    return by_key


def _search_layouts(run: JobRun, graph: Any, target: Any, measurer: Any, budget: int, seed: int,
                    fusion: str) -> tuple[Any, dict]:
    """ALT's joint stage (`tuner.graph_layout`) on `JOINT_SHARE` of the budget: every measurement recorded on its
    task's row (rows added as layouts make tasks); a resumed job's measured tasks are not measured again.
    Returns the model in the chosen layouts and the report's "layout_search"."""
    from tuner.graph_layout import joint_budget, search_layouts
    from tuner.task import best_trial

    rows: dict[str, int] = {}
    counts: dict[str, int] = {}
    known: dict[str, float] = {}
    with session_scope(run.url) as s:
        for row in TuningTask.where_job(s, run.job_id):
            rows[row.workload_key] = row.id
            trials = TrialRow.trials_of(s, row.id)
            counts[row.workload_key] = len(trials)
            best = best_trial(trials)
            if best is not None:
                known[row.workload_key] = best.latency_ms

    def on_measure(task: Any, trial: Any) -> None:
        if task.workload_key not in rows:
            with session_scope(run.url) as s:
                rows.update({k: r.id for k, r in _task_rows(s, run.job_id, [task]).items()})
        index = counts.get(task.workload_key, 0)
        counts[task.workload_key] = index + 1
        run.record_trial(rows[task.workload_key], replace(trial, index=index))

    result = search_layouts(graph, target, measurer, joint_budget(budget), seed=seed, fusion=fusion,
                            max_tensor_elements=run.settings.max_tensor_elements, known=known,
                            on_measure=on_measure, should_stop=run.should_stop)
    report = {"measurements": result.measurements, "rule_estimate_ms": result.rule_ms,
              "chosen_estimate_ms": result.estimate_ms, "rounds": result.rounds, "blocks": result.blocks,
              "note": "estimates: sum over the model's tasks of calls x measured latency (a short loop search for "
                      "convs, the default schedule for the rest), conversions included"}
    return result.model, report


def prepare_model(settings: Settings, spec: dict, work: Path, *,
                  should_stop: Callable[[], str | None] | None = None) -> tuple[Any, list, float | None]:
    """Everything torch does with the job's upload, in the sandbox (`prepare`): its translated graph and the
    reference outputs, written into `work` and read back as checked data; torch eager's latency.

    Raises:
        ModelError: the sandbox refused the file, or it ran past a limit (named); the translation is not data.
        sandbox.Stopped: `should_stop` gave a reason.
    """
    request = {
        "input_shapes": spec.get("input_shapes"), "seed": int(spec.get("seed", 0)),
        "max_tensor_elements": settings.max_tensor_elements, "max_bytes": settings.max_upload_bytes,
        "max_unpacked_bytes": settings.max_unpacked_bytes, "max_ratio": settings.max_zip_ratio,
    }
    limit = settings.max_unpacked_bytes + (64 << 20)

    def collect(home: Path) -> None:
        for name in GRAPH_FILES:
            copy_regular(home / sandbox.PREPARED / name, work / name, limit)

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with open(spec["model_file"], "rb") as f:
        result, _ = sandbox.run("prepare", request, stdin=f, limits=sandbox.limits_from(settings), collect=collect,
                                should_stop=should_stop)
    graph, expected = load_graph(work, max_tensor_elements=settings.max_tensor_elements,
                                 max_total_bytes=settings.sandbox_memory_bytes)
    torch_ms = result.get("torch_ms") if isinstance(result, dict) else None
    return graph, expected, torch_ms if isinstance(torch_ms, float) and torch_ms > 0 else None


def run_model_job(run: JobRun) -> None:
    """Tune, build and store a model job (the worker checked its attempts); ends in a finished status unless the
    lease is lost."""
    work = run.settings.resolved_artifact_dir / "work" / f"job-{run.job_id}"
    try:
        _run_model_job(run, work)
    except sandbox.Stopped as e:
        _stopped(run, e.reason)
    except ModelError as e:
        run.finish("failed", error=f"{e.field}: {e.message}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _stopped(run: JobRun, reason: str) -> None:
    if reason == "lease":
        raise LeaseLost()
    if reason == "deadline":
        run.finish("failed", error=run.deadline_error())
    else:
        run.finish("cancelled")


def _run_model_job(run: JobRun, work: Path) -> None:
    with session_scope(run.url) as s:
        job = Job.find_or_raise_by_id(s, run.job_id)
        spec, budget = dict(job.spec), job.budget

    target = resolve_target(spec["target"])
    settings = run.settings
    # nothing of the upload runs here: torch loads, translates and runs it in the sandbox, and what comes back is
    # data, checked as such (`compiler.workloads.model.exchange`); jobs submitted before graph-level layouts have
    # no "layout": their tasks were made without one
    graph, expected, torch_ms = prepare_model(settings, spec, work, should_stop=run.stop_check)
    layout, fusion = spec.get("layout", "none"), spec.get("fusion", "none")
    tkey = target_key(spec["target"])
    seed = int(spec.get("seed", 0))
    pipeline = build_pipeline(spec)
    measurer = LocalMeasurer(timeout_s=run.settings.measure_timeout, pipeline=pipeline)
    search_report: dict[str, Any] | None = spec.get("layout_search")
    try:
        if layout == "search" and "blocks" not in spec:  # ALT's joint stage (a resumed job has its blocks)
            model, search_report = _search_layouts(run, graph, target, measurer, budget, seed, fusion)
            if run.stop_reason is not None:
                measurer.close()
                _stopped(run, run.stop_reason)
                return
            spec["blocks"], spec["layout_search"] = model.blocks, search_report
            run.write("layout search", lambda s: s.execute(
                update(Job).where(Job.id == run.job_id).values(spec=dict(spec))))
        else:
            blocks = graph_blocks(graph, spec["blocks"], target) if spec.get("blocks") else None
            model = lower_graph(graph, layout=layout, target=target, fusion=fusion, blocks=blocks,
                                max_tensor_elements=settings.max_tensor_elements)
    except BaseException:
        measurer.close()
        raise

    picked = [t for t in model.tasks if tunable(t.prim_func)]
    tasks = [Task(t.name, t.workload_key, t.prim_func, target) for t in picked]
    rows: list[int] = []
    prior: list[list[Trial]] = []
    known: list[dict | None] = []
    with session_scope(run.url) as s:
        by_key = _task_rows(s, run.job_id, model.tasks)
        spent = sum(TrialRow.stage_summary(s, run.job_id)[0].values())  # the joint stage's too, kept task or not
        for t in picked:
            row = by_key[t.workload_key]
            rows.append(row.id)
            prior.append(TrialRow.trials_of(s, row.id))
            schedule = Schedule.find_by_key(s, t.workload_key, tkey)
            known.append(dict(schedule.config) if schedule is not None else None)

    best: list[Any] = [None] * len(tasks)
    untuned: list[float | None] = [None] * len(tasks)
    weights = [t.weight for t in picked]

    def publish() -> None:
        values = [b.latency_ms if b is not None else None for b in best]
        estimate = estimated_latency(weights, values, untuned)
        if estimate is not None:
            run.write("estimate", lambda s: s.execute(
                update(Job).where(Job.id == run.job_id).values(best_latency_ms=estimate)))

    def tune_round(i: int, n: int, start_from: list[dict] = ()) -> RoundResult:
        result = tune(tasks[i], len(prior[i]) + n, seed=seed, prior=prior[i], start_from=start_from,
                      on_trial=lambda trial: run.record_trial(rows[i], trial), should_stop=run.should_stop,
                      measurer=measurer, replay=False)
        prior[i] += result.trials
        best[i], untuned[i] = result.best, result.baseline_ms
        if result.baseline_ms is not None:
            run.write("baseline", lambda s: s.execute(
                update(TuningTask).where(TuningTask.id == rows[i]).values(baseline_ms=result.baseline_ms)))
        publish()
        if run.stop_reason == "lease":
            raise LeaseLost()
        return RoundResult(result.best.latency_ms if result.best is not None else None, len(result.trials))

    default_ms: dict[int, float | None] = {}
    try:  # the measurer is closed at the end, whatever happens
        # known schedules first: one measurement each (none when this job already measured it)
        fresh = []
        for i, config in enumerate(known):
            if config is None:
                fresh.append(i)
                continue
            measured = any(t.config == config for t in prior[i])
            tune_round(i, 0 if measured else 1, [] if measured else [config])
            spent += 0 if measured else 1
        if fresh and budget > spent:
            local = {j: i for j, i in enumerate(fresh)}
            per_round = round_size(budget - spent, len(fresh), TRIALS_PER_ROUND)
            scheduler = GradientScheduler(
                [weights[i] for i in fresh], lambda j, n: tune_round(local[j], n), budget - spent,
                trials_per_round=per_round, seed=seed, should_stop=run.should_stop,
            )
            for j, i in local.items():  # resumed: the scheduler starts from what each task already has
                if prior[i]:
                    scheduler.state.rounds[j] = max(1, len(prior[i]) // per_round)
                    scheduler.state.trials[j] = len(prior[i])
                    b = best_of(prior[i])
                    scheduler.state.history[j].append(b.latency_ms if b is not None else None)
            scheduler.run()
        if run.stop_reason is None:
            # a tuned schedule is kept only when it beats the schedule its task gets otherwise (the default one
            # `build_model` gives an untuned function), measured here the same way, not the raw function
            for i, task in enumerate(tasks):
                b = best[i] if best[i] is not None else best_of(prior[i])
                if b is not None:
                    default_ms[i] = _measure_default(measurer, task)
                # the pick by re-measurement, as an operator job's: a task's best few measured again (one per 32
                # of its trials, none below 32), the fastest reading kept, not the luckiest search reading
                count = remeasure_count(len(prior[i]))
                if b is not None and count and not run.should_stop():
                    pick, pick_ms, readings = remeasure_best(task, prior[i], measurer, count)
                    if pick is not None and pick_ms is not None:
                        best[i] = replace(pick, latencies_ms=[pick_ms], extra={**pick.extra, "remeasured": readings})
    finally:
        measurer.close()
    if run.stop_reason is not None:  # a cancel keeps the measured trials; nothing more is built
        _stopped(run, run.stop_reason)
        return

    schedules, beaten = {}, []
    for i, task in enumerate(tasks):
        b = best[i] if best[i] is not None else best_of(prior[i])
        if b is None:
            continue
        versus = default_ms.get(i)
        versus = versus if versus is not None else untuned[i]
        if versus is None or b.latency_ms < versus:
            schedules[task.workload_key] = apply_config(task, b.config)
        else:
            beaten.append(task.workload_key)

    names = {t.workload_key: t.name for t in model.tasks}
    report: dict[str, Any] = {
        "import_notes": list(model.notes),
        "schedules": {"default_schedule_faster": [{"task": names[k], "workload_key": k} for k in beaten]},
    }
    if search_report is not None:
        report["layout_search"] = search_report
    facts = {}
    for i, task in enumerate(tasks):
        b = best[i] or best_of(prior[i])
        facts[task.workload_key] = {"latency_ms": b.latency_ms if b else None, "default_ms": default_ms.get(i),
                                    "untuned_ms": untuned[i]}
    # the whole-model build, check and timing run in a child with memory and time limits (`service.model_build`):
    # the check against the reference outputs the sandbox computed, the artifact written by our build alone
    request = {"target": spec["target"], "layout": layout, "fusion": fusion, "blocks": spec.get("blocks"),
               "max_tensor_elements": settings.max_tensor_elements, "max_total_bytes": settings.sandbox_memory_bytes,
               "seed": seed, "pipeline": pipeline, "report": report, "tasks": facts, "spec": spec,
               "torch_ms": torch_ms}
    dest = run.settings.resolved_artifact_dir / f"job-{run.job_id}.tar.gz"
    result = build_in_child(settings, work, request, schedules, dest, should_stop=run.stop_check)
    report = result["report"]
    if result["error"] is not None:
        _save_report(run, spec, report)
        run.finish("failed", error=result["error"])
        return
    run.store_artifact(dest)
    removed = set(result["removed"])
    for i, task in enumerate(tasks):
        b = best[i] or best_of(prior[i])
        if b is not None and task.workload_key not in removed:
            # kept even when the default schedule wins: the task need not be searched again; never one the
            # whole-model check removed
            run.store_schedule(task.workload_key, tkey, b.config, b.latency_ms)

    def finish_rows(s: Any) -> None:
        for i, row_id in enumerate(rows):
            s.execute(update(TuningTask).where(TuningTask.id == row_id).values(budget=len(prior[i])))
        s.execute(update(Job).where(Job.id == run.job_id).values(best_latency_ms=result["latency_ms"],
                                                                 baseline_ms=result["untuned_ms"]))

    run.write("results", finish_rows)
    _save_report(run, spec, report)
    run.finish("succeeded")


def _measure_default(measurer: Any, task: Any) -> float | None:
    """Median latency of the task's default schedule, None when it could not be measured."""
    from tuner.graph_layout import default_schedule_latency

    latencies, error = default_schedule_latency(measurer, task)
    if latencies is None:
        log.warning("task %s: its default schedule failed: %s", task.name, error)
        return None
    return sorted(latencies)[len(latencies) // 2]


def _save_report(run: JobRun, spec: dict, report: dict) -> None:
    """The job's report (the whole-model check, latencies), as `spec["report"]`: `JobPublic` shows the spec."""
    run.write("report", lambda s: s.execute(
        update(Job).where(Job.id == run.job_id).values(spec={**spec, "report": report})))


def best_of(trials: list) -> Any:
    from tuner.task import best_trial

    return best_trial(trials)


