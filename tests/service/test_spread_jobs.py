"""One model job spread over two `altune worker` processes (`service.rounds`): its rounds run by both, every trial
stored once, the artifact checked against torch as a one-worker job's is; a worker killed with SIGKILL mid-round or
mid-job loses no written trial and its round or job is taken over.

The workers measure with the simulated device (a fixed latency per configuration and a sleep per measurement, no
CPU work), so that two workers on this machine's cores do run rounds at the same time; everything else (the
sandbox, the search, the final build and check against torch) is the real job.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest
import torch
from sqlalchemy import select
from support.jobs import add_model_job, get_job, job_finished, trial_rows
from support.models import save_program
from support.processes import cli_process, wait_until, worker_env

from service.db import session_scope
from service.models import TaskRound, TrialRow

BUDGET = 48
pytestmark = [pytest.mark.server, pytest.mark.tunes, pytest.mark.builds_model]


def _model_job(url, tmp_path) -> int:
    """Three convs (three tasks, rounds of 8): a job of six rounds."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 1))
    path = save_program(net, (torch.ones(1, 3, 16, 16),), tmp_path / "net.pt2")
    return add_model_job(url, path, [[1, 3, 16, 16]], budget=BUDGET)


def _env(url, tmp_path):
    return worker_env(url, tmp_path, ALTUNE_MEASURER="simulated", ALTUNE_SIMULATED_DELAY_SECONDS="0.3")


def _rounds(url, job_id) -> list[TaskRound]:
    with session_scope(url) as s:
        return list(s.scalars(select(TaskRound).where(TaskRound.job_id == job_id).order_by(TaskRound.id)))


def _pid(worker_id: str | None) -> int | None:
    return int(worker_id.split(":")[1]) if worker_id else None


def _assert_every_trial_once(url, job_id) -> list[tuple]:
    """Each task's trials numbered 0..n-1 once, the budget spent, the job's counter agreeing; the job succeeded
    with its artifact checked whole against torch."""
    with session_scope(url) as s:
        rows = s.execute(select(TrialRow.task_id, TrialRow.index).where(TrialRow.job_id == job_id)).all()
    per_task = Counter(task for task, _ in rows)
    for task, n in per_task.items():
        assert sorted(i for t, i in rows if t == task) == list(range(n)), f"task {task}: each index once"
    job = get_job(url, job_id)
    assert job.status == "succeeded", job.error
    assert len(rows) == job.trials_done == BUDGET
    assert job.report["check"]["passed"], job.report["check"]
    return trial_rows(url, job_id)


def test_a_model_job_tuned_by_two_workers_stores_every_trial_once_and_passes_the_check(db_url, tmp_path):
    job_id = _model_job(db_url, tmp_path)
    env = _env(db_url, tmp_path)
    logs = (tmp_path / "worker-a.log", tmp_path / "worker-b.log")
    with cli_process(["worker"], env, logs[0]) as a, cli_process(["worker"], env, logs[1]) as b:
        wait_until("the job to finish", job_finished(db_url, job_id), procs=(a, b), logs=logs)
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, a.pid) == min(19, ours + 10), "workers run below the API's priority"
    _assert_every_trial_once(db_url, job_id)
    rounds = _rounds(db_url, job_id)
    assert rounds and all(r.status == "done" and r.attempts == 1 for r in rounds)
    assert {_pid(r.worker_id) for r in rounds} == {a.pid, b.pid}, "both workers ran rounds of the one job"
    job = get_job(db_url, job_id)
    assert sum(r.payload["n"] for r in rounds) == BUDGET
    assert job.attempts == 1 and _pid(job.worker_id) in (a.pid, b.pid)


def test_a_worker_killed_mid_round_loses_no_written_trial_and_its_round_is_taken_over(sqlite_url, tmp_path):
    url = sqlite_url
    job_id = _model_job(url, tmp_path)
    env = _env(url, tmp_path)
    logs = (tmp_path / "worker-a.log", tmp_path / "worker-b.log")
    with cli_process(["worker"], env, logs[0]) as a:
        wait_until("worker a to claim the job", lambda: get_job(url, job_id).status == "running", procs=(a,),
                   logs=logs)
        with cli_process(["worker"], env, logs[1]) as b:
            def b_wrote_in_its_round() -> bool:
                mine = [r for r in _rounds(url, job_id) if r.status == "running" and _pid(r.worker_id) == b.pid]
                return bool(mine) and _written_in(url, mine[0]) >= 1

            wait_until("worker b to write trials of a round", b_wrote_in_its_round, procs=(a, b), logs=logs)
            killed = next(r.id for r in _rounds(url, job_id) if r.status == "running" and _pid(r.worker_id) == b.pid)
            os.kill(b.pid, signal.SIGKILL)
            assert b.wait(10) == -signal.SIGKILL
            before = trial_rows(url, job_id)
            wait_until("worker a to finish the job", job_finished(url, job_id), procs=(a,), logs=logs)
    after = _assert_every_trial_once(url, job_id)
    assert set(before) <= set(after), f"written trials lost: {sorted(set(before) - set(after))}"
    taken = next(r for r in _rounds(url, job_id) if r.id == killed)
    assert taken.status == "done" and taken.attempts == 2 and _pid(taken.worker_id) == a.pid


def test_the_job_worker_killed_mid_job_loses_no_written_trial_and_the_other_takes_the_job_over(sqlite_url, tmp_path):
    url = sqlite_url
    job_id = _model_job(url, tmp_path)
    env = _env(url, tmp_path)
    logs = (tmp_path / "worker-a.log", tmp_path / "worker-b.log")
    with cli_process(["worker"], env, logs[0]) as a:
        wait_until("worker a's first trials", lambda: len(trial_rows(url, job_id)) >= 4, procs=(a,), logs=logs)
        with cli_process(["worker"], env, logs[1]) as b:
            os.kill(a.pid, signal.SIGKILL)
            assert a.wait(10) == -signal.SIGKILL
            before = trial_rows(url, job_id)
            assert 4 <= len(before) < BUDGET
            wait_until("worker b to finish the job", job_finished(url, job_id), procs=(b,), logs=logs)
    after = _assert_every_trial_once(url, job_id)
    assert set(before) <= set(after), f"written trials lost: {sorted(set(before) - set(after))}"
    job = get_job(url, job_id)
    assert job.attempts == 2 and job.takeovers == 1 and _pid(job.worker_id) == b.pid
    rounds = _rounds(url, job_id)
    assert not any(r.status in ("queued", "running") for r in rounds), "no round left behind"
    assert _pid(rounds[-1].worker_id) == b.pid, "the rounds after the takeover are b's"


def _written_in(url, rnd: TaskRound) -> int:
    """Trials of the round's task written since it was dispatched."""
    with session_scope(url) as s:
        return len(s.scalars(select(TrialRow.id).where(TrialRow.task_id == rnd.task_id,
                                                       TrialRow.index >= rnd.payload["prior"])).all())
