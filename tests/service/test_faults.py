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
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import torch
from sqlalchemy.engine import make_url
from support.auth import new_token
from support.databases import reset_postgres
from support.jobs import DENSE, add_job, add_model_job, get_job, job_finished, trial_rows
from support.models import save_program
from support.processes import answers, cli_process, wait_until, worker_env
from support.servers import free_port

from service.db import upgrade

OUTAGE_S = 4.0  # > support.processes.LEASE_S: the lease runs out during the outage, the same worker must end the job


# -- helpers ---------------------------------------------------------------------------------------------------


def _assert_all_trials_kept(url: str, job_id: int, before: list[tuple], budget: int) -> list[tuple]:
    after = trial_rows(url, job_id)
    assert set(before) <= set(after), f"trials lost: {sorted(set(before) - set(after))}"
    assert sorted(index for _, index, _ in after) == list(range(budget)), "each trial index exactly once"
    job = get_job(url, job_id)
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


@pytest.mark.server
@pytest.mark.tunes
def test_a_worker_killed_mid_job_loses_no_trial_and_another_finishes_it(db_url, tmp_path):
    job_id = add_job(db_url, DENSE)
    env = worker_env(db_url, tmp_path)
    logs = (tmp_path / "worker-a.log", tmp_path / "worker-b.log")
    with cli_process(["worker"], env, logs[0]) as a:
        wait_until("worker a to claim the job", lambda: get_job(db_url, job_id).status == "running", procs=(a,),
                   logs=logs)
        with cli_process(["worker"], env, logs[1]) as b:  # idle: the job is a's while its lease holds
            wait_until("worker a's first trials", lambda: len(trial_rows(db_url, job_id)) >= 3, procs=(a, b), logs=logs)
            os.kill(a.pid, signal.SIGKILL)
            assert a.wait(10) == -signal.SIGKILL
            before = trial_rows(db_url, job_id)
            job = get_job(db_url, job_id)
            assert job.status == "running" and f":{a.pid}:" in job.worker_id, "the dead worker holds the lease"
            assert 3 <= len(before) < DENSE["budget"]
            wait_until("worker b to finish the job", job_finished(db_url, job_id), procs=(b,), logs=logs)
    _assert_all_trials_kept(db_url, job_id, before, DENSE["budget"])
    job = get_job(db_url, job_id)
    assert f":{b.pid}:" in job.worker_id
    assert job.attempts == 2 and job.takeovers == 1


# -- the API killed under streaming clients --------------------------------------------------------------------


@pytest.mark.server
@pytest.mark.tunes
def test_streams_reconnect_to_a_restarted_api_and_get_every_trial_while_the_worker_goes_on(sqlite_url, tmp_path):
    token = new_token(sqlite_url, "admin", "test-admin")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = worker_env(sqlite_url, tmp_path, ALTUNE_PORT=str(port))
    logs = (tmp_path / "api.log", tmp_path / "worker.log", tmp_path / "api-2.log")

    def up() -> bool:
        return answers(base)

    with cli_process(["serve", "--workers", "0"], env, logs[0]) as api:
        wait_until("the API", up, procs=(api,), logs=logs)
        r = httpx.post(f"{base}/api/v1/jobs", json=DENSE | {"budget": 20},
                       headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        streams = [EventStream(f"{base}/api/v1/jobs/{job_id}/events", token) for _ in range(3)]
        for s in streams:
            s.start()
        with cli_process(["worker"], env, logs[1]) as worker:
            wait_until("trials on every stream", lambda: all(len(s.trial_ids) >= 3 for s in streams),
                   procs=(api, worker), logs=logs)
            os.kill(api.pid, signal.SIGKILL)
            assert api.wait(10) == -signal.SIGKILL
            at_kill = len(trial_rows(sqlite_url, job_id))
            # the worker goes on without the API: trials keep arriving in the database
            wait_until("trials written while the API is down",
                       lambda: len(trial_rows(sqlite_url, job_id)) >= at_kill + 2,
                       procs=(worker,), logs=logs)
            assert not up()
            with cli_process(["serve", "--workers", "0"], env, logs[2]) as api2:
                for s in streams:
                    s.join(120)
                assert api2.poll() is None
            assert worker.poll() is None, "the worker lived through the API's death"
    rows = trial_rows(sqlite_url, job_id)
    assert get_job(sqlite_url, job_id).status == "succeeded"
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

    real = request.getfixturevalue("postgres_url")
    reset_postgres(real)
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


@pytest.mark.server
@pytest.mark.tunes
def test_workers_api_and_streams_ride_out_a_database_outage(outage, tmp_path):
    url, database_down, backend = outage
    token = new_token(url, "admin", "test-admin")
    bearer = {"Authorization": f"Bearer {token}"}
    job_id = add_job(url, DENSE | {"budget": 20})
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = worker_env(url, tmp_path, ALTUNE_PORT=str(port))
    logs = (tmp_path / "api.log", tmp_path / "worker.log")
    with cli_process(["serve", "--workers", "0"], env, logs[0]) as api, \
            cli_process(["worker"], env, logs[1]) as worker:
        wait_until("the API", lambda: answers(base), procs=(api,), logs=logs)
        stream = EventStream(f"{base}/api/v1/jobs/{job_id}/events", token)
        stream.start()
        wait_until("the first trials", lambda: len(stream.trial_ids) >= 3, procs=(api, worker), logs=logs)
        with database_down():
            time.sleep(OUTAGE_S / 2)
            during = httpx.get(f"{base}/api/v1/jobs/{job_id}", headers=bearer, timeout=30)
            if backend == "postgres":  # reads fail, and say why; SQLite's readers are not blocked by a writer
                assert during.status_code == 503 and "database" in during.json()["detail"]
                assert httpx.get(f"{base}/healthz", timeout=30).status_code == 503
            time.sleep(OUTAGE_S / 2)
            assert worker.poll() is None and api.poll() is None, "the worker and the API live through the outage"
        stuck_at = len(stream.trial_ids)
        wait_until("the job to finish after the outage", job_finished(url, job_id), procs=(api, worker), logs=logs)
        stream.join(60)
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        assert httpx.get(f"{base}/api/v1/jobs/{job_id}", headers=bearer, timeout=10).status_code == 200
    rows = _assert_all_trials_kept(url, job_id, [], 20)
    job = get_job(url, job_id)
    assert job.attempts == 1 and f":{worker.pid}:" in job.worker_id, "the same worker ended it, without a restart"
    assert len(stream.trial_ids) > stuck_at
    assert stream.end == {"status": "succeeded"}
    assert stream.trial_ids == [row_id for row_id, _, _ in rows]
    if backend == "postgres":
        assert stream.connects == 1, "the stream stayed open through the outage"
        assert any("database unavailable" in c for c in stream.comments)


@pytest.mark.server
@pytest.mark.tunes
@pytest.mark.builds_model
def test_a_model_job_rides_out_a_database_outage(outage, tmp_path):
    """A model job's writes (its trials, the model's estimate, each task's baseline, the report, the artifact's
    row) wait through an outage longer than the lease, and the same worker ends the job. (On SQLite: the retry
    path is the backend-neutral `retry_db` that the operator job's outage test runs on both.)"""
    url, database_down, backend = outage
    if backend == "postgres":
        pytest.skip("the write retry is the same on both backends; the operator job's outage test covers PostgreSQL")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 1))
    path = save_program(net, (torch.ones(1, 3, 16, 16),), tmp_path / "net.pt2")
    job_id = add_model_job(url, path, [[1, 3, 16, 16]], budget=24)
    log = tmp_path / "worker.log"
    with cli_process(["worker"], worker_env(url, tmp_path), log) as worker:
        wait_until("the first trials", lambda: len(trial_rows(url, job_id)) >= 3, procs=(worker,), logs=(log,))
        before = trial_rows(url, job_id)
        with database_down():
            time.sleep(OUTAGE_S)
            assert worker.poll() is None, "the worker lives through the outage"
        wait_until("the job to finish after the outage", job_finished(url, job_id), procs=(worker,), logs=(log,))
    job = get_job(url, job_id)
    assert job.status == "succeeded", job.error
    assert job.attempts == 1 and f":{worker.pid}:" in job.worker_id, "the same worker ended it, without a restart"
    after = trial_rows(url, job_id)
    assert set(before) <= set(after) and len(after) == job.trials_done
    assert job.report["check"]["passed"]
