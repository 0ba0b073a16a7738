"""A model job spread over every worker on the database: its tasks' rounds as leased rows (`task_rounds`).

The job's own worker (the one holding the job's lease) runs `tuner.model.tune_model` as always: the joint stage,
the gradient task scheduler, the final picks. Only its rounds ("measure n more candidates of this task":
`tuner.rounds.Round`) leave it, through `JobRounds`:

- `submit` writes the round as a `queued` row; the scheduler keeps as many rounds in flight as there are live
  workers (`workers`: each renews its row while it lives): one worker alone runs them one after another, each
  choice seeing every result, as `tuner.rounds.InlineRounds` does; each worker that joins adds a round in flight.
- any worker claims a round (`claim_round`: the job queue's `SKIP LOCKED` claim) when it has no job to claim,
  the job's own worker included (a thread beside its scheduler, claiming only its job's rounds). It reads the
  task's trials from the database, runs the round on its own measurer (its CPU, or the job's device leased from
  the RPC tracker) and writes the trials in batches (`RoundRun.add`: one transaction per `TRIAL_BATCH` trials,
  or per `FLUSH_SECONDS`), each write only while it holds the round's lease.
- `wait` hands the scheduler the next finished round with the task's trials read back from the database.

A worker killed mid-round loses at most its unwritten batch (under a second of measurements): its round's lease
runs out and the next claim resumes it from the trials that were written, spending what is left of its `n`. A
job's worker killed mid-job: the job's lease runs out, the next worker claims the job, cancels the rounds it
left (`cancel_rounds`; their workers' next write is refused) and resumes from the trials, as a resumed job does.
What a round measures goes into the scope's knowledge: the job worker's into its own (saved at the job's end),
another worker's appended after the round (`save_knowledge` without the refit).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update

from service.db import StorageError, session_scope, utcnow
from service.job_run import Lease, db_now, min_sql, trials_of
from service.knowledge import load_knowledge, save_knowledge, scope_of
from service.models import Job, TaskRound, TrialRow, TuningTask, WorkerRow
from service.requests import model_tune_request
from tuner import Measurer, Trial
from tuner.knowledge import Knowledge
from tuner.request import ModelTuneRequest
from tuner.rounds import Round, RoundDone, Rounds, run_round

log = logging.getLogger("altune.worker")

TRIAL_BATCH = 8  # trials written per transaction at most
FLUSH_SECONDS = 0.5  # a trial waits at most about this long for its batch
MOST_IN_FLIGHT = 64  # rounds of one job in flight at most, however many workers


def _claimable(now: Any) -> Any:
    return or_(TaskRound.status == "queued", and_(TaskRound.status == "running", TaskRound.lease_expires_at < now))


def claim_round(worker: Lease, job_id: int | None = None) -> int | None:
    """Take the oldest claimable round (of `job_id` only, when given) of a running job: its id, or None."""
    with session_scope(worker.url) as s:
        now = db_now(s)
        query = (select(TaskRound.id).join(Job, Job.id == TaskRound.job_id)
                 .where(_claimable(now), Job.status == "running", Job.cancel_requested.is_(False)))
        if job_id is not None:
            query = query.where(TaskRound.job_id == job_id)
        round_id = s.scalar(query.order_by(TaskRound.id).limit(1).with_for_update(skip_locked=True, of=TaskRound))
        if round_id is None:
            return None
        claimed = s.execute(
            update(TaskRound).where(TaskRound.id == round_id, _claimable(now))
            .values(status="running", worker_id=worker.worker_id, attempts=TaskRound.attempts + 1,
                    lease_expires_at=now + timedelta(seconds=worker.settings.lease_seconds))
        ).rowcount
    return round_id if claimed == 1 else None


def cancel_rounds(url: str, job_id: int) -> int:
    """Cancel a job's unfinished rounds (their workers' next write is refused); how many there were."""
    with session_scope(url) as s:
        return s.execute(update(TaskRound).where(TaskRound.job_id == job_id,
                                                 TaskRound.status.in_(("queued", "running")))
                         .values(status="cancelled", lease_expires_at=None, finished_at=utcnow())).rowcount


def release_rounds(url: str, worker_id: str) -> None:
    """Give back the rounds a worker holds (their lease expired now): the next claim takes them over at once."""
    with session_scope(url) as s:
        s.execute(update(TaskRound).where(TaskRound.worker_id == worker_id, TaskRound.status == "running")
                  .values(lease_expires_at=db_now(s) - timedelta(seconds=1)))


class RoundRun:
    """One claimed round while a worker runs it: its lease's heartbeat (which also notices the job's cancel or
    end), and its trials, written in batches only while the lease holds."""

    def __init__(self, worker: Lease, round_id: int, job_id: int, task_id: int) -> None:
        self.worker, self.url = worker, worker.url
        self.round_id, self.job_id, self.task_id = round_id, job_id, task_id
        self.stop_reason: str | None = None  # "lease" (the round is no longer ours) | "job" (cancelled or ended)
        self.buffer: list[Trial] = []
        self.oldest = 0.0  # when the oldest waiting trial was measured (monotonic)
        self.renewed = 0.0  # when the lease was last renewed (monotonic)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.heartbeat = threading.Thread(target=self._beat, name=f"round-{round_id}", daemon=True)

    def _beat(self) -> None:
        interval = max(self.worker.settings.lease_seconds / 3, 0.2)
        while not self.done.wait(min(interval, FLUSH_SECONDS)):
            try:
                self.flush(force=False)
                if time.monotonic() - self.renewed >= interval:
                    self._renew()
            except Exception:  # a database hiccup: try again at the next beat, the lease has slack
                log.exception("round %s: heartbeat failed", self.round_id)

    def _renew(self) -> None:
        with session_scope(self.url) as s:
            owned = s.execute(update(TaskRound).where(*self._ours()).values(
                lease_expires_at=db_now(s) + timedelta(seconds=self.worker.settings.lease_seconds))).rowcount
            if owned != 1:
                self.stop_reason = self.stop_reason or "lease"
                return
            status, cancel = s.execute(select(Job.status, Job.cancel_requested).where(Job.id == self.job_id)).one()
            if status != "running" or cancel:
                self.stop_reason = self.stop_reason or "job"
        self.renewed = time.monotonic()

    def _ours(self) -> tuple:
        return (TaskRound.id == self.round_id, TaskRound.worker_id == self.worker.worker_id,
                TaskRound.status == "running")

    def should_stop(self) -> bool:
        return self.stop_reason is not None

    def add(self, trial: Trial) -> None:
        """A measured trial: written with its batch (`TRIAL_BATCH` trials, or once the oldest waited
        `FLUSH_SECONDS`; the heartbeat writes a batch that waits longer)."""
        with self.lock:
            if not self.buffer:
                self.oldest = time.monotonic()
            self.buffer.append(trial)
        self.flush(force=False)

    def flush(self, force: bool = True) -> None:
        """Write the waiting trials in one transaction (only when due unless `force`), while the round is ours."""
        with self.lock:
            due = self.buffer and (force or len(self.buffer) >= TRIAL_BATCH
                                   or time.monotonic() - self.oldest >= FLUSH_SECONDS)
            if not due or self.stop_reason == "lease":
                return
            batch, self.buffer = self.buffer, []
            self.worker.retry_db(f"round {self.round_id}: {len(batch)} trials",
                                 lambda: self._write(batch))

    def _write(self, batch: Sequence[Trial]) -> None:
        with session_scope(self.url) as s:
            indexes = [t.index for t in batch]
            present = set(s.scalars(select(TrialRow.index).where(TrialRow.task_id == self.task_id,
                                                                 TrialRow.index.in_(indexes))))
            batch = [t for t in batch if t.index not in present]  # a retried commit whose answer was lost
            if s.execute(update(TaskRound).where(*self._ours()).values(worker_id=self.worker.worker_id)).rowcount != 1:
                self.stop_reason = "lease"
                return
            s.add_all(TrialRow(job_id=self.job_id, task_id=self.task_id, index=t.index, config=t.config,
                               latencies_ms=t.latencies_ms, latency_ms=t.latency_ms, error=t.error,
                               predicted=t.predicted, stage=t.stage, extra=t.extra or {}) for t in batch)
            correct = [t for t in batch if t.latency_ms is not None]
            best = min(correct, key=lambda t: t.latency_ms) if correct else None
            job = {"trials_done": Job.trials_done + len(batch), "errors": Job.errors + sum(1 for t in batch if t.error)}
            task: dict[str, Any] = {"trials_done": TuningTask.trials_done + len(batch)}
            if best is not None:
                job["best_latency_ms"] = min_sql(Job.best_latency_ms, best.latency_ms)
            s.execute(update(Job).where(Job.id == self.job_id).values(**job))
            row = s.get(TuningTask, self.task_id)
            if best is not None and (row.best_latency_ms is None or best.latency_ms <= row.best_latency_ms):
                task.update(best_latency_ms=best.latency_ms, best_config=best.config)
            s.execute(update(TuningTask).where(TuningTask.id == self.task_id).values(**task))

    def finish(self, result: dict[str, Any]) -> bool:
        """Write what is left and mark the round done with `result`; False when it is no longer ours."""
        self.flush()
        if self.stop_reason == "lease":
            return False

        def write() -> int:
            with session_scope(self.url) as s:
                return s.execute(update(TaskRound).where(*self._ours()).values(
                    status="done", result=result, lease_expires_at=None, finished_at=utcnow())).rowcount

        return self.worker.retry_db(f"round {self.round_id}: done", write) == 1


def execute_round(worker: Lease, round_id: int, *, measurer: Measurer | None = None,
                  knowledge: Knowledge | None = None, make_measurer: Callable[[ModelTuneRequest], Measurer]) -> None:
    """Run a claimed round to its end: its task's trials so far from the database, the rest of its measurements on
    `measurer` (else one `make_measurer` makes for the job's request, closed after), its trials and its result
    written under its lease. `knowledge`: the job worker's own (recorded into); else the scope's is loaded and
    what the round measured appended (no refit: the job's worker refits at the job's end)."""
    with session_scope(worker.url) as s:
        row = s.get(TaskRound, round_id)
        job = s.get(Job, row.job_id)
        payload, job_id, task_id, attempts = dict(row.payload), row.job_id, row.task_id, row.attempts
        request = model_tune_request(job.spec, job.budget, worker.settings)
        prior = trials_of(s, task_id)
    run = RoundRun(worker, round_id, job_id, task_id)
    if attempts > worker.settings.max_attempts:
        run.finish({"error": f"abandoned by a worker {attempts - 1} times; giving up on the task"})
        return
    rnd = Round.from_json(payload)
    own_knowledge = knowledge is None and worker.settings.learn
    if own_knowledge:
        knowledge = load_knowledge(worker.url, scope_of(request))
    own_measurer = measurer is None
    run.heartbeat.start()
    try:
        measurer = make_measurer(request) if measurer is None else measurer
        try:
            result = run_round(rnd, prior, measurer, knowledge=knowledge, on_trial=run.add,
                               should_stop=run.should_stop)
            outcome: dict[str, Any] = {"baseline_ms": result.baseline_ms}
        except StorageError:
            raise
        except Exception as e:  # the task's search failed: the job gives it no more rounds
            if run.should_stop():
                raise
            log.exception("round %s (task %s): its search failed", round_id, rnd.task.name)
            outcome = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        finally:
            if own_measurer:
                measurer.close()
        if not run.should_stop():
            run.finish(outcome)
        else:
            run.flush()
    finally:
        run.done.set()
        run.heartbeat.join()
    if own_knowledge and knowledge is not None and knowledge.samples and run.stop_reason != "lease":
        save_knowledge(worker.url, scope_of(request), knowledge, job_id, refit_model=False)


class JobRounds(Rounds):
    """The job worker's side (`tuner.rounds.Rounds`): rounds written as rows for any worker, this one included
    (a thread claiming the job's rounds), and read back as they finish."""

    def __init__(self, worker: Lease, job_id: int, request: ModelTuneRequest, task_row: Callable[[Round], int], *,
                 measurer: Measurer, knowledge: Knowledge | None, should_stop: Callable[[], bool],
                 make_measurer: Callable[[ModelTuneRequest], Measurer]) -> None:
        self.worker, self.url, self.job_id, self.request = worker, worker.url, job_id, request
        self.task_row, self.should_stop = task_row, should_stop
        self.pending: dict[int, Round] = {}  # round id -> round, dispatched and not yet handed back
        self.poll = min(worker.settings.poll_seconds, 0.1)
        self.closed = threading.Event()
        self.error: BaseException | None = None

        def own_rounds() -> None:  # started with the first round
            while not self.closed.is_set():
                try:
                    round_id = claim_round(worker, job_id)
                    if round_id is None:
                        self.closed.wait(self.poll)
                        continue
                    execute_round(worker, round_id, measurer=measurer, knowledge=knowledge,
                                  make_measurer=make_measurer)
                except Exception as e:  # the database is gone past its retries: the job stops, its lease decides
                    log.exception("job %s: running its own round failed", job_id)
                    self.error = e
                    return

        self.runner = threading.Thread(target=own_rounds, name=f"rounds-{job_id}", daemon=True)

    def free(self, in_flight: int) -> bool:
        if in_flight == 0:
            return True
        with session_scope(self.url) as s:
            return in_flight < self._slots(s)

    def _slots(self, s: Any) -> int:
        """Rounds of the job in flight at most: one per live worker (`workers`; this one counts even when it has
        no row, run outside `run_forever`), at most `MOST_IN_FLIGHT`."""
        since = db_now(s) - timedelta(seconds=self.worker.settings.lease_seconds)
        return max(1, min(MOST_IN_FLIGHT, WorkerRow.live(s, since)))

    def submit(self, rnd: Round, trials: Sequence[Trial]) -> None:
        if self.runner.ident is None:
            self.runner.start()
        task_id = self.task_row(rnd)
        payload = rnd.to_json(self.request.target)

        def write() -> int:
            with session_scope(self.url) as s:
                row = TaskRound(job_id=self.job_id, task_id=task_id, status="queued", payload=payload)
                s.add(row)
                s.flush()
                return row.id

        self.pending[self.worker.retry_db(f"job {self.job_id}: round", write)] = rnd

    def wait(self, more: bool) -> RoundDone | None | bool:
        while not self.should_stop():
            if self.error is not None:
                raise self.error
            with session_scope(self.url) as s:
                row = s.execute(select(TaskRound.id, TaskRound.task_id, TaskRound.result)
                                .where(TaskRound.id.in_(list(self.pending)), TaskRound.status == "done")
                                .order_by(TaskRound.finished_at, TaskRound.id).limit(1)).first()
                if row is not None:
                    rnd = self.pending.pop(row.id)
                    result = row.result or {}
                    return RoundDone(rnd, trials_of(s, row.task_id), result.get("baseline_ms"), result.get("error"))
                if more and len(self.pending) < self._slots(s):
                    return True
            time.sleep(self.poll)
        return None

    def close(self) -> None:
        self.closed.set()
        if self.runner.ident is not None:
            self.runner.join()
        if self.pending:
            cancel_rounds(self.url, self.job_id)
            self.pending.clear()
