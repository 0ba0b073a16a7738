"""The worker and the queue: claiming under contention, cancel, a lease that expires, resume."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import select
from support.jobs import add_job, add_jobs, get_job

from service.db import session_scope, utcnow
from service.models import Job, TrialRow
from service.worker import Worker

SMALL_DENSE = {"kind": "operator", "operator": "dense", "params": {"m": 16, "n": 16, "k": 16},
               "dtype": "float32", "epilogue": "none", "target": "host", "budget": 8, "seed": 0}


def test_three_workers_never_take_the_same_job(settings):
    url = settings.resolved_database_url
    ids = add_jobs(url, SMALL_DENSE, 40)
    workers = [Worker(settings, f"w{i}") for i in range(3)]
    taken: list[tuple[str, int]] = []
    lock = threading.Lock()
    start = threading.Barrier(3)

    def drain(worker: Worker) -> None:
        start.wait()
        while (job_id := worker.claim()) is not None:
            with lock:
                taken.append((worker.worker_id, job_id))

    threads = [threading.Thread(target=drain, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    claimed = [job_id for _, job_id in taken]
    assert sorted(claimed) == ids, "every job claimed exactly once"
    with session_scope(url) as s:
        rows = s.scalars(select(Job)).all()
        assert all(j.status == "running" and j.attempts == 1 for j in rows)
        owners = {j.id: j.worker_id for j in rows}
    assert all(owners[job_id] == worker_id for worker_id, job_id in taken)


def test_expired_lease_is_claimable_and_live_lease_is_not(settings):
    url = settings.resolved_database_url
    job_id = add_job(url, SMALL_DENSE)
    first, second = Worker(settings, "first"), Worker(settings, "second")
    assert first.claim() == job_id
    assert second.claim() is None, "a live lease keeps the job"
    assert first.renew(job_id)
    with session_scope(url) as s:
        s.get(Job, job_id).lease_expires_at = utcnow() - timedelta(seconds=1)
    assert second.claim() == job_id
    assert not first.renew(job_id), "the old owner learns it lost the job"
    assert get_job(url, job_id).attempts == 2


@pytest.mark.parametrize("where", ["after-claim", "mid-job"])
def test_a_stopped_worker_hands_its_job_back_wherever_the_signal_lands(settings, monkeypatch, where):
    """SIGTERM (the cli raises SystemExit) between claiming a job and starting it, or while its heartbeat renews
    the lease: the job's lease is expired when the worker is gone, and the heartbeat cannot renew it after."""
    from service.worker import RUNNERS

    settings = settings.model_copy(update={"lease_seconds": 0.6})  # a beat every 0.2 s
    url = settings.resolved_database_url
    job_id = add_job(url, SMALL_DENSE)
    worker = Worker(settings, "stopping")
    beats = threading.Event()
    real_renew = Worker.renew

    def renew(self, job):
        beats.set()
        return real_renew(self, job)

    def signal_mid_job(run):
        assert beats.wait(10), "the heartbeat renews while the job runs"
        raise SystemExit(143)

    monkeypatch.setattr(Worker, "renew", renew)
    if where == "after-claim":
        monkeypatch.setattr(Worker, "run_job", lambda self, job: (_ for _ in ()).throw(SystemExit(143)))
    else:
        monkeypatch.setitem(RUNNERS, "operator", signal_mid_job)
    with pytest.raises(SystemExit):
        worker.run_forever()
    time.sleep(0.5)  # a heartbeat still alive would renew in this time
    job = get_job(url, job_id)
    assert job.status == "running" and job.worker_id == "stopping" and job.attempts == 1
    assert job.lease_expires_at < utcnow(), "the job is given back at once, not left to its lease"
    assert Worker(settings, "next").claim() == job_id


class _Crash(BaseException):
    """Stands for the worker process dying: not an Exception, so nothing on the way catches it."""


@pytest.mark.tunes
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # PostgreSQL's takeover: test_faults.py's kill -9
def test_dead_worker_job_resumes_and_keeps_trials(settings, monkeypatch):
    from service import worker as worker_mod

    settings = settings.model_copy(update={"lease_seconds": 1.0})
    url = settings.resolved_database_url
    job_id = add_job(url, SMALL_DENSE)
    record = worker_mod.JobRun.record_trial
    calls = {"n": 0}

    def dying_record(self, task_id, trial):
        record(self, task_id, trial)
        calls["n"] += 1
        if calls["n"] == 3:
            raise _Crash()

    monkeypatch.setattr(worker_mod.JobRun, "record_trial", dying_record)
    with pytest.raises(_Crash):
        Worker(settings, "doomed").run_once()
    monkeypatch.setattr(worker_mod.JobRun, "record_trial", record)

    job = get_job(url, job_id)
    assert job.status == "running" and job.trials_done == 3
    with session_scope(url) as s:
        early = {(t.index, t.id) for t in TrialRow.where_task(s, _task_id(s, job_id))}
    assert Worker(settings, "heir").claim() is None, "lease still live right after the crash"
    time.sleep(1.2)
    assert Worker(settings, "heir").run_once() == job_id

    job = get_job(url, job_id)
    assert job.status == "succeeded", job.error
    assert job.attempts == 2 and job.trials_done == SMALL_DENSE["budget"]
    with session_scope(url) as s:
        trials = TrialRow.where_task(s, _task_id(s, job_id))
    assert [t.index for t in trials] == list(range(SMALL_DENSE["budget"]))
    assert early <= {(t.index, t.id) for t in trials}, "the dead worker's trials are kept, not re-measured"


@pytest.mark.tunes
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the search space is the same on both backends
def test_two_level_layout_job_searches_the_larger_space(settings):
    url = settings.resolved_database_url
    # 30% of 32 for the joint stage: a round in the user's layouts, then tiled ones
    job_id = add_job(url, SMALL_DENSE | {"budget": 32, "layout_levels": 2})
    assert Worker(settings, "w").run_once() == job_id
    job = get_job(url, job_id)
    assert job.status == "succeeded", job.error
    with session_scope(url) as s:
        configs = [t.config for t in TrialRow.where_task(s, _task_id(s, job_id))]
    tiled = [c for c in configs if "layout.mt" in c]
    assert tiled and all({"layout.mt2", "layout.nt2"} <= set(c) for c in tiled), configs


def _task_id(session, job_id: int) -> int:
    from service.models import TuningTask

    (task,) = TuningTask.where_job(session, job_id)
    return task.id


@pytest.mark.tunes
def test_cancel_running_job_stops_within_seconds(settings):
    url = settings.resolved_database_url
    job_id = add_job(url, SMALL_DENSE | {"budget": 500})
    worker = Worker(settings.model_copy(update={"lease_seconds": 1.5}), "w")
    thread = threading.Thread(target=worker.run_once)
    thread.start()
    deadline = time.monotonic() + 120
    while get_job(url, job_id).trials_done < 2:
        assert time.monotonic() < deadline, "no trial measured in 120 s"
        time.sleep(0.2)
    with session_scope(url) as s:
        s.get(Job, job_id).cancel_requested = True
    asked = time.monotonic()
    thread.join(60)
    stopped = time.monotonic() - asked
    job = get_job(url, job_id)
    assert job.status == "cancelled" and stopped < 15, (job.status, stopped)
    assert 2 <= job.trials_done < 500
    with session_scope(url) as s:
        assert len(TrialRow.where_task(s, _task_id(s, job_id))) == job.trials_done, "measured trials are kept"


@pytest.mark.tunes
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the search's failure path is the same on both backends
def test_an_error_inside_the_search_fails_the_job_with_it_and_keeps_its_trials(settings, monkeypatch):
    """A bug the search does not expect (not an invalid configuration or a failed build) ends the job as
    failed, naming the error, with the trials measured before it in the database; the worker lives on."""
    from tuner.searches.alt import ALTSearch

    url = settings.resolved_database_url
    job_id = add_job(url, SMALL_DENSE | {"budget": 24})
    generate = ALTSearch.generate_candidates
    rounds = {"n": 0}

    def buggy_after_the_first_round(self, n):
        rounds["n"] += 1
        if rounds["n"] == 2:
            raise TypeError("int() argument must be a string, not 'Var'")
        return generate(self, n)

    monkeypatch.setattr(ALTSearch, "generate_candidates", buggy_after_the_first_round)
    worker = Worker(settings, "w")
    assert worker.run_once() == job_id

    job = get_job(url, job_id)
    assert job.status == "failed" and job.finished_at is not None
    assert "TypeError: int() argument must be a string, not 'Var'" in job.error
    assert 0 < job.trials_done < 24
    with session_scope(url) as s:
        trials = TrialRow.where_task(s, _task_id(s, job_id))
    assert [t.index for t in trials] == list(range(job.trials_done)), "the first round's trials are kept"
    assert any(t.latencies_ms for t in trials)
    assert worker.run_once() is None, "the worker is still there to claim (nothing left)"


@pytest.mark.tunes
def test_two_workers_finishing_the_same_workload_both_succeed_and_the_faster_schedule_stays(settings, monkeypatch):
    """The schedule store is one atomic upsert: a read-then-insert made the second worker fail on the unique key.

    Both workers reach the store together (a barrier in front of it), as two jobs of one workload that end at once,
    on PostgreSQL, where workers on several hosts share one database (SQLite's upsert: the test after this one).
    """
    from service.models import Schedule
    from service.worker import JobRun

    url = settings.resolved_database_url
    if url.startswith("sqlite"):
        pytest.skip("workers on several hosts share PostgreSQL; the SQLite upsert has a test of its own")
    ids = add_jobs(url, SMALL_DENSE | {"budget": 2}, 2)
    together = threading.Barrier(2, timeout=120)
    stored: dict[int, float] = {}
    real_store = JobRun.store_schedule

    def store_together(self, key, config, latency_ms):
        stored[self.job_id] = latency_ms
        together.wait()
        real_store(self, key, config, latency_ms)

    monkeypatch.setattr(JobRun, "store_schedule", store_together)
    def take_one(worker: Worker) -> None:  # on SQLite a claim can lose the race for the first job: claim again
        deadline = time.monotonic() + 60
        while (job_id := worker.claim()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if job_id is not None:
            worker.run_job(job_id)

    workers = [Worker(settings, f"w{i}") for i in range(2)]
    threads = [threading.Thread(target=take_one, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    jobs = [get_job(url, i) for i in ids]
    assert [j.status for j in jobs] == ["succeeded", "succeeded"], [j.error for j in jobs]
    with session_scope(url) as s:
        rows = s.scalars(select(Schedule)).all()
        assert len(rows) == 1 and rows[0].latency_ms == min(stored.values())
        assert stored[rows[0].job_id] == rows[0].latency_ms


def test_schedule_upsert_keeps_the_fastest_whatever_the_order(settings):
    from service.models import Schedule, ScheduleKey

    url = settings.resolved_database_url
    job_id = add_job(url, SMALL_DENSE)
    for latency, config in [(2.0, {"a": 1}), (3.0, {"a": 2}), (1.5, {"a": 3}), (1.5, {"a": 4}), (9.0, {"a": 5})]:
        with session_scope(url) as s:
            Schedule.upsert_if_faster(s, ScheduleKey("dense[k]", "llvm"), config, latency, job_id)
    with session_scope(url) as s:
        rows = s.scalars(select(Schedule)).all()
        assert [(r.latency_ms, r.config) for r in rows] == [(1.5, {"a": 3})]


@pytest.mark.tunes
def test_operator_jobs_honour_the_measure_timeout(sqlite_url, tmp_path):
    """ALTUNE_MEASURE_TIMEOUT reaches the operator job's measurer (model jobs already honoured it)."""
    from service.settings import Settings

    url = sqlite_url
    # one trial: every measurement times out, and a timed-out measuring process is started again (seconds each)
    job_id = add_job(url, SMALL_DENSE | {"budget": 1})
    Worker(Settings(database_url=url, data_dir=tmp_path, measure_timeout=0.001), "w").run_once()
    with session_scope(url) as s:
        errors = [t.error for t in s.scalars(select(TrialRow).where(TrialRow.job_id == job_id)).all()]
    assert errors and all(e and "timed out after 0.001 s" in e for e in errors), errors
    assert get_job(url, job_id).status == "failed"
