"""Running a model job (kind "model"): import, tune every tunable task under the gradient scheduler, build, store.

`service.worker` calls `run_model_job(run)` with its `JobRun` for a job of kind
"model"; the lease, heartbeat, cancel and trial recording are the worker's.

1. The uploaded file (`spec["model_file"]`, content-addressed) is loaded with
   the safe loader and imported; the job's tasks (made by the API, one per
   distinct fused subgraph) are matched by workload key.
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
   function when that fails); the model is built and checked whole against the exported program's own
   output (`compiler.workloads.model.build_checked`: a schedule whose model does not match is removed, its
   task back to the default schedule, and never stored in `schedules`; when even the untuned model does not
   match, the job fails and nothing is served); the artifact's, the untuned model's and torch eager's
   end-to-end latencies are measured (when the untuned model is faster end to end, timed twice, it is served
   instead); the artifact (`write_model_artifact`) stored, and the schedules table updated.
5. The report (import notes, the check, removed schedules, latencies) is written to `spec["report"]` (the
   job's public spec; `service/schemas.py` has no field for it) and to the artifact's manifest.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import update

from service.db import session_scope
from service.models import Job, Schedule, TrialRow, TuningTask

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


def run_model_job(run: JobRun) -> None:
    """Tune, build and store a model job (the worker checked its attempts); ends in a finished status unless the lease is lost."""
    from compiler.arrays import random_inputs
    from compiler.target import resolve_target, target_key
    from compiler.workloads.model import (
        build_checked,
        build_model,
        compare_outputs,
        reference_outputs,
        run_model,
        time_model,
        tolerance,
        write_model_artifact,
    )
    from compiler.workloads.model.importer import graph_blocks, lower_graph, translate_model
    from compiler.workloads.model.tasks import conversions
    from compiler.workloads.pt2 import load_exported_program, static_shapes
    from service.worker import LeaseLost
    from tuner import LocalMeasurer, Task, Trial, apply_config, build_pipeline, tune
    from tuner.graph_layout import tunable
    from tuner.tune import remeasure_best, remeasure_count
    from tuner.scheduler import GradientScheduler, RoundResult, estimated_latency, round_size

    with session_scope(run.url) as s:
        job = Job.find_or_raise_by_id(s, run.job_id)
        spec, budget = dict(job.spec), job.budget

    target = resolve_target(spec["target"])
    settings = run.settings
    # the stored upload is loaded by the same checking loader as the API's sandbox (it evaluates nothing
    # from the file; a file stored before it existed is checked now); jobs submitted before graph-level
    # layouts have no "layout": their tasks were made without one
    ep = load_exported_program(Path(spec["model_file"]), max_bytes=settings.max_upload_bytes,
                               max_unpacked_bytes=settings.max_unpacked_bytes, max_ratio=settings.max_zip_ratio)
    ep = static_shapes(ep, spec.get("input_shapes"), max_tensor_elements=settings.max_tensor_elements)
    layout, fusion = spec.get("layout", "none"), spec.get("fusion", "none")
    graph = translate_model(ep, spec.get("input_shapes"), max_tensor_elements=settings.max_tensor_elements)
    tkey = target_key(spec["target"])
    seed = int(spec.get("seed", 0))
    pipeline = build_pipeline(spec)
    measurer = LocalMeasurer(timeout_s=run.settings.measure_timeout, pipeline=pipeline)
    search_report: dict[str, Any] | None = spec.get("layout_search")
    try:
        if layout == "search" and "blocks" not in spec:  # ALT's joint stage (a resumed job has its blocks)
            model, search_report = _search_layouts(run, graph, target, measurer, budget, seed, fusion)
            if run.stop_reason == "lease":
                raise LeaseLost()
            spec["blocks"], spec["layout_search"] = model.blocks, search_report
            with session_scope(run.url) as s:
                s.execute(update(Job).where(Job.id == run.job_id).values(spec=dict(spec)))
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
            with session_scope(run.url) as s:
                s.execute(update(Job).where(Job.id == run.job_id).values(best_latency_ms=estimate))

    def tune_round(i: int, n: int, start_from: list[dict] = ()) -> RoundResult:
        result = tune(tasks[i], len(prior[i]) + n, seed=seed, prior=prior[i], start_from=start_from,
                      on_trial=lambda trial: run.record_trial(rows[i], trial), should_stop=run.should_stop,
                      measurer=measurer, replay=False)
        prior[i] += result.trials
        best[i], untuned[i] = result.best, result.baseline_ms
        if result.baseline_ms is not None:
            with session_scope(run.url) as s:
                s.execute(update(TuningTask).where(TuningTask.id == rows[i]).values(baseline_ms=result.baseline_ms))
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
        if run.stop_reason != "lease":
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
    if run.stop_reason == "lease":
        raise LeaseLost()

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

    # the whole-model check: the artifact against the exported program's own output; a schedule whose model
    # does not match is removed (its task back to the default schedule) and the rest built again
    inputs = random_inputs([(tuple(x.shape), x.dtype) for x in model.inputs], seed)
    expected = reference_outputs(ep, inputs)
    checked = build_checked(model, target, schedules, inputs, expected, pipeline=pipeline)
    names = {t.workload_key: t.name for t in model.tasks}
    report: dict[str, Any] = {
        "import_notes": list(model.notes),
        "check": {
            "passed": checked.built is not None,
            "inputs": f"random, seed {seed}",
            "reference": "torch: the exported program (ep.module())",
            "builds": checked.builds,
            "mismatches": checked.mismatches,
            "removed_schedules": [{"task": names[k], "workload_key": k} for k in checked.removed],
        },
        "schedules": {"tuned": len(schedules), "kept": len(checked.schedules),
                      "default_schedule_faster": [{"task": names[k], "workload_key": k} for k in beaten]},
        "conversions": conversions(model.mod),
    }
    if search_report is not None:
        report["layout_search"] = search_report
    if checked.built is None:
        _save_report(run, spec, report)
        run.finish("failed", error=f"not served: {checked.error}")
        return
    built, applied = checked.built, dict(checked.schedules)
    latency = time_model(built, inputs, target)
    untuned_built = checked.untuned if checked.untuned is not None else (
        built if not applied else build_model(model, target, pipeline=pipeline))
    untuned_latency = latency if untuned_built is built else time_model(untuned_built, inputs, target)
    report["served"] = "tuned" if applied else "untuned (no tuned schedule kept)"
    if untuned_built is not built and untuned_latency < latency:
        # each schedule beat its default on its own, but the model is slower with them: timed again (the
        # machine may be noisy), and if it still is, the untuned build (checked like the other) is served
        latency, untuned_latency = time_model(built, inputs, target), time_model(untuned_built, inputs, target)
        if untuned_latency < latency and (checked.untuned is not None or compare_outputs(
                run_model(untuned_built, inputs, target), expected, **tolerance(model)) is None):
            built, latency, applied = untuned_built, untuned_latency, {}
            report["served"] = "untuned: faster end to end than with the tuned schedules"
    report["schedules"]["served"] = len(applied)
    torch_latency = _time_torch(ep, inputs)
    report["latency_ms"] = {"artifact": latency, "untuned": untuned_latency, "torch_eager": torch_latency}

    task_facts = []
    for t in model.tasks:
        i = next((k for k, p in enumerate(picked) if p.workload_key == t.workload_key), None)
        b = (best[i] or best_of(prior[i])) if i is not None else None
        task_facts.append({"name": t.name, "workload_key": t.workload_key, "weight": t.weight, "complex": t.complex,
                           "tuned": t.workload_key in applied, "latency_ms": b.latency_ms if b else None,
                           "default_ms": default_ms.get(i) if i is not None else None,
                           "untuned_ms": untuned[i] if i is not None else None,
                           "removed_by_check": t.workload_key in checked.removed})
    run.settings.resolved_artifact_dir.mkdir(parents=True, exist_ok=True)
    run.store_artifact(write_model_artifact(run.settings.resolved_artifact_dir / f"job-{run.job_id}.tar.gz", model,
                                            built, target, latency_ms=latency, tasks=task_facts, spec=spec,
                                            report=report))
    for i, task in enumerate(tasks):
        b = best[i] or best_of(prior[i])
        if b is not None and task.workload_key not in checked.removed:
            # kept even when the default schedule wins: the task need not be searched again; never one the
            # whole-model check removed
            run.store_schedule(task.workload_key, tkey, b.config, b.latency_ms)
    with session_scope(run.url) as s:
        for i, row_id in enumerate(rows):
            s.execute(update(TuningTask).where(TuningTask.id == row_id).values(budget=len(prior[i])))
        s.execute(update(Job).where(Job.id == run.job_id).values(best_latency_ms=latency,
                                                                 baseline_ms=untuned_latency))
    _save_report(run, spec, report)
    if run.stop_reason == "cancel":
        run.finish("cancelled")
    else:
        run.finish("succeeded")


def _measure_default(measurer: Any, task: Any) -> float | None:
    """Median latency of the task's default schedule, None when it could not be measured."""
    from tuner.graph_layout import default_schedule_latency

    latencies, error = default_schedule_latency(measurer, task)
    if latencies is None:
        log.warning("task %s: its default schedule failed: %s", task.name, error)
        return None
    return sorted(latencies)[len(latencies) // 2]


def _time_torch(ep: Any, inputs: list) -> float | None:
    from compiler.workloads.model import time_torch

    try:
        return time_torch(ep.module(), inputs)
    except Exception:  # noqa: BLE001 - the reference ran once already; a timing failure is not the job's
        log.exception("timing torch failed")
        return None


def _save_report(run: JobRun, spec: dict, report: dict) -> None:
    """The job's report (the whole-model check, latencies), as `spec["report"]`: `JobPublic` shows the spec."""
    with session_scope(run.url) as s:
        s.execute(update(Job).where(Job.id == run.job_id).values(spec={**spec, "report": report}))


def best_of(trials: list) -> Any:
    from tuner.task import best_trial

    return best_trial(trials)


