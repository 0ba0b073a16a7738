"""Page: how long a job of 100,000 trials takes to open in the dashboard, the API's side of it.

    python -m bench.page [--trials 100000] [--tasks 1] [--rounds 5] [--all-trials] [--json PATH]

Writes one finished job with `--trials` trials (spread over `--tasks` tasks, each trial with a configuration of
some twenty knobs, one in ten an error) into a fresh SQLite database in a temporary folder, with bulk inserts,
starts the API alone on it (uvicorn in a thread of this process, no worker) and times, `--rounds` times, the
requests the job page makes before it shows the job: the job (`GET /jobs/{id}`), the chart
(`GET /jobs/{id}/trials/chart`) and the first page of the trials table (`GET /jobs/{id}/trials?limit=50&order=desc`),
one after the other. Prints each request's median and the total of the medians. `--all-trials` also times paging
every trial (1000 a request), what the job page loaded before the chart was downsampled.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import uvicorn
from sqlalchemy import insert, text

from service.api import create_app
from service.db import session_scope, upgrade, utcnow
from service.models import Job, TrialRow, TuningTask
from service.settings import Settings

CHUNK = 10_000  # trials per INSERT batch


def _config(rng: random.Random) -> dict:
    """A loop schedule's knobs, as `tuner.spaces.loop` writes them (some twenty)."""
    tiles = {f"tile.{axis}.{level}": rng.choice([1, 2, 4, 8, 16]) for axis in "nchw" for level in (1, 2, 3)}
    return tiles | {"order": rng.randrange(6), "parallel": 1, "vectorize": 1, "unroll": rng.choice([0, 16, 64])}


def build(url: str, trials: int, tasks: int, seed: int = 0) -> int:
    """A finished operator job with `trials` trials over `tasks` tasks in the (migrated) database: its id."""
    rng = random.Random(seed)
    now = utcnow()
    spec = {"kind": "operator", "operator": "dense", "params": {"m": 256, "n": 256, "k": 256}, "dtype": "float32",
            "epilogue": "none", "target": "host", "budget": trials, "seed": seed}
    with session_scope(url) as s:
        job = Job(kind="operator", name="dense", spec=spec, target="host", budget=trials, status="succeeded",
                  trials_done=trials, errors=trials // 10, best_latency_ms=0.5, baseline_ms=40.0, attempts=1,
                  started_at=now - timedelta(seconds=trials), finished_at=now)
        s.add(job)
        s.flush()
        task_ids = []
        for i in range(tasks):
            task = TuningTask(job_id=job.id, index=i, name="dense", workload_key=f"dense[k=256,m=256,n={256 + i}]",
                              budget=trials // tasks, trials_done=trials // tasks, best_latency_ms=0.5,
                              baseline_ms=40.0)
            s.add(task)
            s.flush()
            task_ids.append(task.id)
        job_id = job.id
    per_task = [0] * tasks
    with session_scope(url) as s:
        # the trials' six indexes outgrow SQLite's default page cache (2 MiB) a few ten thousand rows in, and every
        # insert then reads index pages from the file: 5x slower than with room for them
        if url.startswith("sqlite"):
            s.execute(text("PRAGMA cache_size = -262144"))
        for start in range(0, trials, CHUNK):
            rows = []
            for n in range(start, min(start + CHUNK, trials)):
                k = n % tasks
                latency = None if n % 10 == 9 else 0.5 + 40 / (1 + n / 100) * rng.uniform(1, 3)
                rows.append({"job_id": job_id, "task_id": task_ids[k], "index": per_task[k], "config": _config(rng),
                             "latencies_ms": None if latency is None else [latency] * 3, "latency_ms": latency,
                             "error": "build failed: out of registers" if latency is None else None,
                             "predicted": rng.random(), "stage": "joint" if n < trials // 3 else "loop",
                             "extra": {"layout": ["N", "C/8", "H", "W", "8c"]},
                             "created_at": now - timedelta(seconds=trials - n)})
                per_task[k] += 1
            s.execute(insert(TrialRow), rows)
    return job_id


def free_port() -> int:
    """A loopback port free now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The API alone (no worker) on a loopback port, in a thread of this process."""

    def __init__(self, settings: Settings, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise SystemExit("the API did not start in 30 s")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def _timed(client: httpx.Client, path: str) -> float:
    started = time.perf_counter()
    r = client.get(path)
    elapsed = time.perf_counter() - started
    if r.status_code != 200:
        raise SystemExit(f"GET {path}: {r.status_code} {r.text[:500]}")
    return elapsed


def page_requests(job_id: int) -> dict[str, str]:
    """What the job page asks for before it shows the job: name -> path."""
    base = f"/api/v1/jobs/{job_id}"
    return {"job": base, "chart": f"{base}/trials/chart", "first page": f"{base}/trials?limit=50&order=desc"}


def all_trials(client: httpx.Client, job_id: int) -> float:
    """Seconds to page every trial of the job, 1000 a request, by cursor."""
    started = time.perf_counter()
    cursor = None
    while True:
        params = {"limit": 1000} | ({"cursor": cursor} if cursor else {})
        page = client.get(f"/api/v1/jobs/{job_id}/trials", params=params).json()
        cursor = page["next"]
        if cursor is None:
            return time.perf_counter() - started


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.page", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100_000, help="trials of the job")
    parser.add_argument("--tasks", type=int, default=1, help="tasks they are spread over (a model job has many)")
    parser.add_argument("--rounds", type=int, default=5, help="times the page's requests are timed (median)")
    parser.add_argument("--all-trials", action="store_true", help="also time paging every trial (the page before)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="altune-page-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'altune.db'}"
        upgrade(url)
        started = time.perf_counter()
        job_id = build(url, args.trials, args.tasks)
        built = time.perf_counter() - started
        settings = Settings(database_url=url, data_dir=Path(tmp), anonymous="read")
        with Server(settings, free_port()) as server, httpx.Client(base_url=server.url, timeout=120) as client:
            requests = page_requests(job_id)
            for path in requests.values():  # warm: the first request of a process imports and connects
                _timed(client, path)
            times = {name: [] for name in requests}
            for _ in range(args.rounds):
                for name, path in requests.items():
                    times[name].append(_timed(client, path))
            paged = all_trials(client, job_id) if args.all_trials else None

    medians = {name: 1000 * statistics.median(ts) for name, ts in times.items()}
    total = sum(medians.values())
    figures = {"trials": args.trials, "tasks": args.tasks, "rounds": args.rounds, "build_s": round(built, 1),
               **{f"{name.replace(' ', '_')}_ms": round(ms, 1) for name, ms in medians.items()},
               "page_total_ms": round(total, 1), "all_trials_s": None if paged is None else round(paged, 2),
               "cpus": os.cpu_count(), "at": datetime.now(UTC).isoformat(timespec="seconds")}
    print(f"job of {args.trials} trials over {args.tasks} task(s) (written in {built:.1f} s); medians of "
          f"{args.rounds}: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in medians.items())
          + f"; the page's requests in all: {total:.1f} ms"
          + ("" if paged is None else f"; every trial paged (1000 a request): {paged:.2f} s"))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


if __name__ == "__main__":
    main()
