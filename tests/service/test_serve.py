"""`make run` and `altune serve` as a user starts and stops them: real processes, real signals.

The README's first command must work in a fresh clone (no `./var`, no database), and stopping the
server must stop its workers and their measurement processes with it, however the server stops.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from support.jobs import wait_for_job
from support.processes import ROOT, service_env
from support.servers import free_port


VENV = Path(sys.prefix)  # the suite's own environment: `make` must not reinstall it
DENSE = {"kind": "operator", "operator": "dense", "params": {"m": 16, "n": 16, "k": 16}, "dtype": "float32",
         "target": "host", "budget": 2}
BIG_DENSE = DENSE | {"params": {"m": 64, "n": 64, "k": 64}, "budget": 200}
# the server answers slowly while its workers and this suite share 2 cores (a 10 s read once timed out on CI)
HTTP_TIMEOUT = 60


def _wait_up(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}: {proc.stdout.read()}"
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"no answer from {url}/healthz in {timeout} s")


def _printed_token(proc: subprocess.Popen) -> str:
    """The token in the dashboard URL `altune serve` prints on its first start (printed before it answers)."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if match := re.search(r"\?token=(alt_[\w-]+)", line):
            return match.group(1)
        assert len(seen) < 200, f"no token URL in the server's first lines: {''.join(seen)}"
    raise AssertionError(f"the server's output ended without a token URL: {''.join(seen)}")


def _wait_job(url: str, job_id: int, until: tuple[str, ...], timeout: float = 300, trials: int = 0,
              headers: dict | None = None) -> dict:
    with httpx.Client(base_url=url, timeout=HTTP_TIMEOUT, headers=headers) as client:
        return wait_for_job(client, job_id, until, timeout, trials)


def _server_tree(proc: subprocess.Popen, workers: int) -> list[psutil.Process]:
    """The `altune serve` process and every process under it, once its workers have started."""
    root = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    while True:
        serve = [p for p in [root, *root.children(recursive=True)] if "serve" in " ".join(p.cmdline())]
        if serve:
            kids = serve[0].children(recursive=True)
            if sum("worker" in " ".join(k.cmdline()) for k in kids) >= workers:
                return [serve[0], *kids]
        assert time.monotonic() < deadline, "the server's workers did not start"
        time.sleep(0.2)


def _running(p: psutil.Process) -> bool:
    """Still running: not gone, and not a zombie (dead, waiting only for its parent to reap it)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _assert_all_gone(procs: list[psutil.Process], timeout: float = 30) -> None:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    alive = [p for p in alive if _running(p)]
    assert not alive, f"left running: {[(p.pid, p.ppid(), p.cmdline()[-3:]) for p in alive]}"


@pytest.fixture
def fresh_clone(tmp_path) -> Path:
    """The repository as `git clone` leaves it: tracked files only, no var/, no database."""
    dest = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(dest)], check=True)
    # the working tree's uncommitted state is what is under test; copy the tracked files over the clone
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    assert not (dest / "var").exists()
    return dest


def _env(port: int, **extra: str) -> dict[str, str]:
    return service_env(ALTUNE_PORT=str(port), ALTUNE_LEASE_SECONDS="30", **extra)


@pytest.mark.server
@pytest.mark.tunes
def test_make_run_in_a_fresh_clone_serves_and_finishes_a_job(fresh_clone):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    stamp = VENV / ".installed-stamp"
    # `-o STAMP`: the environment is installed already (installing is .ci/run's part); everything else is
    # the README's first command, in a directory that has never seen a database
    proc = subprocess.Popen(["make", "-o", str(stamp), "run", f"VENV={VENV}"], cwd=fresh_clone, env=_env(port),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_up(url, proc)
        tree = _server_tree(proc, workers=1)
        assert (fresh_clone / "var" / "altune.db").is_file()
        token = _printed_token(proc)  # the first start made an admin token and printed the URL that carries it
        page = httpx.get(f"{url}/?token={token}", timeout=HTTP_TIMEOUT)
        assert page.status_code == 200 and "altune" in page.text
        assert httpx.post(f"{url}/api/v1/jobs", json=DENSE, timeout=HTTP_TIMEOUT).status_code == 401, "tokens are on"
        auth = {"Authorization": f"Bearer {token}"}
        r = httpx.post(f"{url}/api/v1/jobs", json=DENSE, timeout=HTTP_TIMEOUT, headers=auth)
        assert r.status_code == 201, r.text
        job = _wait_job(url, r.json()["id"], ("succeeded", "failed", "cancelled"), headers=auth)
        assert job["status"] == "succeeded", job["error"]
        assert job["trials_done"] == DENSE["budget"] and job["has_artifact"]
        artifact = httpx.get(f"{url}/api/v1/jobs/{job['id']}/artifact", timeout=HTTP_TIMEOUT, params={"token": token})
        assert artifact.content[:2] == b"\x1f\x8b"
        tree[0].send_signal(signal.SIGTERM)  # the server; make ends with it
        _assert_all_gone(tree)
        assert proc.wait(30) is not None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture
def serve(tmp_path) -> Iterator:
    """Starts `altune serve --workers 2` on a new SQLite file in tmp_path; yields (process, url)."""
    procs = []

    def start() -> tuple[subprocess.Popen, str]:
        port = free_port()
        proc = subprocess.Popen([str(VENV / "bin" / "altune"), "serve", "--workers", "2"], cwd=tmp_path,
                                env=_env(port, ALTUNE_DATA_DIR=str(tmp_path / "data"), ALTUNE_ANONYMOUS="all"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        procs.append(proc)
        return proc, f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.server
@pytest.mark.tunes
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["sigterm", "sigint", "crash"])
def test_stopping_the_server_stops_its_workers_and_their_measurements(serve, how, tmp_path):
    proc, url = serve()
    _wait_up(url, proc)
    r = httpx.post(f"{url}/api/v1/jobs", json=BIG_DENSE, timeout=HTTP_TIMEOUT)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    _wait_job(url, job_id, ("running",))
    deadline = time.monotonic() + 120
    while len(tree := _server_tree(proc, workers=2)) <= 3:  # a worker is measuring: it has measurement processes
        assert time.monotonic() < deadline, f"expected the server, 2 workers and measurement processes: {tree}"
        time.sleep(0.3)

    proc.send_signal(how)
    _assert_all_gone(tree)

    from service.db import session_scope, utcnow
    from service.models import Job, TrialRow

    with session_scope(f"sqlite:///{tmp_path / 'data' / 'altune.db'}") as s:
        job = s.get(Job, job_id)
        kept = len(TrialRow.where_task(s, job.tasks[0].id))
        assert job.status == "running" and kept == job.trials_done
        if how != signal.SIGKILL:  # a graceful stop hands the job on at once; a crash leaves it to the lease
            assert job.lease_expires_at < utcnow()


@pytest.mark.server
@pytest.mark.tunes
def test_serve_resumes_a_job_its_previous_run_was_stopped_in(serve):
    proc, url = serve()
    _wait_up(url, proc)
    job_id = httpx.post(f"{url}/api/v1/jobs", json=DENSE | {"budget": 6}, timeout=HTTP_TIMEOUT).json()["id"]
    before = _wait_job(url, job_id, ("running",), trials=2)["trials_done"]
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)

    proc, url = serve()  # the same database: the job was released, so the new worker takes it at once
    _wait_up(url, proc)
    job = _wait_job(url, job_id, ("succeeded", "failed"), timeout=300)
    assert job["status"] == "succeeded", job["error"]
    assert job["trials_done"] == 6 and job["attempts"] == 2 and before >= 2
    trials = httpx.get(f"{url}/api/v1/jobs/{job_id}/trials", params={"limit": 100}, timeout=HTTP_TIMEOUT).json()
    assert sorted(t["index"] for t in trials["data"]) == list(range(6))  # nothing lost, nothing measured twice


def _workers_of(proc: subprocess.Popen) -> list[psutil.Process]:
    """The worker processes running under the server now (ones that end meanwhile left out)."""
    workers = []
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            if _running(p) and p.cmdline()[-2:] == ["service.cli", "worker"]:
                workers.append(p)
        except psutil.Error:
            pass
    return workers


@pytest.mark.server
@pytest.mark.tunes
def test_serve_restarts_a_worker_that_died(tmp_path):
    """SIGKILL the only worker (as the kernel's OOM killer would): `altune serve` logs it, starts another, and
    that one runs the next job (nothing restarted it: the job stayed queued)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(VENV / "bin" / "altune"), "serve", "--workers", "1"], cwd=tmp_path,
                                env=_env(port, ALTUNE_DATA_DIR=str(tmp_path / "data"), ALTUNE_ANONYMOUS="all"),
                                stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_up(url, proc)
        _server_tree(proc, workers=1)
        [first] = _workers_of(proc)
        first.kill()
        first.wait(30)
        deadline = time.monotonic() + 120
        while not (workers := [p for p in _workers_of(proc) if p.pid != first.pid]):
            assert time.monotonic() < deadline, f"no new worker in 120 s: {log.read_text()[-3000:]}"
            time.sleep(0.3)
        r = httpx.post(f"{url}/api/v1/jobs", json=DENSE, timeout=HTTP_TIMEOUT)
        assert r.status_code == 201, r.text
        job = _wait_job(url, r.json()["id"], ("succeeded", "failed", "cancelled"))
        assert job["status"] == "succeeded", job["error"]
        text = log.read_text()
        assert f"worker 0 (pid {first.pid}) exited with signal SIGKILL" in text, text[-3000:]
        assert f"worker 0 restarted (pid {workers[0].pid})" in text, text[-3000:]
        proc.send_signal(signal.SIGTERM)
        _assert_all_gone([psutil.Process(proc.pid), *workers])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
