"""The API under load: 100 clients and 50 event streams against `altune serve` while its worker tunes.

Sync handlers run on a bounded pool of threads, and a request keeps its session (and its pooled connection)
until its response is serialized, on a thread of its own. Unbounded, the requests holding every connection
waited for threads held by requests waiting for a connection: from about 60 clients nothing was answered
until the pool's 30 s timeout. Here every request must be answered, and the streams must keep delivering
the job's trials while the clients hammer the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import psutil
import pytest

from support.processes import ROOT, answers, service_env, wait_until
from support.servers import free_port

from bench import load as bench_load

JOB = {"kind": "operator", "operator": "dense", "params": {"m": 64, "n": 64, "k": 64}, "dtype": "float32",
       "target": "host", "budget": 200}
CLIENTS = 100
STREAMS = 50  # half on the tuning job's stream, half on the jobs list's
LOAD_SECONDS = 10.0  # clients keep requesting at least this long, and until every stream has had its events
BOUND_SECONDS = 60.0  # the whole load, clients and streams; a deadlocked server fails here
REQUEST_TIMEOUT = 20.0

pytestmark = [pytest.mark.server, pytest.mark.tunes, pytest.mark.timeout(180)]


@dataclass
class Load(bench_load.Load):
    """bench.load's tally (reads, writes, errors), and the events of each of the test's streams."""

    events: list[dict[str, int]] = field(default_factory=lambda: [{} for _ in range(STREAMS)])

    def summary(self) -> str:
        def pct(q: float) -> float:
            return 1000 * bench_load.percentile(self.reads, q)

        trials = sum(e.get("trial", 0) for e in self.events[::2])
        jobs = sum(e.get("job", 0) for e in self.events[1::2])
        return (f"{CLIENTS} clients + {STREAMS} streams: {len(self.reads)} reads and {self.writes} writes answered, {len(self.errors)} errors, "
                f"p50 {pct(0.5):.0f} ms, p99 {pct(0.99):.0f} ms; {trials} trial events on the job's streams, "
                f"{jobs} job events on the list's")


@pytest.fixture
def served(sqlite_url, tmp_path) -> Iterator[str]:
    """`altune serve` with one worker on a loopback port, its own process tree: the URL to reach it."""
    port = free_port()
    # a build that hangs (it happens, and costs 60 s by default) must not hold back the first trials for long
    db_url = sqlite_url  # the embedded default; the same pool and thread budget holds on PostgreSQL (docs/design.md)
    env = service_env(ALTUNE_DATABASE_URL=db_url, ALTUNE_DATA_DIR=str(tmp_path), ALTUNE_MEASURE_TIMEOUT="10",
                      # the clients submit a job every tenth round: hundreds, over the default queue quota
                      ALTUNE_ANONYMOUS="all", ALTUNE_TOKEN_MAX_QUEUED="100000",
                      ALTUNE_MAX_STREAMS_PER_TOKEN="100")  # the 50 streams of many users, from one address
    log_path = tmp_path / "serve.log"
    log = log_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", "1"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until("the server to answer", lambda: answers(url), timeout=60, procs=(proc,), logs=(log_path,))
        yield url
    finally:
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)  # the worker and its measurement processes
        except psutil.NoSuchProcess:
            tree = []
        proc.send_signal(signal.SIGTERM)  # the server stops its worker itself
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _, alive = psutil.wait_procs(tree, timeout=15)
        for p in alive:  # a server that hung on the way out leaves them behind
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        log.close()


async def _client(i: int, base: str, job_id: int, load: Load, done: asyncio.Event) -> None:
    """bench.load's dashboard client: the jobs list, the job and its trials; every tenth round a submission."""
    async with httpx.AsyncClient(base_url=base, timeout=REQUEST_TIMEOUT) as client:
        await bench_load.dashboard_client(i, client, [job_id], load, done)


async def _stream(path: str, base: str, counts: dict[str, int], load: Load) -> None:
    """Counts the events of one stream by name until cancelled."""
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(REQUEST_TIMEOUT, read=None)) as client:
        try:
            async with client.stream("GET", path) as r:
                if r.status_code != 200:
                    load.errors.append(f"GET {path}: {r.status_code}")
                    return
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        name = line.removeprefix("event: ")
                        counts[name] = counts.get(name, 0) + 1
        except httpx.HTTPError as e:
            load.errors.append(f"GET {path}: {type(e).__name__}")


def _streams_delivered(load: Load) -> bool:
    """Every job stream has had a trial, every list stream a job: what the tuning worker wrote got through."""
    return all(e.get("trial") for e in load.events[::2]) and all(e.get("job") for e in load.events[1::2])


async def _run(base: str, job_id: int, load: Load) -> None:
    paths = [f"/api/v1/jobs/{job_id}/events" if k % 2 == 0 else "/api/v1/events" for k in range(STREAMS)]
    streams = [asyncio.create_task(_stream(p, base, load.events[k], load)) for k, p in enumerate(paths)]
    done = asyncio.Event()
    clients = [asyncio.create_task(_client(i, base, job_id, load, done)) for i in range(CLIENTS)]
    try:
        started = time.monotonic()
        while time.monotonic() - started < LOAD_SECONDS or not _streams_delivered(load):
            await asyncio.sleep(0.2)
        done.set()
        await asyncio.gather(*clients)
    finally:
        for task in [*clients, *streams]:
            task.cancel()
        await asyncio.gather(*clients, *streams, return_exceptions=True)


def test_hundred_clients_and_fifty_streams_while_a_worker_tunes(served, run_async):
    r = httpx.post(f"{served}/api/v1/jobs", json=JOB, timeout=REQUEST_TIMEOUT)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    deadline = time.monotonic() + 90
    while (job := httpx.get(f"{served}/api/v1/jobs/{job_id}", timeout=REQUEST_TIMEOUT).json())["trials_done"] == 0:
        assert time.monotonic() < deadline, f"the worker measured nothing in 90 s: {job}"
        time.sleep(0.3)  # tuning: its next rounds' trials come during the load

    load = Load()
    started = time.monotonic()
    try:
        run_async(asyncio.wait_for(_run(served, job_id, load), BOUND_SECONDS))
        finished = True
    except TimeoutError:
        finished = False
    assert finished, f"the load did not end in {BOUND_SECONDS:.0f} s: {load.summary()}; first errors: {load.errors[:5]}"
    print(f"{load.summary()}, in {time.monotonic() - started:.1f} s")

    assert not load.errors, f"{load.summary()}; first errors: {load.errors[:5]}"
    assert _streams_delivered(load), f"streams without their events: {load.events}"
    after = httpx.get(f"{served}/api/v1/jobs/{job_id}", timeout=REQUEST_TIMEOUT).json()
    assert after["trials_done"] > job["trials_done"], f"the worker tuned through the load: {job} -> {after}"
