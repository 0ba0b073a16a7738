"""The worker: claims a queued job under a lease it keeps renewing, tunes it, stores every trial at once; with no
job to claim, it runs a round of another worker's model job (`service.rounds`).

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

import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from sqlalchemy import and_, case, delete, func, or_, select, update
from sqlalchemy.orm import aliased

from service.db import StorageError, session_scope
from service.job_run import JobRun, LeaseLost, db_now, measurer_for
from service.model_worker import run_model_job
from service.models import Job, Token, WorkerRow
from service.operator_job import run_operator_job
from service.rounds import claim_round, execute_round, release_rounds
from service.settings import Settings

log = logging.getLogger("altune.worker")
T = TypeVar("T")


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

    def _present(self) -> None:
        """Renew this worker's row in `workers` every third of a lease until `stop()` (a job's scheduler counts the
        live workers: `service.rounds`); the row goes with the worker."""
        while True:
            try:
                with session_scope(self.url) as s:
                    WorkerRow.seen(s, self.worker_id, db_now(s))
            except Exception as e:  # the database is away: the loop waits for it; the row is renewed after
                log.debug("worker %s: presence not renewed: %s", self.worker_id, e)
            if self._stop.wait(max(self.settings.lease_seconds / 3, 0.2)):
                break
        try:
            with session_scope(self.url) as s:
                s.execute(delete(WorkerRow).where(WorkerRow.id == self.worker_id))
        except Exception:  # noqa: BLE001 - its seen_at runs out by itself
            pass

    def run_forever(self) -> None:
        """Claim and run jobs until `stop()`; a database that does not answer is waited for, never fatal."""
        log.info("worker %s polling %s", self.worker_id, self.url)
        presence = threading.Thread(target=self._present, name="presence", daemon=True)
        presence.start()
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
            if job_id is None and self.run_round_once() is None:
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
            release_rounds(self.url, self.worker_id)
        except Exception:  # shutting down: the lease runs out by itself if the database is not there
            log.exception("worker %s: could not release its job", self.worker_id)

    def run_once(self) -> int | None:
        """Claim one job and run it to the end; return its id, or None when the queue is empty."""
        job_id = self.claim()
        if job_id is not None:
            self.run_job(job_id)
        return job_id

    def run_round_once(self) -> int | None:
        """Claim one round of another worker's model job and run it (`service.rounds`); its id, or None when no
        round waits."""
        round_id = claim_round(self)
        if round_id is not None:
            execute_round(self, round_id, make_measurer=lambda request: measurer_for(self.settings, request))
        return round_id

    def stop(self) -> None:
        self._stop.set()

    # -- one job -----------------------------------------------------------------------------------------

    def run_job(self, job_id: int) -> None:
        """Tune a claimed job; every outcome ends in a finished status unless the lease was lost."""
        run = JobRun(self, job_id)
        run.heartbeat.start()
        try:
            with session_scope(self.url) as s:
                job = Job.find_or_raise_by_id(s, job_id)
                kind, attempts = job.kind, job.attempts
            if attempts > self.settings.max_attempts:
                run.finish("failed", error=f"abandoned by a worker {attempts - 1} times; giving up")
            else:
                RUNNERS[kind](run)
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


# how each kind of job runs: one function of a `JobRun`
RUNNERS: dict[str, Callable[[JobRun], None]] = {"operator": run_operator_job, "model": run_model_job}
