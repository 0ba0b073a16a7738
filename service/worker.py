"""The worker: claims a queued job under a lease it keeps renewing, tunes it, stores every trial at once.

A job is claimable when it is queued, or running with an expired lease (its
worker died): the new owner resumes from the trials already in the database.
Claiming is one conditional UPDATE after a `SELECT ... FOR UPDATE SKIP LOCKED`,
so several workers on PostgreSQL never take the same job, and on SQLite the
conditional UPDATE alone decides.

The database may go away for a while (a PostgreSQL restart, a failover, an SQLite file locked by someone's
exclusive transaction): the worker then retries each write for up to `db_retry_seconds` (a trial waits in
memory, the search waits for it), keeps polling when idle, and never exits for it. An outage longer than that
leaves the job to its lease: the next claim resumes it from its committed trials.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import and_, case, func, or_, select, text, update
from sqlalchemy.orm import aliased

from service.db import StorageError, session_scope, utcnow
from service.models import Artifact, Job, Schedule, Token, TrialRow, TuningTask
from service.settings import Settings

if TYPE_CHECKING:
    from tuner import Trial

log = logging.getLogger("altune.worker")
T = TypeVar("T")


class LeaseLost(RuntimeError):
    """Another worker owns the job now; stop without touching it."""


def db_now(session: Any) -> datetime:
    """The database's clock, as naive UTC (what every DateTime column stores): leases and deadlines are compared
    on it, so workers whose clocks disagree still agree on whose lease has run out. SQLite is embedded: its clock
    is this machine's."""
    if session.get_bind().dialect.name == "postgresql":
        return session.scalar(text("SELECT (now() AT TIME ZONE 'UTC')::timestamp"))
    return utcnow()


def _claimable(now):
    return or_(Job.status == "queued", and_(Job.status == "running", Job.lease_expires_at < now))


def _owner_may_start(now, default_running: int):
    """A queued job whose owner runs fewer jobs than its `max_running` (an anonymous job always may).

    A job taken over from a dead worker counted already. Two workers claiming two jobs of one owner at the same
    moment may both pass: the limit is a scheduling rule, not a lock.
    """
    other = aliased(Job)
    running = (select(func.count()).select_from(other)
               .where(other.owner_id == Job.owner_id, other.status == "running", other.lease_expires_at >= now)
               .scalar_subquery())
    limit = (select(func.coalesce(Token.max_running, default_running)).where(Token.id == Job.owner_id)
             .scalar_subquery())
    return or_(Job.owner_id.is_(None), Job.status == "running", running < limit)


class Worker:
    """Runs jobs from the queue, one at a time."""

    def __init__(self, settings: Settings, worker_id: str | None = None) -> None:
        self.settings = settings
        self.url = settings.resolved_database_url
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._stop = threading.Event()

    # -- queue -------------------------------------------------------------------------------------------

    def claim(self) -> int | None:
        """Take the oldest claimable job; return its id, or None when there is none."""
        with session_scope(self.url) as s:
            now = db_now(s)
            job_id = s.scalar(
                select(Job.id)
                .where(_claimable(now), _owner_may_start(now, self.settings.token_max_running))
                .order_by(Job.id).limit(1).with_for_update(skip_locked=True)
            )
            if job_id is None:
                return None
            claimed = s.execute(
                update(Job)
                .where(Job.id == job_id, _claimable(now))
                .values(
                    status="running",
                    worker_id=self.worker_id,
                    lease_expires_at=now + timedelta(seconds=self.settings.lease_seconds),
                    attempts=Job.attempts + 1,
                    # the job was running under another worker whose lease expired (the /metrics takeovers)
                    takeovers=Job.takeovers + case((Job.status == "running", 1), else_=0),
                    started_at=func.coalesce(Job.started_at, now),
                )
            ).rowcount
        return job_id if claimed == 1 else None

    def renew(self, job_id: int) -> bool:
        """Extend the lease; False when this worker no longer owns the job."""
        with session_scope(self.url) as s:
            return (
                s.execute(
                    update(Job)
                    .where(Job.id == job_id, Job.worker_id == self.worker_id, Job.status == "running")
                    .values(lease_expires_at=db_now(s) + timedelta(seconds=self.settings.lease_seconds))
                ).rowcount
                == 1
            )

    def run_forever(self) -> None:
        """Claim and run jobs until `stop()`; a database that does not answer is waited for, never fatal."""
        log.info("worker %s polling %s", self.worker_id, self.url)
        down_since: float | None = None
        while not self._stop.is_set():
            try:
                job_id = self.run_once()
            except (SystemExit, KeyboardInterrupt):  # SIGTERM (cli raises SystemExit), Ctrl-C: hand the job on first
                self.release_held()
                raise
            except StorageError as e:
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning("worker %s: database unavailable, polling until it answers: %s", self.worker_id, e)
                self._stop.wait(min(self.settings.poll_seconds * 4, 2.0))
                continue
            if down_since is not None:
                log.warning("worker %s: database back after %.1f s", self.worker_id, time.monotonic() - down_since)
                down_since = None
            if job_id is None:
                self._stop.wait(self.settings.poll_seconds)

    def retry_db(self, what: str, write: Callable[[], T]) -> T:
        """`write()` (one transaction), retried while the database is unavailable, for up to `db_retry_seconds`.

        Raises:
            StorageError: the last failure, once the time is up (or at once if `stop()` was called).
        """
        deadline = time.monotonic() + self.settings.db_retry_seconds
        wait = 0.2
        while True:
            try:
                return write()
            except StorageError as e:
                if time.monotonic() + wait > deadline or self._stop.is_set():
                    raise
                log.warning("%s: database unavailable, retrying in %.1f s: %s", what, wait, e)
                time.sleep(wait)
                wait = min(wait * 2, 2.0)

    def release_held(self) -> None:
        """Give back every job this worker holds (its lease expired now), so the next worker resumes it at once.

        Called on the way out, after the job's heartbeat has stopped (a renewal can no longer undo it), and
        wherever the signal landed: inside a job, or between claiming one and starting it.
        """
        try:
            with session_scope(self.url) as s:
                s.execute(
                    update(Job)
                    .where(Job.worker_id == self.worker_id, Job.status == "running")
                    .values(lease_expires_at=db_now(s) - timedelta(seconds=1))
                )
        except Exception:  # shutting down: the lease runs out by itself if the database is not there
            log.exception("worker %s: could not release its job", self.worker_id)

    def run_once(self) -> int | None:
        """Claim one job and run it to the end; return its id, or None when the queue is empty."""
        job_id = self.claim()
        if job_id is not None:
            self.run_job(job_id)
        return job_id

    def stop(self) -> None:
        self._stop.set()

    # -- one job -----------------------------------------------------------------------------------------

    def run_job(self, job_id: int) -> None:
        """Tune a claimed job; every outcome ends in a finished status unless the lease was lost."""
        run = JobRun(self, job_id)
        run.heartbeat.start()
        try:
            run.execute()
        except LeaseLost:
            log.warning("job %s: lease lost, leaving it to its new owner", job_id)
        except StorageError:  # still down after db_retry_seconds: the job cannot be written, its lease will expire
            log.exception("job %s: database unavailable, leaving the job to its lease", job_id)
        except Exception as e:  # a failing job must never take the worker down
            log.exception("job %s failed", job_id)
            run.finish("failed", error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}")
        finally:  # the heartbeat stops before anything else: a renewal after `release_held` would undo it
            run.done.set()
            run.heartbeat.join()


class JobRun:
    """One job while a worker runs it: the heartbeat and the stop reason, and what a job runner writes
    (`record_trial`, `store_schedule`, `store_artifact`, `finish`), only while this worker owns the job.

    `run_job` makes one per claimed job; an operator job runs in `execute`, a model job in
    `service.model_worker.run_model_job(run)`.
    """

    def __init__(self, worker: Worker, job_id: int) -> None:
        self.worker = worker
        self.settings = worker.settings
        self.url = worker.url
        self.job_id = job_id
        self.done = threading.Event()
        self.stop_reason: str | None = None  # "cancel" | "lease" | "deadline"
        self.heartbeat = threading.Thread(target=self._beat, name=f"lease-{job_id}", daemon=True)

    def _beat(self) -> None:
        interval = max(self.settings.lease_seconds / 3, 0.2)
        while not self.done.wait(interval):
            try:
                if not self.worker.renew(self.job_id):
                    self.stop_reason = "lease"
                    return
                with session_scope(self.url) as s:
                    cancel, started = s.execute(select(Job.cancel_requested, Job.started_at)
                                                .where(Job.id == self.job_id)).one()
                    if cancel:
                        self.stop_reason = self.stop_reason or "cancel"
                    elif started is not None and (db_now(s) - started).total_seconds() > self.settings.job_deadline_seconds:
                        self.stop_reason = self.stop_reason or "deadline"
            except Exception:  # a database hiccup: try again at the next beat, the lease has slack
                log.exception("job %s: heartbeat failed", self.job_id)

    def should_stop(self) -> bool:
        return self.stop_reason is not None

    def stop_check(self) -> str | None:
        """Why the job must stop now ("cancel", "lease", "deadline"), or None: what a child process polls."""
        return self.stop_reason

    def deadline_error(self) -> str:
        return (f"the job ran past its deadline of {self.settings.job_deadline_seconds:g} s from its first claim "
                "(ALTUNE_JOB_DEADLINE_SECONDS) and was stopped; its measured trials are kept")

    def write(self, what: str, change: Callable[[Any], object]) -> None:
        """`change(session)` in one transaction, retried through a database outage (`Worker.retry_db`)."""

        def once() -> None:
            with session_scope(self.url) as s:
                change(s)

        self.worker.retry_db(f"job {self.job_id}: {what}", once)

    def finish(self, status: str, error: str | None = None) -> None:
        """Mark the job finished, only if this worker still owns it."""

        def write() -> None:
            with session_scope(self.url) as s:
                s.execute(
                    update(Job)
                    .where(Job.id == self.job_id, Job.worker_id == self.worker.worker_id, Job.status == "running")
                    .values(status=status, error=error, finished_at=utcnow(), lease_expires_at=None)
                )

        self.worker.retry_db(f"job {self.job_id}: finishing", write)

    def execute(self) -> None:
        from compiler.target import target_key
        from tuner import LocalMeasurer, build_pipeline, task_from_spec, tune, tune_options
        from tuner.tune import remeasure_count

        with session_scope(self.url) as s:
            job = Job.find_or_raise_by_id(s, self.job_id)
            kind, spec, budget, attempts = job.kind, dict(job.spec), job.budget, job.attempts
        if attempts > self.settings.max_attempts:
            self.finish("failed", error=f"abandoned by a worker {attempts - 1} times; giving up")
            return
        if kind == "model":
            from service.model_worker import run_model_job

            run_model_job(self)
            return

        task = task_from_spec(spec, max_tensor_elements=self.settings.max_tensor_elements)
        workload, target, tkey = task.workload, task.target, target_key(spec["target"])
        task_id, prior, start_from = self._prepare(workload.key, tkey, budget)

        measurer = measurer_for(self.settings, spec, build_pipeline(spec))
        try:
            result = tune(
                task,
                budget,
                **tune_options(spec),
                prior=prior,
                start_from=start_from,
                on_trial=lambda trial: self.record_trial(task_id, trial),
                should_stop=self.should_stop,
                measurer=measurer,
                remeasure=remeasure_count(budget),  # the best few measured again: the pick and its latency
            )
        finally:
            measurer.close()
        if self.stop_reason == "lease":
            raise LeaseLost()
        if self.stop_reason == "deadline":
            self.finish("failed", error=self.deadline_error())
            return

        # the job's best is what the artifact runs at: the re-measured pick (the search's best without one)
        best, best_ms = result.final, result.final_ms
        task_values: dict = {"baseline_ms": result.baseline_ms}
        job_values = dict(task_values)
        if best is not None:
            task_values.update(best_latency_ms=best_ms, best_config=best.config)
            job_values["best_latency_ms"] = best_ms
        with session_scope(self.url) as s:
            s.execute(update(TuningTask).where(TuningTask.id == task_id).values(**task_values))
            s.execute(update(Job).where(Job.id == self.job_id).values(**job_values))

        if best is not None:
            from tuner import apply_config, layout_of_config

            mod = apply_config(task, best.config)
            layout = layout_of_config(task, best.config)
            self._store_artifact(workload, mod, target, best_ms, spec, layout)
            self.store_schedule(workload.key, tkey, best.config, best_ms)
        if self.stop_reason == "cancel":
            self.finish("cancelled")
        elif best is None:
            self.finish("failed", error="no candidate built and ran correctly; see the trials' errors")
        else:
            self.finish("succeeded")

    def _prepare(self, workload_key: str, tkey: str, budget: int) -> tuple[int, list[Trial], list[dict]]:
        """Create the job's task on first run; load its trials (resume) and the known best schedule."""
        with session_scope(self.url) as s:
            tasks = TuningTask.where_job(s, self.job_id)
            if tasks:
                task = tasks[0]
            else:
                task = TuningTask(job_id=self.job_id, index=0, name=workload_key.split("[")[0],
                                  workload_key=workload_key, weight=1, budget=budget)
                s.add(task)
                s.flush()
            prior = TrialRow.trials_of(s, task.id)
            known = Schedule.find_by_key(s, workload_key, tkey)
            tried = [t.config for t in prior]
            start_from = [known.config] if known is not None and known.config not in tried else []
            return task.id, prior, start_from

    def record_trial(self, task_id: int, trial: Trial) -> None:
        """Write one trial the moment it is measured, with the job's and task's progress, if the lease holds."""
        if self.stop_reason == "lease":
            return
        tries = itertools.count()
        self.worker.retry_db(f"job {self.job_id}: trial {trial.index}",
                             lambda: self._write_trial(task_id, trial, retry=next(tries) > 0))

    def _write_trial(self, task_id: int, trial: Trial, retry: bool = False) -> None:
        """`record_trial`'s one transaction, written whole or not at all.

        A retry first looks for the trial: a commit whose answer was lost with the connection did happen.
        """
        latency = trial.latency_ms
        with session_scope(self.url) as s:
            if retry and s.scalar(select(TrialRow.id).where(TrialRow.task_id == task_id,
                                                            TrialRow.index == trial.index)) is not None:
                return
            owned = s.execute(
                update(Job)
                .where(Job.id == self.job_id, Job.worker_id == self.worker.worker_id, Job.status == "running")
                .values(
                    trials_done=Job.trials_done + 1,
                    errors=Job.errors + (1 if trial.error else 0),
                    best_latency_ms=_min_sql(Job.best_latency_ms, latency),
                )
            ).rowcount
            if owned != 1:
                self.stop_reason = "lease"
                return
            s.add(
                TrialRow(job_id=self.job_id, task_id=task_id, index=trial.index, config=trial.config,
                         latencies_ms=trial.latencies_ms, latency_ms=latency, error=trial.error,
                         predicted=trial.predicted, stage=trial.stage, extra=trial.extra or {})
            )
            values = {"trials_done": TuningTask.trials_done + 1}
            if latency is not None:
                values["best_latency_ms"] = _min_sql(TuningTask.best_latency_ms, latency)
            s.execute(update(TuningTask).where(TuningTask.id == task_id).values(**values))
            if latency is not None:
                task = s.get(TuningTask, task_id)
                if task.best_latency_ms is None or latency <= task.best_latency_ms:
                    task.best_config = trial.config

    def _store_artifact(self, workload, mod, target, latency_ms: float | None, spec: dict, layout=None) -> None:
        from compiler.build import write_artifact
        from tuner import build_pipeline

        dest_dir = self.settings.resolved_artifact_dir
        dest_dir.mkdir(parents=True, exist_ok=True)
        self.store_artifact(write_artifact(dest_dir / f"job-{self.job_id}.tar.gz", workload, mod, target,
                                           latency_ms, spec, layout, build_pipeline(spec)))

    def store_artifact(self, path: str | Path) -> None:
        """Record the job's artifact file (written under the artifact dir) with its size and sha256."""
        path = Path(path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()

        def write() -> None:
            with session_scope(self.url) as s:
                row = Artifact.find_by_job(s, self.job_id)
                if row is None:
                    s.add(Artifact(job_id=self.job_id, path=str(path), size=path.stat().st_size, sha256=digest))
                else:
                    row.path, row.size, row.sha256, row.created_at = str(path), path.stat().st_size, digest, utcnow()

        self.worker.retry_db(f"job {self.job_id}: artifact", write)

    def store_schedule(self, workload_key: str, tkey: str, config: dict, latency_ms: float) -> None:
        """Keep the configuration if it beats the best known one for this workload and target (atomically)."""
        def write() -> None:
            with session_scope(self.url) as s:
                Schedule.upsert_if_faster(s, workload_key, tkey, config, latency_ms, self.job_id)

        self.worker.retry_db(f"job {self.job_id}: schedule", write)


def measurer_for(settings: Settings, spec: dict, pipeline: str):
    """Where a job's candidates are measured: on a device leased from the RPC tracker when its spec names a
    `device`, else in this worker's own measuring process."""
    from tuner import make_measurer

    if spec.get("device") is None:
        return make_measurer("local", timeout_s=settings.measure_timeout, pipeline=pipeline)
    if settings.rpc_tracker is None:
        raise RuntimeError(f"the job is to be measured on device {spec['device']!r}, but this worker has no RPC "
                           "tracker: start it with ALTUNE_RPC_TRACKER=HOST:PORT")
    return make_measurer("rpc", tracker=settings.rpc_tracker, key=spec["device"], wait_s=settings.rpc_wait_seconds,
                         timeout_s=settings.measure_timeout, pipeline=pipeline)


def _min_sql(column, value: float | None):
    """SQL for min(column, value) that treats NULL as +infinity on every backend."""
    if value is None:
        return column
    from sqlalchemy import case

    return case((or_(column.is_(None), column > value), value), else_=column)
