"""Scaling: one model job spread over N `altune worker` processes, measurements per second against N.

    python -m bench.scaling [--workers 1 2 4 8 16] [--model resnet50] [--delay 4] [--seconds 120] [--json PATH]
    python -m bench.scaling --measurer local --workers 1 2 --model squeezenet1_1 --budget 96

Simulated (the default, `--measurer simulated`): every worker measures on the simulated device
(`ALTUNE_MEASURER=simulated`, `--delay` seconds per measurement, a sleep: a device's time, no CPU work), so N
workers on this machine stand for N machines each with its own device; everything else is the job as it runs:
the sandbox's preparation, the gradient scheduler on the job's worker, every round's search (featurization, the
cost model) on the worker that claimed it, trials written to the database on loopback. For each N: a fresh
database (PostgreSQL, a throwaway server of `bench.queue`'s, or `--backend sqlite`), N workers started and
registered, one model job of `--model` (a torchvision model exported here) with a budget larger than the window
needs; from its first round's trial, `--seconds` of trials are counted, then the job is cancelled. Reports
measurements/s and the efficiency against linear (`rate(N) / (N x rate(1))`).

Real (`--measurer local`): every worker builds and times on this machine's cores; each N runs the job to its end
(`--budget`) and reports the seconds from its claim to its end, the final build included.

The search's own CPU time is real in both: on a 2-core machine, N workers' rounds share two cores, which bounds
the simulated rate once the search's CPU per round times N exceeds the device time per round times 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
from sqlalchemy import create_engine, func, select, text, update

from bench.corpus_models import export
from bench.queue import throwaway_postgres
from compiler.target import target_key
from service.db import session_scope, upgrade
from service.models import Job, TaskRound, TrialRow, WorkerRow

ROOT = Path(__file__).resolve().parents[1]


def model_file(name: str, folder: Path) -> tuple[Path, list[list[int]]]:
    """The model exported (`bench.corpus_models.export`) and saved as a .pt2: the path and its input shapes."""
    ep = export(name)
    path = folder / f"{name}.pt2"
    torch.export.save(ep, path)
    shapes = [list(a.shape) for a in ep.example_inputs[0]]
    return path, shapes


def database(backend: str, server: str | None, name: str, folder: Path) -> str:
    """A fresh, migrated database for one run."""
    if backend == "sqlite":
        url = f"sqlite:///{folder / (name + '.db')}"
    else:
        engine = create_engine(server, isolation_level="AUTOCOMMIT")
        with engine.connect() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {name}"))
            c.execute(text(f"CREATE DATABASE {name}"))
        engine.dispose()
        url = server.rsplit("/", 1)[0] + f"/{name}"
    upgrade(url)
    return url


@contextlib.contextmanager
def workers(url: str, n: int, folder: Path, env: dict[str, str]) -> Iterator[list[subprocess.Popen]]:
    """`n` worker processes on `url`, each in a session of its own; stopped (SIGTERM, then SIGKILL) on the way out."""
    procs = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("ALTUNE_") or k == "ALTUNE_HOST_CPU"}
    base |= {"PYTHONPATH": str(ROOT), "ALTUNE_DATABASE_URL": url, "ALTUNE_DATA_DIR": str(folder),
             "ALTUNE_POLL_SECONDS": "0.2", "ALTUNE_TIME_TORCH_COMPILE": "0", "ALTUNE_ANYTIME_ARTIFACT": "0"} | env
    try:
        for i in range(n):
            with open(folder / f"worker-{i}.log", "ab") as log:
                procs.append(subprocess.Popen([sys.executable, "-m", "service.cli", "worker"], env=base, cwd=ROOT,
                                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def wait(what: str, done, timeout: float, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a worker exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def add_job(url: str, path: Path, shapes: list[list[int]], budget: int) -> int:
    """A queued model job of the saved program, as the API writes one (blocked layouts, no fusion, the host)."""
    spec = {"kind": "model", "name": path.stem, "model_file": str(path), "input_shapes": shapes, "target": "host",
            "layout": "blocked", "fusion": "none", "budget": budget, "seed": 0}
    with session_scope(url) as s:
        job = Job(kind="model", name=path.stem, spec=spec, target="host", budget=budget)
        s.add(job)
        s.flush()
        return job.id


def round_trials(url: str, job_id: int) -> list:
    """created_at of the job's trials made by rounds (the joint stage has none with blocked layouts), in order."""
    with session_scope(url) as s:
        return list(s.scalars(select(TrialRow.created_at).where(TrialRow.job_id == job_id)
                              .order_by(TrialRow.created_at)))


def simulated_run(url: str, n: int, path: Path, shapes: list[list[int]], args: argparse.Namespace,
                  folder: Path) -> dict:
    env = {"ALTUNE_MEASURER": "simulated", "ALTUNE_SIMULATED_DELAY_SECONDS": str(args.delay)}
    with workers(url, n, folder, env) as procs:
        def registered() -> bool:
            with session_scope(url) as s:
                return (s.scalar(select(func.count()).select_from(WorkerRow)) or 0) >= n

        wait(f"{n} workers to register", registered, 600, procs)
        job_id = add_job(url, path, shapes, budget=100_000)
        wait("the first round's trial", lambda: bool(round_trials(url, job_id)), 900, procs)
        t0 = round_trials(url, job_id)[0]
        time.sleep(args.seconds + 1.0)  # the trials of the window's last half second are written by then
        with session_scope(url) as s:
            s.execute(update(Job).where(Job.id == job_id).values(cancel_requested=True))
        in_window = [t for t in round_trials(url, job_id) if t <= t0 + timedelta(seconds=args.seconds)]
        with session_scope(url) as s:
            rounds = s.execute(select(TaskRound.worker_id, TaskRound.status).where(TaskRound.job_id == job_id)).all()
        wait("the job to stop", lambda: _status(url, job_id) not in ("queued", "running"), 300, procs)
    rate = len(in_window) / args.seconds
    return {"workers": n, "measurements": len(in_window), "seconds": args.seconds, "per_second": round(rate, 3),
            "rounds": len(rounds), "workers_with_rounds": len({w for w, _ in rounds if w})}


def real_run(url: str, n: int, path: Path, shapes: list[list[int]], args: argparse.Namespace, folder: Path) -> dict:
    with workers(url, n, folder, {}) as procs:
        def registered() -> bool:
            with session_scope(url) as s:
                return (s.scalar(select(func.count()).select_from(WorkerRow)) or 0) >= n

        wait(f"{n} workers to register", registered, 600, procs)
        job_id = add_job(url, path, shapes, budget=args.budget)
        wait("the job to end", lambda: _status(url, job_id) not in ("queued", "running"), 7200, procs)
    with session_scope(url) as s:
        job = s.get(Job, job_id)
        seconds = (job.finished_at - job.started_at).total_seconds()
        rounds = s.execute(select(TaskRound.worker_id).where(TaskRound.job_id == job_id)).scalars().all()
        return {"workers": n, "status": job.status, "seconds": round(seconds, 1), "trials": job.trials_done,
                "latency_ms": job.best_latency_ms, "rounds": len(rounds), "workers_with_rounds": len(set(rounds))}


def _status(url: str, job_id: int) -> str:
    with session_scope(url) as s:
        return s.get(Job, job_id).status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--model", default="resnet50", help="a model of bench.corpus_models")
    p.add_argument("--measurer", choices=["simulated", "local"], default="simulated")
    p.add_argument("--delay", type=float, default=4.0, help="simulated: seconds per measurement")
    p.add_argument("--seconds", type=float, default=120.0, help="simulated: the window counted")
    p.add_argument("--budget", type=int, default=96, help="local: the job's budget")
    p.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="altune-scaling-") as tmp:
        folder = Path(tmp)
        path, shapes = model_file(args.model, folder)
        with contextlib.ExitStack() as stack:
            server = None if args.backend == "sqlite" else stack.enter_context(
                throwaway_postgres(max(n for n in args.workers) * 4 + 50))
            for n in args.workers:
                url = database(args.backend, server, f"scaling_{n}", folder)
                run = simulated_run if args.measurer == "simulated" else real_run
                row = run(url, n, path, shapes, args, folder)
                if args.measurer == "simulated":
                    base = rows[0]["per_second"] / rows[0]["workers"] if rows else row["per_second"] / n
                    row["efficiency"] = round(row["per_second"] / (n * base), 3) if base else None
                rows.append(row)
                print(json.dumps(row), flush=True)
    report = {"cpu": target_key("host"), "model": args.model, "measurer": args.measurer, "backend": args.backend,
              "delay_s": args.delay if args.measurer == "simulated" else None, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{args.model}, {args.measurer} measurer, {args.backend}, {report['cpu']}")
    for r in rows:
        print("  " + "  ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
