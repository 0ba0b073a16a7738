"""Running an operator job (kind "operator"): one catalog operator tuned by ALT's search, its artifact and schedule.

`service.worker` calls `run_operator_job(run)` with its `JobRun`; the lease, heartbeat, cancel, deadline and
trial recording are the run's. A resumed job continues from its stored trials; a schedule stored for the same
key (`ScheduleKey`: workload, target, device, pipeline, space version) is measured first.
"""

from __future__ import annotations

from sqlalchemy import update

from compiler.build import write_artifact
from service.db import session_scope
from service.job_run import JobRun, LeaseLost, measurer_for, trials_of
from service.knowledge import load_knowledge, save_knowledge, scope_of
from service.models import Job, Schedule, ScheduleKey, TuningTask
from service.requests import schedule_key, tune_request
from tuner import Trial, apply_config, layout_of_config
from tuner.operator import task_from_request, tune_operator


def run_operator_job(run: JobRun) -> None:
    """Tune, build and store an operator job; ends in a finished status unless the lease is lost."""
    with session_scope(run.url) as s:
        job = Job.find_or_raise_by_id(s, run.job_id)
        request = tune_request(job.spec, job.budget)
    task = task_from_request(request, max_tensor_elements=run.settings.max_tensor_elements)
    workload, target = task.workload, task.target
    key = schedule_key(workload.key, request)
    task_id, prior, start_from = _prepare(run, key, request.budget)

    knowledge = load_knowledge(run.url, scope_of(request)) if run.settings.learn else None
    measurer = measurer_for(run.settings, request)
    try:
        result = tune_operator(task, request, measurer=measurer, prior=prior, start_from=start_from,
                               on_trial=lambda trial: run.record_trial(task_id, trial), should_stop=run.should_stop,
                               knowledge=knowledge)
    finally:
        measurer.close()
    if run.stop_reason == "lease":
        raise LeaseLost()
    if knowledge is not None:  # a cancelled or timed-out job's measurements are as real
        save_knowledge(run.url, scope_of(request), knowledge, run.job_id)
    if run.stop_reason == "deadline":
        run.finish("failed", error=run.deadline_error())
        return

    # the job's best is what the artifact runs at: the re-measured pick (the search's best without one)
    best, best_ms = result.final, result.final_ms
    task_values: dict = {"baseline_ms": result.baseline_ms}
    job_values = dict(task_values)
    if best is not None:
        task_values.update(best_latency_ms=best_ms, best_config=best.config)
        job_values["best_latency_ms"] = best_ms
    run.write("results", lambda s: (
        s.execute(update(TuningTask).where(TuningTask.id == task_id).values(**task_values)),
        s.execute(update(Job).where(Job.id == run.job_id).values(**job_values))))

    if best is not None:
        dest_dir = run.settings.resolved_artifact_dir
        dest_dir.mkdir(parents=True, exist_ok=True)
        with session_scope(run.url) as s:
            spec = dict(Job.find_or_raise_by_id(s, run.job_id).spec)
        run.store_artifact(write_artifact(dest_dir / f"job-{run.job_id}.tar.gz", workload,
                                          apply_config(task, best.config), target, best_ms, spec,
                                          layout_of_config(task, best.config), request.pipeline))
        run.store_schedule(key, best.config, best_ms)
    if run.stop_reason == "cancel":
        run.finish("cancelled")
    elif best is None:
        run.finish("failed", error="no candidate built and ran correctly; see the trials' errors")
    else:
        run.finish("succeeded")


def _prepare(run: JobRun, key: ScheduleKey, budget: int) -> tuple[int, list[Trial], list[dict]]:
    """Create the job's task on first run; load its trials (resume) and the known best schedule."""
    with session_scope(run.url) as s:
        tasks = TuningTask.where_job(s, run.job_id)
        if tasks:
            task = tasks[0]
        else:
            task = TuningTask(job_id=run.job_id, index=0, name=key.workload_key.split("[")[0],
                              workload_key=key.workload_key, weight=1, budget=budget)
            s.add(task)
            s.flush()
        prior = trials_of(s, task.id)
        known = Schedule.find_by_key(s, key)
        tried = [t.config for t in prior]
        start_from = [known.config] if known is not None and known.config not in tried else []
        return task.id, prior, start_from
