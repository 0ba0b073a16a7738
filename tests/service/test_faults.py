"""Faults injected into real processes: a worker killed with SIGKILL mid-job, the API killed with SIGKILL while
clients stream a job's events, the database unavailable for a few seconds.

Each test runs `altune worker` (and `altune serve`) as subprocesses, as a deployment does, with a short lease
(`ALTUNE_LEASE_SECONDS`), and counts trial rows in the database. The outage lasts `OUTAGE_S` seconds here
(the service is meant to ride out 30 s and more: `ALTUNE_DB_RETRY_SECONDS`, 120 by default; a short one
exercises the same paths, since the lease is shorter still).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from service.db import session_scope
from service.models import Job, TrialRow

ROOT = Path(__file__).resolve().parents[2]
DENSE = {"kind": "operator", "operator": "dense", "params": {"m": 16, "n": 16, "k": 16}, "dtype": "float32",
         "epilogue": "none", "target": "host", "budget": 12, "seed": 0}
LEASE_S = 3.0
OUTAGE_S = 4.0  # > LEASE_S: the lease runs out during the outage, and the job must still end in the same worker


# -- helpers ---------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_token(url: str) -> str:
    from service.tokens import create_token

    with session_scope(url) as session:
        return create_token(session, "admin", "test-admin")[1]


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _env(url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALTUNE_") or k == "ALTUNE_HOST_CPU"}
    return env | {"ALTUNE_DATABASE_URL": url, "ALTUNE_DATA_DIR": str(tmp_path), "ALTUNE_LEASE_SECONDS": str(LEASE_S),
                  "ALTUNE_POLL_SECONDS": "0.2", "PYTHONPATH": str(ROOT)} | extra


@contextmanager
def _process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """`python -m service.cli *args` in a session of its own; on the way out its whole group is killed."""
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", *args], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the process and what it left behind (measuring processes)
        except ProcessLookupError:
            pass
        proc.wait()


def _add_job(url: str, spec: dict = DENSE) -> int:
    with session_scope(url) as s:
        job = Job(kind="operator", name=spec["operator"], spec=spec, target=spec["target"], budget=spec["budget"])
        s.add(job)
        s.flush()
        return job.id


def _job(url: str, job_id: int) -> Job:
    with session_scope(url) as s:
        return Job.find_or_raise_by_id(s, job_id)


def _trials(url: str, job_id: int) -> list[tuple[int, int, float | None]]:
    """(row id, trial index, latency) of every trial row of the job, by row id."""
    with session_scope(url) as s:
        rows = s.execute(select(TrialRow.id, TrialRow.index, TrialRow.latency_ms)
                         .where(TrialRow.job_id == job_id).order_by(TrialRow.id)).all()
        return [tuple(r) for r in rows]


def _wait(what: str, done: Callable[[], bool], timeout: float = 300, procs: tuple[subprocess.Popen, ...] = (),
          logs: tuple[Path, ...] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        dead = [p.args[-1] for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = "\n".join(log.read_text()[-3000:] for log in logs if log.exists())
            raise AssertionError(f"{'processes exited: ' + str(dead) if dead else 'timed out'} waiting for {what}\n"
                                 f"{tails}")
        time.sleep(0.1)


def _finished(url: str, job_id: int) -> Callable[[], bool]:
    return lambda: _job(url, job_id).status not in ("queued", "running")


def _assert_all_trials_kept(url: str, job_id: int, before: list[tuple], budget: int) -> list[tuple]:
    after = _trials(url, job_id)
    assert set(before) <= set(after), f"trials lost: {sorted(set(before) - set(after))}"
    assert sorted(index for _, index, _ in after) == list(range(budget)), "each trial index exactly once"
    job = _job(url, job_id)
    assert job.status == "succeeded", job.error
    assert job.trials_done == budget == len(after)
    return after


class EventStream(threading.Thread):
    """A client of `GET /jobs/{id}/events` that reconnects like a browser's EventSource: after any error, with
    `Last-Event-ID` set to the last id it got, until the stream sends `end`."""

    def __init__(self, url: str, token: str, timeout: float = 120) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.timeout = url, token, timeout
        self.trial_ids: list[int] = []
        self.connects = 0
        self.comments: list[str] = []
        self.end: dict | None = None

    def run(self) -> None:
        last = "0"  # replay every trial from the first
        deadline = time.monotonic() + self.timeout
        while self.end is None and time.monotonic() < deadline:
            try:
                headers = {"Authorization": f"Bearer {self.token}", "Last-Event-ID": last}
                with httpx.stream("GET", self.url, headers=headers, timeout=httpx.Timeout(5, read=20)) as r:
                    if r.status_code != 200:
                        raise httpx.HTTPError(f"status {r.status_code}")
                    self.connects += 1
                    event: dict[str, str] = {}
                    for line in r.iter_lines():
                        if line.startswith(":"):
                            self.comments.append(line)
                        elif line:
                            field, _, value = line.partition(":")
                            event[field] = value.removeprefix(" ")
                        elif event:
                            last = event.get("id", last)
                            if event.get("event") == "trial":
                                self.trial_ids.append(json.loads(event["data"])["id"])
                            elif event.get("event") == "end":
                                self.end = json.loads(event["data"])
                                return
                            event = {}
            except httpx.HTTPError:
                pass
            time.sleep(0.3)


# -- a worker killed mid-job -----------------------------------------------------------------------------------


def test_a_worker_killed_mid_job_loses_no_trial_and_another_finishes_it(db_url, tmp_path):
    job_id = _add_job(db_url)
    env = _env(db_url, tmp_path)
    logs = (tmp_path / "worker-a.log", tmp_path / "worker-b.log")
    with _process(["worker"], env, logs[0]) as a:
        _wait("worker a to claim the job", lambda: _job(db_url, job_id).status == "running", procs=(a,), logs=logs)
        with _process(["worker"], env, logs[1]) as b:  # idle: the job is a's while its lease holds
            _wait("worker a's first trials", lambda: len(_trials(db_url, job_id)) >= 3, procs=(a, b), logs=logs)
            os.kill(a.pid, signal.SIGKILL)
            assert a.wait(10) == -signal.SIGKILL
            before = _trials(db_url, job_id)
            job = _job(db_url, job_id)
            assert job.status == "running" and f":{a.pid}:" in job.worker_id, "the dead worker holds the lease"
            assert 3 <= len(before) < DENSE["budget"]
            _wait("worker b to finish the job", _finished(db_url, job_id), procs=(b,), logs=logs)
    _assert_all_trials_kept(db_url, job_id, before, DENSE["budget"])
    job = _job(db_url, job_id)
    assert f":{b.pid}:" in job.worker_id
    assert job.attempts == 2 and job.takeovers == 1


# -- the API killed under streaming clients --------------------------------------------------------------------


def test_streams_reconnect_to_a_restarted_api_and_get_every_trial_while_the_worker_goes_on(sqlite_url, tmp_path):
    token = new_token(sqlite_url)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = _env(sqlite_url, tmp_path, ALTUNE_PORT=str(port))
    logs = (tmp_path / "api.log", tmp_path / "worker.log", tmp_path / "api-2.log")

    def up() -> bool:
        return _answers(base)

    with _process(["serve", "--workers", "0"], env, logs[0]) as api:
        _wait("the API", up, procs=(api,), logs=logs)
        r = httpx.post(f"{base}/api/v1/jobs", json=DENSE | {"budget": 20},
                       headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        streams = [EventStream(f"{base}/api/v1/jobs/{job_id}/events", token) for _ in range(3)]
        for s in streams:
            s.start()
        with _process(["worker"], env, logs[1]) as worker:
            _wait("trials on every stream", lambda: all(len(s.trial_ids) >= 3 for s in streams),
                  procs=(api, worker), logs=logs)
            os.kill(api.pid, signal.SIGKILL)
            assert api.wait(10) == -signal.SIGKILL
            at_kill = len(_trials(sqlite_url, job_id))
            # the worker goes on without the API: trials keep arriving in the database
            _wait("trials written while the API is down", lambda: len(_trials(sqlite_url, job_id)) >= at_kill + 2,
                  procs=(worker,), logs=logs)
            assert not up()
            with _process(["serve", "--workers", "0"], env, logs[2]) as api2:
                for s in streams:
                    s.join(120)
                assert api2.poll() is None
            assert worker.poll() is None, "the worker lived through the API's death"
    rows = _trials(sqlite_url, job_id)
    assert _job(sqlite_url, job_id).status == "succeeded"
    for s in streams:
        assert s.end == {"status": "succeeded"}
        assert s.connects >= 2, "the stream was cut by the kill and reconnected"
        assert s.trial_ids == [row_id for row_id, _, _ in rows], "every trial once, in order, none lost or repeated"


# -- the database unavailable ----------------------------------------------------------------------------------


class TcpProxy:
    """A loopback TCP relay to the database that the test can cut (every connection closed, new ones refused)
    and restore on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        for sock in [listener, *conns]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def outage(request, tmp_path):
    """(database URL the service uses, a context manager that makes the database unavailable while it is open).

    SQLite: another process's exclusive transaction holds the file (writes wait, then fail "database is locked").
    PostgreSQL: the service reaches it through a TCP proxy that is cut (connections reset, new ones refused).
    """
    from service.db import upgrade

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'altune.db'}"
        upgrade(url)

        @contextmanager
        def down() -> Iterator[None]:
            conn = sqlite3.connect(tmp_path / "altune.db", isolation_level=None, timeout=30)
            conn.execute("BEGIN EXCLUSIVE")
            try:
                yield
            finally:
                conn.execute("ROLLBACK")
                conn.close()

        yield url, down, "sqlite"
        return

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    real = request.getfixturevalue("postgres_url")
    engine = create_engine(real)  # an empty schema (`from conftest import` may find tests/web/conftest.py)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
    upgrade(real)
    parsed = make_url(real)
    proxy = TcpProxy((parsed.host or "127.0.0.1", parsed.port or 5432))
    proxy.start()

    @contextmanager
    def down() -> Iterator[None]:
        proxy.stop()
        try:
            yield
        finally:
            proxy.start()

    yield parsed.set(port=proxy.port).render_as_string(hide_password=False), down, "postgres"
    proxy.stop()


def test_workers_api_and_streams_ride_out_a_database_outage(outage, tmp_path):
    url, database_down, backend = outage
    token = new_token(url)
    bearer = {"Authorization": f"Bearer {token}"}
    job_id = _add_job(url, DENSE | {"budget": 20})
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = _env(url, tmp_path, ALTUNE_PORT=str(port))
    logs = (tmp_path / "api.log", tmp_path / "worker.log")
    with _process(["serve", "--workers", "0"], env, logs[0]) as api, \
            _process(["worker"], env, logs[1]) as worker:
        _wait("the API", lambda: _answers(base), procs=(api,), logs=logs)
        stream = EventStream(f"{base}/api/v1/jobs/{job_id}/events", token)
        stream.start()
        _wait("the first trials", lambda: len(stream.trial_ids) >= 3, procs=(api, worker), logs=logs)
        with database_down():
            time.sleep(OUTAGE_S / 2)
            during = httpx.get(f"{base}/api/v1/jobs/{job_id}", headers=bearer, timeout=30)
            if backend == "postgres":  # reads fail, and say why; SQLite's readers are not blocked by a writer
                assert during.status_code == 503 and "database" in during.json()["detail"]
                assert httpx.get(f"{base}/healthz", timeout=30).status_code == 503
            time.sleep(OUTAGE_S / 2)
            assert worker.poll() is None and api.poll() is None, "the worker and the API live through the outage"
        stuck_at = len(stream.trial_ids)
        _wait("the job to finish after the outage", _finished(url, job_id), procs=(api, worker), logs=logs)
        stream.join(60)
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        assert httpx.get(f"{base}/api/v1/jobs/{job_id}", headers=bearer, timeout=10).status_code == 200
    rows = _assert_all_trials_kept(url, job_id, [], 20)
    job = _job(url, job_id)
    assert job.attempts == 1 and f":{worker.pid}:" in job.worker_id, "the same worker ended it, without a restart"
    assert len(stream.trial_ids) > stuck_at
    assert stream.end == {"status": "succeeded"}
    assert stream.trial_ids == [row_id for row_id, _, _ in rows]
    if backend == "postgres":
        assert stream.connects == 1, "the stream stayed open through the outage"
        assert any("database unavailable" in c for c in stream.comments)


def test_a_model_job_rides_out_a_database_outage(outage, tmp_path):
    """A model job's writes (its trials, the model's estimate, each task's baseline, the report, the artifact's
    row) wait through an outage longer than the lease, and the same worker ends the job. (On SQLite: the retry
    path is the backend-neutral `retry_db` that the operator job's outage test runs on both.)"""
    import torch

    url, database_down, backend = outage
    if backend == "postgres":
        pytest.skip("the write retry is the same on both backends; the operator job's outage test covers PostgreSQL")
    path = tmp_path / "net.pt2"
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 1))
    torch.export.save(torch.export.export(net.eval(), (torch.ones(1, 3, 16, 16),)), path)
    spec = {"kind": "model", "name": "net", "model_file": str(path), "input_shapes": [[1, 3, 16, 16]],
            "target": "host", "layout": "blocked", "fusion": "none", "budget": 24, "seed": 0}
    with session_scope(url) as s:
        job = Job(kind="model", name="net", spec=spec, target="host", budget=24)
        s.add(job)
        s.flush()
        job_id = job.id
    log = tmp_path / "worker.log"
    with _process(["worker"], _env(url, tmp_path), log) as worker:
        _wait("the first trials", lambda: len(_trials(url, job_id)) >= 3, procs=(worker,), logs=(log,))
        before = _trials(url, job_id)
        with database_down():
            time.sleep(OUTAGE_S)
            assert worker.poll() is None, "the worker lives through the outage"
        _wait("the job to finish after the outage", _finished(url, job_id), procs=(worker,), logs=(log,))
    job = _job(url, job_id)
    assert job.status == "succeeded", job.error
    assert job.attempts == 1 and f":{worker.pid}:" in job.worker_id, "the same worker ended it, without a restart"
    after = _trials(url, job_id)
    assert set(before) <= set(after) and len(after) == job.trials_done
    assert job.spec["report"]["check"]["passed"]
