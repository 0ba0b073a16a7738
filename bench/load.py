"""Load: N dashboard clients against `altune serve` with two workers tuning, on loopback, bounded in time.

    python -m bench.load [--clients 100] [--streams 50] [--seconds 20] [--workers 2] [--json PATH]

Starts `altune serve --workers W` on a fresh SQLite database in a temporary folder (auth on: the clients send a
write token), submits one tuning job per worker and waits for their first trials. Then, for `--seconds`:

- `--clients` dashboard clients, each in turn: the jobs list (`GET /jobs`), a job page (`GET /jobs/{id}` and
  the first page of its trials); every tenth round one also submits a small job (as a user of the submit form);
- `--streams` event streams, half on the tuning jobs' streams (`/jobs/{id}/events`, as the job page), half
  on the jobs list's (`/events`, as the jobs page).

Prints p50 and p99 of the reads (every answered GET), the errors, and for the job streams: the events'
delay (arrival minus the trial's `created_at`, the moment the worker stored it; one clock, loopback), how many
came later than `--late` seconds, and how many were lost (a trial stored while the stream was open, at least
`--grace` seconds before it closed, that the stream never delivered). The issue's target: p99 of reads under
100 ms on 2 cores. The whole run is bounded (`--seconds` + 120 s); a hung server fails it.

`tests/service/test_load.py` is the test-suite form (one worker, anonymous, asserts every request answered).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from service.db import session_scope, upgrade
from service.tokens import create_token

ROOT = Path(__file__).resolve().parents[1]
JOB = {"kind": "operator", "operator": "dense", "params": {"m": 64, "n": 64, "k": 64}, "dtype": "float32",
       "target": "host", "budget": 400}
SMALL_JOB = JOB | {"budget": 2}
REQUEST_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    """The q-quantile of `values` (nearest rank), NaN when empty."""
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


@dataclass
class StreamLog:
    """One event stream: what it received, and the trial cursor it started from."""

    path: str
    counts: dict[str, int] = field(default_factory=dict)
    trials: dict[int, float] = field(default_factory=dict)  # trial id -> arrival (epoch seconds)
    delays: list[float] = field(default_factory=list)
    start_cursor: int | None = None
    opened_at: float | None = None
    closed_at: float | None = None


@dataclass
class Load:
    reads: list[float] = field(default_factory=list)  # seconds per answered GET
    writes: int = 0
    errors: list[str] = field(default_factory=list)
    streams: list[StreamLog] = field(default_factory=list)


async def dashboard_client(i: int, client: httpx.AsyncClient, job_ids: list[int], load: Load,
                           done: asyncio.Event, think: float = 0.0) -> None:
    """The jobs page, then a job page, over and over (`think` seconds apart, a person reading the page; 0: at once,
    a closed loop whose latency is the clients over the API's throughput); every tenth round a submission."""
    n = 0
    while not done.is_set():
        job_id = job_ids[(i + n) % len(job_ids)]
        calls = [("GET", "/api/v1/jobs"), ("GET", f"/api/v1/jobs/{job_id}"),
                 ("GET", f"/api/v1/jobs/{job_id}/trials?limit=100")]
        if (i + n) % 10 == 0:
            calls.append(("POST", "/api/v1/jobs"))
        for method, path in calls:
            started = time.perf_counter()
            try:
                r = await client.request(method, path, json=SMALL_JOB if method == "POST" else None)
            except httpx.HTTPError as e:
                load.errors.append(f"{method} {path}: {type(e).__name__}")
                continue
            if not r.is_success:
                load.errors.append(f"{method} {path}: {r.status_code} {r.text[:200]}")
            elif method == "GET":
                load.reads.append(time.perf_counter() - started)
            else:
                load.writes += 1
        n += 1
        if think > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), think)


async def event_stream(client: httpx.AsyncClient, log: StreamLog, load: Load) -> None:
    """Reads one stream until cancelled: counts events, and for trials their arrival and delay."""
    try:
        async with client.stream("GET", log.path) as r:
            if r.status_code != 200:
                load.errors.append(f"GET {log.path}: {r.status_code}")
                return
            log.opened_at = time.time()
            name = data = event_id = None
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    data = line.removeprefix("data: ")
                elif line.startswith("id: "):
                    event_id = line.removeprefix("id: ")
                elif not line and name is not None:  # the blank line that ends an event
                    _received(log, name, data, event_id)
                    name = data = event_id = None
    except httpx.HTTPError as e:
        load.errors.append(f"GET {log.path}: {type(e).__name__}")
    finally:
        log.closed_at = time.time()


def _received(log: StreamLog, name: str, data: str | None, event_id: str | None) -> None:
    log.counts[name] = log.counts.get(name, 0) + 1
    if name == "job" and log.start_cursor is None and event_id is not None and "/jobs/" in log.path:
        log.start_cursor = int(event_id)  # the first snapshot's id: every trial after it will come
    elif name == "trial" and data is not None:
        trial = json.loads(data)
        now = time.time()
        log.trials[trial["id"]] = now
        log.delays.append(now - datetime.fromisoformat(trial["created_at"]).timestamp())


async def run_load(base: str, token: str, job_ids: list[int], clients: int, streams: int, seconds: float,
                   think: float = 0.0) -> Load:
    load = Load()
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=clients + streams + 10)
    async with httpx.AsyncClient(base_url=base, timeout=REQUEST_TIMEOUT, headers=headers, limits=limits) as client, \
            httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(REQUEST_TIMEOUT, read=None), headers=headers,
                              limits=limits) as streaming:
        load.streams = [StreamLog(f"/api/v1/jobs/{job_ids[k // 2 % len(job_ids)]}/events" if k % 2 == 0
                                  else "/api/v1/events") for k in range(streams)]
        stream_tasks = [asyncio.create_task(event_stream(streaming, log, load)) for log in load.streams]
        done = asyncio.Event()
        tasks = [asyncio.create_task(dashboard_client(i, client, job_ids, load, done, think)) for i in range(clients)]
        try:
            await asyncio.sleep(seconds)
            done.set()
            await asyncio.gather(*tasks)
        finally:
            for task in [*tasks, *stream_tasks]:
                task.cancel()
            await asyncio.gather(*tasks, *stream_tasks, return_exceptions=True)
    return load


def lost_trials(base: str, token: str, load: Load, grace: float) -> tuple[int, int]:
    """(trials a job stream should have delivered, of those the ones it never did), over every job stream."""
    expected = lost = 0
    headers = {"Authorization": f"Bearer {token}"}
    by_job: dict[str, list[dict]] = {}
    with httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT, headers=headers) as client:
        for log in load.streams:
            if "/jobs/" not in log.path or log.start_cursor is None or log.closed_at is None:
                continue
            job_path = log.path.removesuffix("/events")
            if job_path not in by_job:
                trials, offset = [], 0
                while True:
                    page = client.get(f"{job_path}/trials", params={"limit": 1000, "offset": offset}).json()
                    trials += page["data"]
                    offset += len(page["data"])
                    if not page["data"] or offset >= page["count"]:
                        break
                by_job[job_path] = trials
            for trial in by_job[job_path]:
                stored = datetime.fromisoformat(trial["created_at"]).timestamp()
                if trial["id"] > log.start_cursor and stored <= log.closed_at - grace:
                    expected += 1
                    lost += trial["id"] not in log.trials
    return expected, lost


def start_server(folder: Path, workers: int) -> tuple[subprocess.Popen, str, str]:
    """`altune serve` on a fresh SQLite file in `folder`, auth on: (process, URL, a write token)."""
    url = f"sqlite:///{folder / 'altune.db'}"
    upgrade(url)
    with session_scope(url) as session:
        _, token = create_token(session, "write", "bench-load", max_queued=1_000_000, max_trials_per_day=10_000_000)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALTUNE_")} | {
        "ALTUNE_DATABASE_URL": url, "ALTUNE_DATA_DIR": str(folder), "PYTHONPATH": str(ROOT),
        "ALTUNE_MEASURE_TIMEOUT": "10",
        # one token opens every stream of the bench's many simulated users (a user's own cap is 20)
        "ALTUNE_MAX_STREAMS_PER_TOKEN": "1000"}
    log = (folder / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers",
                             str(workers)], cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {(folder / 'serve.log').read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return proc, base, token
        if time.monotonic() > deadline:
            raise SystemExit("the server did not answer in 60 s")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)  # the server stops its workers and their measurement processes
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100, help="dashboard clients (lists, job pages)")
    parser.add_argument("--streams", type=int, default=50, help="event streams, half per job, half the list's")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the clients keep going")
    parser.add_argument("--workers", type=int, default=2,
                        help="workers tuning beside the API (one job each); 0: the API alone, for comparison")
    parser.add_argument("--late", type=float, default=1.0, help="an event delayed more than this is late")
    parser.add_argument("--grace", type=float, default=2.0,
                        help="trials stored this close to a stream's end are not counted lost")
    parser.add_argument("--think", type=float, default=0.0,
                        help="seconds a client waits between its page loads (0: none, the closed loop)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="altune-load-") as tmp:
        proc, base, token = start_server(Path(tmp), args.workers)
        try:
            headers = {"Authorization": f"Bearer {token}"}
            job_ids = [httpx.post(f"{base}/api/v1/jobs", json=JOB | {"seed": k}, headers=headers,
                                  timeout=REQUEST_TIMEOUT).json()["id"] for k in range(max(args.workers, 1))]
            deadline = time.monotonic() + 120
            while args.workers and any(httpx.get(f"{base}/api/v1/jobs/{j}", headers=headers, timeout=REQUEST_TIMEOUT)
                      .json()["trials_done"] == 0 for j in job_ids):
                if time.monotonic() > deadline:
                    raise SystemExit("the workers measured nothing in 120 s")
                time.sleep(0.5)
            started = time.monotonic()
            load = asyncio.run(asyncio.wait_for(
                run_load(base, token, job_ids, args.clients, args.streams, args.seconds, args.think), args.seconds + 120))
            elapsed = time.monotonic() - started
            expected, lost = lost_trials(base, token, load, args.grace)
        finally:
            stop_server(proc)

    delays = [d for log in load.streams for d in log.delays]
    figures = {
        "clients": args.clients, "streams": args.streams, "workers": args.workers, "think_s": args.think,
        "seconds": round(elapsed, 1),
        "reads": len(load.reads), "writes": load.writes, "errors": len(load.errors),
        "read_p50_ms": round(1000 * percentile(load.reads, 0.5), 1),
        "read_p99_ms": round(1000 * percentile(load.reads, 0.99), 1),
        "trial_events": len(delays), "event_delay_p50_ms": round(1000 * percentile(delays, 0.5), 1),
        "event_delay_p99_ms": round(1000 * percentile(delays, 0.99), 1),
        "late_events": sum(d > args.late for d in delays), "events_expected": expected, "events_lost": lost,
        "list_events": sum(log.counts.get("job", 0) for log in load.streams if log.path == "/api/v1/events"),
        "cpus": os.cpu_count(), "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    print(f"{args.clients} clients (think {args.think:g} s) + {args.streams} streams, {args.workers} workers tuning, "
          f"{elapsed:.0f} s: "
          f"{figures['reads']} reads p50 {figures['read_p50_ms']} ms p99 {figures['read_p99_ms']} ms, "
          f"{figures['writes']} submissions, {figures['errors']} errors; trial events {figures['trial_events']} "
          f"(delay p50 {figures['event_delay_p50_ms']} ms, p99 {figures['event_delay_p99_ms']} ms), "
          f"{figures['late_events']} later than {args.late} s, {lost} lost of {expected}; "
          f"{figures['list_events']} job events on the list streams")
    if load.errors:
        print(f"first errors: {load.errors[:5]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


if __name__ == "__main__":
    main()
