"""Bounded jobs in real worker processes: a model that needs too much memory or time fails as a job and the worker
lives on; a cancel stops a model job mid-build within seconds; a job past its deadline is stopped, saying so;
leases are compared on the database's clock; the worker process never loads an upload with torch."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support.jobs import DENSE, add_job, add_model_job, get_job, job_finished  # noqa: E402
from support.models import save_program  # noqa: E402
from support.processes import cli_process, wait_until, worker_env  # noqa: E402

from compiler.workloads import zoo  # noqa: E402
from service.db import session_scope  # noqa: E402
from service.models import Job  # noqa: E402

def _add_zoo_job(url: str, folder: Path, name: str, budget: int) -> int:
    path = folder / f"{name}.pt2"
    torch.export.save(zoo.export(name), path)
    return add_model_job(url, path, [list(s) for s in zoo.MODELS[name].input_shapes], budget=budget, licm=True)


class Hungry(torch.nn.Module):
    """A few bytes of graph whose 48 outputs of 64 MiB each (every one under the tensor limit) need 3 GiB at once."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(x.expand(1 << 24) * float(i) for i in range(48))


class Slow(torch.nn.Module):
    """A chain of 400 matmuls of 2048 x 2048 (7 TFLOP): minutes of torch, where the limit is seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(2048, 2048) / 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(400):
            x = x @ self.w
        return x


def _builds_of(parent: int) -> list[int]:
    """Pids of the running `service.sandbox_child build` children of process `parent` (from /proc: no `ps`
    needed; other tests' builds, in another process of the run, are not its children)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # the process ended meanwhile
            continue
        if ppid == parent and b"service.sandbox_child" in cmdline and b"build" in cmdline:
            pids.append(int(proc.name))
    return pids


@pytest.mark.server
@pytest.mark.tunes
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the storage paths are the operator jobs'
def test_a_model_over_the_memory_or_time_limit_fails_its_job_and_the_worker_lives_on(db_url, tmp_path):
    hungry = add_model_job(db_url, save_program(Hungry(), (torch.ones(1),), tmp_path / "hungry.pt2"), [[1]],
                           licm=True)
    slow = add_model_job(db_url, save_program(Slow(), (torch.ones(2048, 2048),), tmp_path / "slow.pt2"),
                         [[2048, 2048]], licm=True)
    dense = add_job(db_url, DENSE)
    env = worker_env(db_url, tmp_path, ALTUNE_SANDBOX_MEMORY_BYTES=str(3 << 30), ALTUNE_SANDBOX_TIMEOUT_SECONDS="40")
    log = tmp_path / "worker.log"
    with cli_process(["worker"], env, log) as worker:
        wait_until("the three jobs", lambda: all(job_finished(db_url, j)() for j in (hungry, slow, dense)),
                   timeout=400, procs=(worker,), logs=(log,))
        assert worker.poll() is None, "the worker died"
    assert (job := get_job(db_url, hungry)).status == "failed" and "memory" in job.error, job.error
    assert str(3 << 30) in job.error, job.error
    assert (job := get_job(db_url, slow)).status == "failed" and "took more than 40 s" in job.error, job.error
    assert (job := get_job(db_url, dense)).status == "succeeded", job.error  # the same worker, after both


@pytest.mark.server
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_cancel_stops_a_model_job_mid_build_within_seconds(db_url, tmp_path):
    # small_cnn's build child runs for seconds (it imports torch and TVM, builds, checks and times the model): the
    # cancel, seen within a lease/3 of 1 s, lands in it (resnet18's build took longer, its export and import too)
    job_id = _add_zoo_job(db_url, tmp_path, "small_cnn", budget=1)
    log = tmp_path / "worker.log"
    with cli_process(["worker"], worker_env(db_url, tmp_path), log) as worker:
        wait_until("the build's child", lambda: _builds_of(worker.pid), timeout=400, procs=(worker,), logs=(log,))
        with session_scope(db_url) as s:
            s.get(Job, job_id).cancel_requested = True
        asked = time.monotonic()
        wait_until("the cancel", job_finished(db_url, job_id), timeout=30, procs=(worker,), logs=(log,))
        stopped = time.monotonic() - asked
        assert worker.poll() is None
        assert not _builds_of(worker.pid), "the build's child still runs"
    job = get_job(db_url, job_id)
    assert job.status == "cancelled", (job.status, job.error)
    assert stopped < 15, stopped  # the heartbeat sees the cancel within a lease/3, the child is killed at once
    assert not (tmp_path / "artifacts" / f"job-{job_id}.tar.gz").exists()


@pytest.mark.server
@pytest.mark.tunes
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_job_past_its_deadline_is_stopped_and_says_so(db_url, tmp_path):
    job_id = _add_zoo_job(db_url, tmp_path, "small_cnn", budget=5000)
    log = tmp_path / "worker.log"
    with cli_process(["worker"], worker_env(db_url, tmp_path, ALTUNE_JOB_DEADLINE_SECONDS="30"), log) as worker:
        wait_until("the deadline", job_finished(db_url, job_id), timeout=120, procs=(worker,), logs=(log,))
    job = get_job(db_url, job_id)
    assert job.status == "failed" and "deadline of 30 s" in job.error, (job.status, job.error)
    assert 0 < job.trials_done < 5000  # stopped while tuning; its trials are kept


def test_leases_are_compared_on_the_database_clock(db_url, monkeypatch):
    """A worker whose clock runs an hour ahead does not take over a job whose lease still runs on the database's
    clock (PostgreSQL: the server's `now()`; SQLite is embedded: its clock is this machine's)."""
    import service.job_run as job_run
    import service.worker as worker_module
    from service.settings import Settings

    if not db_url.startswith("postgresql"):
        pytest.skip("an embedded SQLite database has no clock of its own")
    settings = Settings(database_url=db_url, lease_seconds=60)
    job_id = add_job(db_url, DENSE)
    assert worker_module.Worker(settings, "on-time").claim() == job_id
    real = job_run.utcnow  # where `db_now` reads this machine's clock (SQLite's, and never PostgreSQL's)
    monkeypatch.setattr(job_run, "utcnow", lambda: real() + timedelta(hours=1))
    assert worker_module.Worker(settings, "an-hour-ahead").claim() is None
    with session_scope(db_url) as s:
        job = s.get(Job, job_id)
        assert job.worker_id == "on-time" and abs((job.lease_expires_at - real()).total_seconds() - 60) < 30


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_worker_never_loads_an_upload_itself(db_url, tmp_path, monkeypatch):
    """torch's loader, `ep.module()` and the checking loader are never called in the worker's process: the job
    still succeeds (they ran in the sandbox) and its artifact matches the reference the sandbox computed."""
    import compiler.workloads.pt2 as pt2
    from service.settings import Settings
    from service.worker import Worker

    called = []

    def refuse(name):
        def call(*args, **kwargs):
            called.append(name)
            raise AssertionError(f"{name} called in the worker's process")

        return call

    path = save_program(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()), (torch.ones(1, 3, 8, 8),),
                        tmp_path / "net.pt2")
    job_id = add_model_job(db_url, path, [[1, 3, 8, 8]], budget=2, licm=True)
    monkeypatch.setattr(torch.export, "load", refuse("torch.export.load"))
    monkeypatch.setattr(torch.export.ExportedProgram, "module", refuse("ExportedProgram.module"))
    monkeypatch.setattr(pt2, "load_exported_program", refuse("load_exported_program"))
    settings = Settings(database_url=db_url, data_dir=tmp_path)
    assert Worker(settings).run_once() == job_id
    job = get_job(db_url, job_id)
    assert job.status == "succeeded", job.error
    assert job.report["check"]["passed"] and called == []
    assert os.path.getsize(tmp_path / "artifacts" / f"job-{job_id}.tar.gz") > 0
