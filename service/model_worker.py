"""Running a model job (kind "model"): prepare in the sandbox, tune with `tuner.model`, build in a child, store.

`service.worker` calls `run_model_job(run)` with its `JobRun` for a job of kind "model"; the lease, heartbeat,
cancel, deadline and trial recording are the run's. The tuning itself is `tuner.model.tune_model`, the function
`bench.models` calls too: this module only feeds it what the database knows and persists what it reports.

1. Nothing of the upload runs in this process. The sandbox (`service.sandbox`, `prepare`: the confined child the
   API's upload check uses) loads the stored file (`spec["model_file"]`) with the checking loader, translates it
   to Relax, runs the exported program on the job's random inputs (the reference outputs) and times torch eager and
   torch.compile;
   it writes the translated graph, weights and outputs as files, which this process copies (regular files only)
   and reads as hostile data (`compiler.workloads.model.exchange.load_graph`: node types and operators on an
   allowlist, arrays without pickle, every tensor bounded).
2. Unless the job resumes (or `ALTUNE_ANYTIME_ARTIFACT` is off), the anytime artifact: the model from what is known before measuring (every task's
   stored, transferred or seed schedule: `tune_model` at budget 0), built, checked and timed as the final one,
   stored as the job's artifact (downloadable while it tunes) with its latency in `report["anytime"]`.
3. `tune_model` with the job's typed request (`service.requests`), its history (a resumed job's trials and
   joint-stage blocks, the schedules stored under each task's `ScheduleKey`) and hooks that write every trial
   to its task's row (rows added as the joint stage makes tasks), the joint stage's blocks to
   `jobs.layout_blocks`, the running estimate to `best_latency_ms`, and after each round the progress
   (`report["progress"]`: measurements, budget, the estimated seconds left).
4. The whole model is then built, checked against the reference outputs, timed and written as the artifact in
   a child with memory, CPU and time limits (`service.model_build`, which runs `tuner.model.serve_model`); a
   schedule whose model does not match is removed and never stored in `schedules`; when even the untuned model
   does not match, the job fails and nothing new is served.
5. The report (import notes, the joint stage, the check, removed schedules, latencies) goes to `jobs.report`
   and to the artifact's manifest.

A cancel, a lost lease or the job's deadline stops the job within seconds, mid-build included (the build's child
is killed); a cancelled job keeps its trials (and its anytime artifact) and builds nothing more. Every write goes
through the run's retry, so a database outage shorter than `db_retry_seconds` loses nothing.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sqlalchemy import update

from compiler.workloads.model import ModelTask
from compiler.workloads.model.exchange import load_graph
from compiler.workloads.pt2 import ModelError
from service import sandbox
from service.db import session_scope
from service.job_run import JobRun, LeaseLost, measurer_for, trials_of
from service.knowledge import load_knowledge, save_knowledge, scope_of
from service.model_build import GRAPH_FILES, build_in_child, copy_regular
from service.models import Job, Schedule, TuningTask
from service.requests import model_tune_request, schedule_key
from service.rounds import JobRounds, cancel_rounds
from service.settings import Settings
from tuner import Trial
from tuner import transfer
from tuner.model import ModelHistory, ModelTuneHooks, ModelTuneResult, StartSchedule, tune_model
from tuner.request import ModelTuneRequest
from tuner.transfer import StoredSchedule

log = logging.getLogger("altune.worker")


class JobHooks(ModelTuneHooks):
    """`tune_model`'s hooks for a job: every trial on its task's row, the blocks and estimate on the job."""

    def __init__(self, run: JobRun, rows: dict[str, int], report: dict | None = None, budget: int = 0,
                 done: int = 0, build_s: float | None = None) -> None:
        self.run, self.rows = run, rows
        self.report = dict(report or {})  # the job's report while it tunes: torch's latencies, the joint stage, ...
        self.budget, self.done, self.build_s = budget, done, build_s
        self.start, self.measured = time.monotonic(), 0

    def should_stop(self) -> bool:
        return self.run.should_stop()

    def task_row(self, name: str, workload_key: str, weight: int) -> int:
        """The id of the task's row, added on its first trial or round (a task of a layout the joint stage
        tried, a task of the model)."""
        if workload_key not in self.rows:
            def add(s: Any) -> None:
                row = TuningTask(job_id=self.run.job_id, index=len(self.rows), name=name[:128],
                                 workload_key=workload_key, weight=weight, budget=0)
                s.add(row)
                s.flush()
                self.rows[workload_key] = row.id

            self.run.write("task", add)
        return self.rows[workload_key]

    def on_trial(self, task: ModelTask, trial: Trial) -> None:
        """A trial of the joint stage (the rounds' trials are written by the workers running them)."""
        self.run.record_trial(self.task_row(task.name, task.workload_key, task.weight), trial)
        self.measured += 1

    def on_layouts(self, blocks: dict[str, list[int]], report: dict) -> None:
        self.report["layout_search"] = report
        self.run.write("layout search", lambda s: s.execute(update(Job).where(Job.id == self.run.job_id).values(
            layout_blocks=blocks, report=dict(self.report))))

    def on_round(self, task: ModelTask, result: Any) -> None:
        self.measured += result.spent
        if result.baseline_ms is not None and task.workload_key in self.rows:
            row_id = self.rows[task.workload_key]
            self.run.write("baseline", lambda s: s.execute(
                update(TuningTask).where(TuningTask.id == row_id).values(baseline_ms=result.baseline_ms)))
        self._progress()
        if self.run.stop_reason == "lease":
            raise LeaseLost()

    def _progress(self) -> None:
        """The job's progress in its report: measurements so far and the estimated seconds left (the budget left at
        this job's rate so far, plus the final build as long as the anytime build took)."""
        done = self.done + self.measured
        rate = (time.monotonic() - self.start) / self.measured if self.measured else None
        eta = None
        if rate is not None:
            eta = round(max(0, self.budget - done) * rate + (self.build_s or 0.0), 1)
        self.report["progress"] = {"measurements": done, "budget": self.budget, "eta_s": eta}
        _save_report(self.run, dict(self.report))

    def on_estimate(self, latency_ms: float) -> None:
        self.run.write("estimate", lambda s: s.execute(
            update(Job).where(Job.id == self.run.job_id).values(best_latency_ms=latency_ms)))


def prepare_model(settings: Settings, spec: dict, work: Path, *,
                  should_stop: Callable[[], str | None] | None = None) -> tuple[Any, list, dict[str, float | None]]:
    """Everything torch does with the job's upload, in the sandbox (`prepare`): its translated graph and the
    reference outputs, written into `work` and read back as checked data; torch's latencies as
    `{"eager": ms, "compile": ms}` (torch.compile's only with `settings.time_torch_compile`; either None when it
    was not timed: why is logged).

    Raises:
        ModelError: the sandbox refused the file, or it ran past a limit (named); the translation is not data.
        sandbox.Stopped: `should_stop` gave a reason.
    """
    request = {
        "input_shapes": spec.get("input_shapes"), "seed": int(spec.get("seed", 0)),
        "max_tensor_elements": settings.max_tensor_elements, "max_bytes": settings.max_upload_bytes,
        "max_unpacked_bytes": settings.max_unpacked_bytes, "max_ratio": settings.max_zip_ratio,
        "time_torch_compile": settings.time_torch_compile,
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
    result = result if isinstance(result, dict) else {}  # the child's answer: data, checked as such
    torch_ms = {name: ms if isinstance(ms := result.get(key), float) and ms > 0 else None
                for name, key in (("eager", "torch_ms"), ("compile", "torch_compile_ms"))}
    if settings.time_torch_compile and torch_ms["compile"] is None:
        log.warning("torch.compile not timed: %s", str(result.get("torch_compile_note"))[:400])
    return graph, expected, torch_ms


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
    cancel_rounds(run.url, run.job_id)  # a worker before this one left them: it resumes from their trials
    with session_scope(run.url) as s:
        job = Job.find_or_raise_by_id(s, run.job_id)
        spec, blocks, report = dict(job.spec), job.layout_blocks, job.report or {}
        request = model_tune_request(spec, job.budget, run.settings)
        rows = {r.workload_key: r.id for r in TuningTask.where_job(s, run.job_id)}
        trials = {key: trials_of(s, row_id) for key, row_id in rows.items()}
    # nothing of the upload runs here: torch loads, translates and runs it in the sandbox, and what comes back is
    # data, checked as such (`compiler.workloads.model.exchange`)
    graph, _expected, torch_ms = prepare_model(run.settings, spec, work, should_stop=run.stop_check)
    # torch's latencies on the job's page while it tunes (the final report has them in `latency_ms`)
    report = {**report, "torch_ms": torch_ms}
    _save_report(run, report)
    history = ModelHistory(blocks=blocks, layout_search=report.get("layout_search"), trials=trials,
                           known=lambda key: _known(run, key, request),
                           similar=lambda signature: _similar(run, signature, request))
    measurer = measurer_for(run.settings, request)
    dest = run.settings.resolved_artifact_dir / f"job-{run.job_id}.tar.gz"
    anytime = dest.with_name(f"job-{run.job_id}.anytime.tar.gz")  # served until `dest` replaces it
    build_s = None
    knowledge = load_knowledge(run.url, scope_of(request)) if run.settings.learn else None
    if knowledge is not None:  # what the job started from, on its page
        report = {**report, "knowledge": {
            "cost_model_rows": knowledge.cost_model.rows if knowledge.cost_model else None,
            "policies": len(knowledge.policies)}}
    try:
        if run.settings.anytime_artifact and request.budget > 0 and not any(trials.values()):
            report, build_s = _anytime_artifact(run, graph, request, history, measurer, work, spec, torch_ms,
                                                report, anytime)
        hooks = JobHooks(run, rows, report, request.budget, sum(len(v) for v in trials.values()), build_s)
        # the tasks' rounds go to every worker on the database, this one included (`service.rounds`)
        rounds = JobRounds(run.worker, run.job_id, request, lambda r: hooks.task_row(r.task.name, r.task.workload_key,
                                                                                     r.weight),
                           measurer=measurer, knowledge=knowledge, should_stop=run.should_stop,
                           make_measurer=lambda req: measurer_for(run.settings, req))
        try:
            tuned = tune_model(graph, request, measurer=measurer, history=history, hooks=hooks, knowledge=knowledge,
                               rounds=rounds)
        finally:
            rounds.close()
    finally:
        measurer.close()
    if knowledge is not None and run.stop_reason != "lease":  # a cancelled job's measurements are as real
        report = {**report, "knowledge": {**report["knowledge"],
                                          "kept": save_knowledge(run.url, scope_of(request), knowledge, run.job_id)}}
    if tuned.stopped or run.stop_reason is not None:  # a cancel keeps the measured trials; nothing more is built
        _stopped(run, run.stop_reason or "cancel")
        return

    # the whole-model build, check and timing run in a child with memory and time limits (`service.model_build`):
    # the check against the reference outputs the sandbox computed, the artifact written by our build alone
    served = build_in_child(run.settings, work, tuned, dest, spec=spec, torch_ms=torch_ms, should_stop=run.stop_check)
    final = {**served["report"], **{k: report[k] for k in ("anytime", "knowledge") if k in report}}
    if served["error"] is not None:  # the anytime artifact, if there is one, stays the job's
        _save_report(run, final)
        run.finish("failed", error=served["error"])
        return
    run.store_artifact(dest)
    anytime.unlink(missing_ok=True)
    _store_schedules(run, tuned, request, set(served["removed"]))

    def finish_rows(s: Any) -> None:
        for o in tuned.outcomes:
            row_id = rows.get(o.task.workload_key)
            if row_id is not None:
                s.execute(update(TuningTask).where(TuningTask.id == row_id).values(budget=len(o.trials)))
        s.execute(update(Job).where(Job.id == run.job_id).values(best_latency_ms=served["latency_ms"],
                                                                 baseline_ms=served["untuned_ms"]))

    run.write("results", finish_rows)
    _save_report(run, final)
    run.finish("succeeded")


def _anytime_artifact(run: JobRun, graph: Any, request: ModelTuneRequest, history: ModelHistory, measurer: Any,
                      work: Path, spec: dict, torch_ms: dict, report: dict, dest: Path) -> tuple[dict, float | None]:
    """The artifact a user can download while the job tunes: the model from what is known before measuring (each
    task's stored, transferred or seed schedule; `tune_model` at budget 0), built, checked and timed as the final
    one is (`build_in_child`), stored as the job's artifact until the final one replaces it. Returns the report
    with `anytime` (its latency, how it was served) and the build's seconds (the ETA's estimate of the final
    build); a build that fails or does not match leaves the job tuning without one."""
    start = time.monotonic()
    # budget 0 and no history of trials: nothing is measured
    known = tune_model(graph, replace(request, budget=0), measurer=measurer, history=history)
    try:
        served = build_in_child(run.settings, work, known, dest, spec=spec, torch_ms=torch_ms,
                                should_stop=run.stop_check)
    except ModelError as e:  # the final build may still succeed: the job goes on
        log.warning("job %s: the anytime build failed: %s", run.job_id, e)
        return {**report, "anytime": {"error": f"{e.field}: {e.message}"}}, None
    build_s = time.monotonic() - start
    if served["error"] is not None:
        return {**report, "anytime": {"error": served["error"]}}, build_s
    run.store_artifact(dest)
    anytime = {"latency_ms": served["latency_ms"], "untuned_ms": served["untuned_ms"], "measurements": 0,
               "served": served["report"].get("served"), "sources": served["report"]["schedules"].get("sources"),
               "build_s": round(build_s, 1)}
    report = {**report, "anytime": anytime}
    _save_report(run, report)
    return report, build_s


def _known(run: JobRun, workload_key: str, request: ModelTuneRequest) -> StartSchedule | None:
    """The schedule stored for the task under its `ScheduleKey`, None when there is none."""
    with session_scope(run.url) as s:
        schedule = Schedule.find_by_key(s, schedule_key(workload_key, request))
        if schedule is None:
            return None
        return StartSchedule(dict(schedule.config), "stored", latency_ms=schedule.latency_ms,
                             default_ms=schedule.default_ms)


def _similar(run: JobRun, signature: str, request: ModelTuneRequest) -> list[StoredSchedule]:
    """The schedules stored for workloads of the task's form (`tuner.transfer` signature) on this target, device,
    pipeline and space version."""
    with session_scope(run.url) as s:
        rows = Schedule.of_signature(s, schedule_key("", request), signature)
        return [StoredSchedule(r.workload_key, tuple(r.extents), dict(r.config), r.latency_ms)
                for r in rows if r.extents]


def _store_schedules(run: JobRun, tuned: ModelTuneResult, request: ModelTuneRequest, removed: set[str]) -> None:
    """Every measured task's pick, kept even when the default schedule wins (the task need not be searched again:
    a later job serves the default schedule then, as `default_ms` says), with its transfer signature and extents;
    never one the whole-model check removed. A schedule served unmeasured (a seed, a transferred one) is not
    stored: nothing measured it here."""
    for o in tuned.outcomes:
        pick = o.pick
        if pick is None or o.task.workload_key in removed:
            continue
        key = transfer.signature(o.task)
        run.store_schedule(schedule_key(o.task.workload_key, request), pick.config, pick.latency_ms,
                           default_ms=o.default_ms, signature=key.signature if key else None,
                           extents=list(key.extents) if key else None)


def _save_report(run: JobRun, report: dict) -> None:
    run.write("report", lambda s: s.execute(update(Job).where(Job.id == run.job_id).values(report=report)))
