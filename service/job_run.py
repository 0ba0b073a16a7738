"""One claimed job while a worker runs it (`JobRun`): its lease's heartbeat, why it must stop, and every write a
job runner makes, each retried through a database outage and made only while this worker owns the job.

The runners (`service.operator_job`, `service.model_worker`) take a `JobRun`; `service.worker` claims jobs and
makes one per job. A job's spec is read once, into a typed request (`service.requests`).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sqlalchemy import case, or_, select, text, update

from service.db import session_scope, utcnow
from service.models import Artifact, Job, Schedule, ScheduleKey, TrialRow, TuningTask
from service.settings import Settings
from tuner import Measurer, Trial, make_measurer
from tuner.request import ModelTuneRequest, TuneRequest

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


class Lease(Protocol):
    """What a `JobRun` needs of its worker (`service.worker.Worker`)."""

    settings: Settings
    url: str
    worker_id: str

    def renew(self, job_id: int) -> bool: ...

    def retry_db(self, what: str, write: Callable[[], T]) -> T: ...


class JobRun:
    """One job while a worker runs it: the heartbeat and the stop reason, and what a job runner writes
    (`record_trial`, `store_schedule`, `store_artifact`, `finish`), only while this worker owns the job.

    `Worker.run_job` makes one per claimed job and hands it to `service.operator_job.run_operator_job` or
    `service.model_worker.run_model_job`.
    """

    def __init__(self, worker: Lease, job_id: int) -> None:
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
                    best_latency_ms=min_sql(Job.best_latency_ms, latency),
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
                values["best_latency_ms"] = min_sql(TuningTask.best_latency_ms, latency)
            s.execute(update(TuningTask).where(TuningTask.id == task_id).values(**values))
            if latency is not None:
                task = s.get(TuningTask, task_id)
                if task.best_latency_ms is None or latency <= task.best_latency_ms:
                    task.best_config = trial.config

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

    def store_schedule(self, key: ScheduleKey, config: dict, latency_ms: float, **facts: Any) -> None:
        """Keep the configuration if it beats the best known one under `key` (atomically); `facts`: the default
        schedule's latency and the transfer signature and extents (`Schedule.upsert_if_faster`)."""
        def write() -> None:
            with session_scope(self.url) as s:
                Schedule.upsert_if_faster(s, key, config, latency_ms, self.job_id, **facts)

        self.worker.retry_db(f"job {self.job_id}: schedule", write)


def measurer_for(settings: Settings, request: TuneRequest | ModelTuneRequest) -> Measurer:
    """Where a job's candidates are measured (`tuner.make_measurer`): on a device leased from the RPC tracker when
    the request names a `device`, else by the worker's own measurer (`ALTUNE_MEASURER`: its own CPU, by default)."""
    if request.device is None:
        if settings.measurer == "simulated":
            return make_measurer("simulated", delay_s=settings.simulated_delay_seconds)
        return make_measurer("local", timeout_s=settings.measure_timeout, pipeline=request.pipeline)
    if settings.rpc_tracker is None:
        raise RuntimeError(f"the job is to be measured on device {request.device!r}, but this worker has no RPC "
                           "tracker: start it with ALTUNE_RPC_TRACKER=HOST:PORT")
    return make_measurer("rpc", tracker=settings.rpc_tracker, key=request.device, wait_s=settings.rpc_wait_seconds,
                         timeout_s=settings.measure_timeout, pipeline=request.pipeline)


def min_sql(column, value: float | None):
    """SQL for min(column, value) that treats NULL as +infinity on every backend."""
    if value is None:
        return column
    return case((or_(column.is_(None), column > value), value), else_=column)


def trials_of(session: Any, task_id: int) -> list[Trial]:
    """A task's trials as the tuner's `Trial`s, in index order (a resumed search's prior)."""
    return [Trial(index=r.index, config=r.config, latencies_ms=r.latencies_ms, error=r.error, predicted=r.predicted,
                  stage=r.stage, extra=r.extra) for r in TrialRow.where_task(session, task_id)]
