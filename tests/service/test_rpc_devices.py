"""Devices through TVM's RPC tracker: a real `tvm.exec.rpc_tracker` and `tvm.exec.rpc_server` on loopback.

A job naming a device key is built by the worker and measured on the server leased from the tracker (each trial
says which device measured it); the server killed mid-job and started again later makes the job wait, and no
trial is marked wrong for it; the API lists the tracker's queue and refuses a key it does not know, or any key
when no tracker is configured.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import select
from support.processes import ROOT, wait_until
from support.servers import free_port

from service.db import session_scope
from service.models import Job, TrialRow
from service.worker import Worker

KEY = "test-cpu"
DENSE = {"kind": "operator", "operator": "dense", "params": {"m": 16, "n": 16, "k": 16}, "dtype": "float32",
         "epilogue": "none", "target": "host", "budget": 6, "seed": 0, "device": KEY}


@contextmanager
def _tvm_process(args: list[str], log) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the server and its session processes
        except ProcessLookupError:
            pass
        proc.wait()


def _registered(tracker: str) -> int:
    from tuner.measurers.rpc import tracker_queue

    try:
        return sum(q.total for q in tracker_queue(tracker, timeout_s=1) if q.key == KEY)
    except ConnectionError:
        return -1


class Devices:
    """A tracker on loopback and servers of key `KEY` registered with it, started and killed at will."""

    def __init__(self, log) -> None:
        self.log = log
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._servers: list[subprocess.Popen] = []

    def start_server(self, wait: bool = True) -> subprocess.Popen:
        """A server of key KEY (it registers with the tracker once both are up); with `wait`, once registered."""
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(port),
             "--port-end", str(port + 1), "--tracker", self.address, "--key", KEY],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self._servers.append(proc)
        if wait:
            wait_until("the server to register", lambda: _registered(self.address) >= 1, timeout=60)
        return proc

    def kill_server(self, proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for proc in self._servers:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


@pytest.fixture
def devices(tmp_path) -> Iterator[Devices]:
    with open(tmp_path / "rpc.log", "ab") as log:
        d = Devices(log)
        with _tvm_process(["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(d.port),
                           "--port-end", str(d.port + 1)], log):
            wait_until("the tracker", lambda: _registered(d.address) >= 0, timeout=60)
            d.first = d.start_server(wait=False)  # registers while the test sets up (before the tracker: 5 s retries)
            try:
                yield d
            finally:
                d.close()


def _trials(url: str, job_id: int) -> list[TrialRow]:
    with session_scope(url) as s:
        return list(s.scalars(select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.id)))


@pytest.mark.server
@pytest.mark.tunes
def test_a_job_is_measured_on_the_tracker_device_and_waits_out_its_disappearance(sqlite_url, tmp_path, devices,
                                                                                 make_token):
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.settings import Settings

    settings = Settings(database_url=sqlite_url, data_dir=tmp_path, rpc_tracker=devices.address, lease_seconds=5,
                        poll_seconds=0.2)
    wait_until("the server to register", lambda: _registered(devices.address) >= 1, timeout=60)
    server = devices.first
    token = make_token(sqlite_url, "admin", "test-admin")
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {token}"}) as client:
        r = client.get("/api/v1/devices")
        assert r.status_code == 200, r.text
        assert r.json() == {"tracker": devices.address, "count": 1,
                            "data": [{"key": KEY, "total": 1, "free": 1, "pending": 0}]}
        r = client.post("/api/v1/jobs", json=DENSE | {"device": "no-such-board"})
        assert r.status_code == 422
        assert "no device 'no-such-board'" in r.text and KEY in r.text and "rpc_server" in r.text
        r = client.post("/api/v1/jobs", json=DENSE)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        assert r.json()["spec"]["device"] == KEY

    worker = Worker(settings)
    thread = threading.Thread(target=worker.run_once)
    thread.start()
    try:
        wait_until("the first trials", lambda: len(_trials(sqlite_url, job_id)) >= 3, timeout=120)
        devices.kill_server(server)  # the device disappears mid-job
        wait_until("the tracker to notice", lambda: _registered(devices.address) == 0, timeout=60)
        stalled = len(_trials(sqlite_url, job_id))
        time.sleep(1)
        assert thread.is_alive(), "the job waits for a device"
        devices.start_server()
        thread.join(180)
        assert not thread.is_alive()
    finally:
        worker.stop()
        thread.join(10)
    with session_scope(sqlite_url) as s:
        job = Job.find_or_raise_by_id(s, job_id)
    trials = _trials(sqlite_url, job_id)
    assert job.status == "succeeded", job.error
    assert job.errors == 0 and all(t.error is None for t in trials), "no trial marked wrong for the device's loss"
    assert len(trials) == DENSE["budget"] > stalled
    assert all(t.extra.get("device") == KEY and t.latency_ms > 0 for t in trials), "every trial measured remotely"


def test_devices_need_a_tracker(client):
    """Without ALTUNE_RPC_TRACKER: the queue is empty and a job naming a device is refused, saying what to set."""
    assert client.get("/api/v1/devices").json() == {"tracker": None, "data": [], "count": 0}
    r = client.post("/api/v1/jobs", json=DENSE)
    assert r.status_code == 422
    assert "ALTUNE_RPC_TRACKER" in r.text
    r = client.post("/api/v1/jobs", json=DENSE | {"device": "bad key!"})
    assert r.status_code == 422


def test_compose_points_the_service_at_its_tracker_and_server():
    """docker-compose.yml: the API and workers name the tracker service the device server registers with."""

    import yaml

    from service.settings import Settings

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    tracker = services["api"]["environment"]["ALTUNE_RPC_TRACKER"]
    assert services["worker"]["environment"]["ALTUNE_RPC_TRACKER"] == tracker
    assert Settings(rpc_tracker=tracker).rpc_tracker == tracker  # the setting's own validation
    host, port = tracker.split(":")
    command = services[host]["command"]
    assert command[:3] == ["python", "-m", "tvm.exec.rpc_tracker"] and command[command.index("--port") + 1] == port
    server = services["rpc-server"]["command"]
    assert server[server.index("--tracker") + 1] == tracker
