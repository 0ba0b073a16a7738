"""The queue under many workers: W simulated workers claiming jobs from one database, bounded in time.

    python -m bench.queue [--workers 500] [--seconds 30] [--work-ms 500 1500] [--without-index] [--json PATH]
    python -m bench.queue --backend sqlite --workers 16 --seconds 10

Starts a throwaway PostgreSQL server of its own (initdb in a temporary folder, `max_connections` sized for the
workers; `--url` uses an existing, empty database instead), migrates it (`service.db.upgrade`), enqueues
operator jobs as the API writes them (`Job` rows, queued, anonymous; they are never run) and, for `--seconds`,
runs `--workers` simulated workers in `--processes` processes (threads are GIL-bound: 50 threads a process).
Each is a real `service.worker.Worker` with a database URL of its own (its own engine and pool, so every worker
has its own connection, as a worker process does; on PostgreSQL the URL differs only in `application_name`).
Each worker in turn: `claim()` (timed: the claim latency), holds the job for a random time drawn from
`--work-ms`, then finishes it with a conditional UPDATE as `JobRun.finish` does; an empty claim waits `--idle-ms`.

Reports claims/s, the claim latency (p50, p99, max), empty claims, exceptions by type, and checks in the database
afterwards that no job was claimed twice (every claimed job has `attempts == 1`, no id was claimed by two
workers) and that every claimed job is finished. `--history N` puts N finished jobs ahead of the queued ones (a
database that has run for a while); `--without-index` drops the partial index of the claimable jobs that migration
0008 creates (the one this benchmark recommended): the claim as it was; EXPLAIN ANALYZE of the claim's SELECT is
kept before and after the run.

`tests/bench/test_queue_bench.py` is the test-suite form (8 workers, 3 seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pwd
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

from sqlalchemy import create_engine, func, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from bench.environment import environment
from bench.load import free_port, percentile
from service.db import get_engine, session_scope, upgrade, utcnow
from service.models import Job
from service.settings import Settings
from service.worker import Worker, _claimable, _owner_may_start

THREADS_PER_PROCESS = 50
SPEC = {"kind": "operator", "operator": "dense", "params": {"m": 64, "n": 64, "k": 64}, "dtype": "float32",
        "target": "host", "budget": 10}
# the index this benchmark recommended, which migration 0008 creates: the claim's scan in id order over the queued
# and running jobs only, not over every finished job ahead of them (a partial index: finished jobs never enter it);
# `--without-index` drops it to measure the claim as it was
DROP_CLAIM_INDEX = "DROP INDEX IF EXISTS ix_jobs_claimable"


@dataclass(frozen=True)
class Plan:
    """One run: where, how many workers, for how long, how long a job is held."""

    url: str
    workers: int
    processes: int
    seconds: float
    work_ms: tuple[float, float]
    idle_ms: float = 100.0
    in_step: bool = False  # every worker's first claim at the same instant


@dataclass
class Tally:
    """What the workers of one process saw."""

    claim_ms: list[float] = field(default_factory=list)  # every claim() that returned, a job or None
    claimed: dict[str, list[int]] = field(default_factory=dict)  # worker id -> the job ids it claimed
    empty: int = 0
    lost_finishes: int = 0  # a finish that matched no row: the job was no longer this worker's
    errors: Counter[str] = field(default_factory=Counter)
    samples: dict[str, str] = field(default_factory=dict)  # error kind -> one message
    cpu_s: float = 0.0  # the process' CPU time during the run's window


def error_kind(e: BaseException) -> str:
    """`StorageError/OperationalError/DeadlockDetected`: the exception, its SQLAlchemy cause, the driver's error."""
    names = [type(e).__name__]
    cause = e.__cause__
    if cause is not None:
        names.append(type(cause).__name__)
        orig = getattr(cause, "orig", None)
        if orig is not None:
            names.append(type(orig).__name__)
    return "/".join(names)


def worker_url(url: str, index: int) -> str:
    """The database URL of worker `index`: the same database, a string of its own, so `service.db`'s per-URL
    cache gives the worker an engine and a pool of its own (one connection each, as a worker process has)."""
    if url.startswith("sqlite"):
        return url  # one worker per process on SQLite (`run`): the process' engine is its own
    return make_url(url).update_query_dict({"application_name": f"altune-bench-{index}"}).render_as_string(
        hide_password=False)


def finish(url: str, worker_id: str, job_id: int) -> bool:
    """Mark the job succeeded if this worker still owns it (`JobRun.finish`'s conditional UPDATE)."""
    with session_scope(url) as s:
        return s.execute(
            update(Job)
            .where(Job.id == job_id, Job.worker_id == worker_id, Job.status == "running")
            .values(status="succeeded", finished_at=utcnow(), lease_expires_at=None)
        ).rowcount == 1


def _note(tally: Tally, lock: threading.Lock, e: BaseException) -> None:
    kind = error_kind(e)
    with lock:
        tally.errors[kind] += 1
        tally.samples.setdefault(kind, "".join(traceback.format_exception_only(e)).strip()[:500])


def _work(plan: Plan, index: int, start_at: float, tally: Tally, lock: threading.Lock) -> None:
    """One simulated worker: claim, hold, finish, until the time is up; the job it holds when it is, it finishes."""
    url = worker_url(plan.url, index)
    worker = Worker(Settings(database_url=url), worker_id=f"bench-{index}")
    rng = random.Random(index)
    claimed: list[int] = []
    with lock:
        tally.claimed[worker.worker_id] = claimed
    try:  # connect before the clock starts: a worker is long-lived, its connection is made once
        with session_scope(url) as s:
            s.execute(text("SELECT 1"))
    except Exception as e:
        _note(tally, lock, e)
    # a fleet's workers are not in step: each starts within the first job's time, not all in the same instant
    # (`--in-step` does that: 500 claims at once, a thundering herd on the first rows)
    offset = 0.0 if plan.in_step else rng.uniform(0, plan.work_ms[1] / 1000)
    time.sleep(max(0.0, start_at + offset - time.time()))
    deadline = start_at + plan.seconds
    while time.time() < deadline:
        t0 = time.perf_counter()
        try:
            job_id = worker.claim()
        except Exception as e:
            _note(tally, lock, e)
            time.sleep(plan.idle_ms / 1000)
            continue
        ms = (time.perf_counter() - t0) * 1000
        with lock:
            tally.claim_ms.append(ms)
            tally.empty += job_id is None
        if job_id is None:
            time.sleep(plan.idle_ms / 1000)
            continue
        claimed.append(job_id)
        time.sleep(rng.uniform(*plan.work_ms) / 1000)
        try:
            if not finish(url, worker.worker_id, job_id):
                with lock:
                    tally.lost_finishes += 1
        except Exception as e:
            _note(tally, lock, e)


def _process(plan: Plan, first: int, count: int, start_at: float) -> Tally:
    """Workers `first` .. `first + count - 1`, one thread each, in this (forked) process."""
    get_engine.cache_clear()  # nothing of the parent's pools in a child (the parent opens none before forking)
    tally, lock = Tally(), threading.Lock()
    threads = [threading.Thread(target=_work, args=(plan, i, start_at, tally, lock), daemon=True)
               for i in range(first, first + count)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu = time.process_time()
    time.sleep(max(0.0, start_at + plan.seconds - time.time()))
    tally.cpu_s = time.process_time() - cpu
    for t in threads:
        t.join()
    return tally


def busy_seconds() -> float:
    """The machine's CPU time so far, every core's (from /proc/stat; NaN where there is none)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return math.nan
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _sample_machine(start_at: float, seconds: float, out: list[float]) -> None:
    time.sleep(max(0.0, start_at - time.time()))
    before = busy_seconds()
    time.sleep(max(0.0, start_at + seconds - time.time()))
    out.append(busy_seconds() - before)


STATEMENTS = """SELECT calls, round(mean_exec_time::numeric, 3) AS mean_ms, round(max_exec_time::numeric, 1) AS max_ms,
       round(total_exec_time::numeric) AS total_ms, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) AS query
FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 8"""


def statements(url: str, reset: bool = False) -> list[dict] | None:
    """The server's own time per statement (pg_stat_statements, where the server preloads it); `reset`: start
    counting now. None where it is not there."""
    if url.startswith("sqlite"):
        return None
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if reset:
                conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
                conn.execute(text("SELECT pg_stat_statements_reset()"))
                return []
            return [dict(r._mapping) | {"mean_ms": float(r.mean_ms), "max_ms": float(r.max_ms),
                                        "total_ms": float(r.total_ms)} for r in conn.execute(text(STATEMENTS))]
    except Exception:  # an existing server (--url) without pg_stat_statements preloaded
        return None
    finally:
        engine.dispose()


def enqueue(url: str, jobs: int, history: int) -> None:
    """`history` finished jobs (a database that has run for a while), then `jobs` queued ones, as the API writes
    them (anonymous: `owner_id` None, so the per-owner running limit does not apply)."""
    engine = create_engine(url)
    try:
        with Session(engine) as s, s.begin():
            for start, count, status in ((0, history, "succeeded"), (history, jobs, "queued")):
                for lo in range(start, start + count, 5000):
                    s.add_all([
                        Job(kind="operator", name="dense", spec=SPEC, target="host", budget=SPEC["budget"],
                            status=status, attempts=int(status != "queued"),
                            finished_at=utcnow() if status != "queued" else None)
                        for _ in range(min(5000, start + count - lo))
                    ])
                    s.flush()
                    s.expunge_all()
    finally:
        engine.dispose()


def explain_claim(url: str) -> str | None:
    """EXPLAIN ANALYZE of the claim's SELECT (`Worker.claim`'s, rebuilt from the same conditions) on PostgreSQL,
    in a transaction rolled back; None on SQLite."""
    if url.startswith("sqlite"):
        return None
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            now = conn.scalar(text("SELECT (now() AT TIME ZONE 'UTC')::timestamp"))
            query = (select(Job.id).where(_claimable(now), _owner_may_start(now, Settings().token_max_running))
                     .order_by(Job.id).limit(1).with_for_update(skip_locked=True))
            compiled = query.compile(engine)
            rows = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS) {compiled}", compiled.params).all()
            conn.rollback()
            return "\n".join(r[0] for r in rows)
    finally:
        engine.dispose()


def check(url: str, tally: Tally) -> dict[str, int]:
    """What the database says after the run: double claims, claimed jobs left unfinished."""
    seen: Counter[int] = Counter(i for ids in tally.claimed.values() for i in set(ids))
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = {r.id: r for r in conn.execute(
                select(Job.id, Job.attempts, Job.status, Job.worker_id).where(Job.worker_id.is_not(None)))}
            left = conn.scalar(select(func.count()).where(Job.status == "queued"))
    finally:
        engine.dispose()
    return {
        "claimed_jobs": len(seen),
        "ids_claimed_by_two_workers": sum(1 for n in seen.values() if n > 1),
        "ids_claimed_twice_by_one_worker": sum(len(ids) - len(set(ids)) for ids in tally.claimed.values()),
        "attempts_over_1": sum(1 for r in rows.values() if r.attempts > 1),
        "claimed_in_db_not_by_a_worker": sum(1 for i in rows if i not in seen),
        "claimed_not_finished": sum(1 for i in seen if i not in rows or rows[i].status != "succeeded"),
        "left_queued": left,
    }


def run(plan: Plan, jobs: int, history: int = 0, with_index: bool = True) -> dict:
    """Enqueue, run the workers, check the database; the report (one run) as a dict.

    The database must be migrated and have no jobs yet.
    """
    engine = create_engine(plan.url)
    with engine.begin() as conn:
        assert conn.scalar(select(func.count()).select_from(Job)) == 0, f"{plan.url} already has jobs"
        if not with_index:
            conn.execute(text(DROP_CLAIM_INDEX))
    engine.dispose()
    enqueue(plan.url, jobs, history)
    if not plan.url.startswith("sqlite"):
        e = create_engine(plan.url, isolation_level="AUTOCOMMIT")
        with e.connect() as conn:
            conn.execute(text("VACUUM ANALYZE jobs"))
        e.dispose()
    before = explain_claim(plan.url)
    per = math.ceil(plan.workers / plan.processes)
    slices = [(first, min(per, plan.workers - first)) for first in range(0, plan.workers, per)]
    # forked children share the parent's imports (torch and TVM through service.worker); the parent holds no
    # connection at the fork. Every worker starts at once, a few seconds after the last process is up.
    counting = statements(plan.url, reset=True) is not None
    start_at = time.time() + 3 + plan.workers / 100
    machine: list[float] = []
    sampler = threading.Thread(target=_sample_machine, args=(start_at, plan.seconds, machine), daemon=True)
    sampler.start()
    with ProcessPoolExecutor(len(slices), mp_context=get_context("fork")) as pool:
        tallies = list(pool.map(_process, [plan] * len(slices), *zip(*slices), [start_at] * len(slices)))
    tally = Tally()
    for t in tallies:
        tally.claim_ms += t.claim_ms
        tally.claimed.update(t.claimed)
        tally.empty += t.empty
        tally.lost_finishes += t.lost_finishes
        tally.errors += t.errors
        tally.samples = t.samples | tally.samples
        tally.cpu_s += t.cpu_s
    sampler.join()
    claims = sum(len(ids) for ids in tally.claimed.values())
    ms = tally.claim_ms
    return {
        "backend": make_url(plan.url).get_backend_name(),
        **{k: v for k, v in asdict(plan).items() if k != "url"},
        "jobs": jobs, "history": history, "with_index": with_index,
        "claims": claims, "claims_per_s": round(claims / plan.seconds, 1),
        "claim_calls": len(ms), "empty_claims": tally.empty,
        "claim_ms": {"p50": round(percentile(ms, 0.5), 2), "p99": round(percentile(ms, 0.99), 2),
                     "max": round(max(ms, default=math.nan), 2),
                     "mean": round(sum(ms) / len(ms), 2) if ms else math.nan},
        "errors": dict(tally.errors), "error_samples": tally.samples, "lost_finishes": tally.lost_finishes,
        "check": check(plan.url, tally),
        # cores busy on average during the window: the workers' processes, the whole machine (the database
        # server, the workers, anything else running)
        "cores_busy": {"workers": round(tally.cpu_s / plan.seconds, 2),
                       "machine": round(machine[0] / plan.seconds, 2) if machine else None, "of": os.cpu_count()},
        "statements": statements(plan.url) if counting else None,
        "explain_before": before, "explain_after": explain_claim(plan.url),
    }


# -- a PostgreSQL server of the benchmark's own ----------------------------------------------------------------


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)
    if found is None:
        raise SystemExit(f"{name} not found: install PostgreSQL's server or pass --url")
    return str(found)


@contextlib.contextmanager
def throwaway_postgres(max_connections: int) -> Iterator[str]:
    """A PostgreSQL server in a temporary folder on a free loopback port, removed afterwards; its URL.

    As root, the server runs as the `postgres` user (PostgreSQL refuses root).
    """
    folder = Path(tempfile.mkdtemp(prefix="altune-bench-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", free_port()
    options = (f"-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={folder} "
               f"-c max_connections={max_connections} -c shared_preload_libraries=pg_stat_statements")
    try:
        subprocess.run([*as_user, _pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                        "--no-sync", "-E", "UTF8"], check=True, capture_output=True)
        subprocess.run([*as_user, _pg_bin("pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w", "-o",
                        options, "start"], check=True, capture_output=True)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, _pg_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def server_version(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.scalar(text("SELECT version()" if not url.startswith("sqlite") else "SELECT sqlite_version()"))
    finally:
        engine.dispose()


def summary(report: dict) -> str:
    c, ms = report["check"], report["claim_ms"]
    return (f"{report['backend']} W={report['workers']} ({report['processes']} processes) {report['seconds']:g} s, "
            f"work {report['work_ms'][0]:g}-{report['work_ms'][1]:g} ms, history {report['history']}, "
            f"index {report['with_index']}, in step {report['in_step']}: {report['claims']} claims, {report['claims_per_s']} claims/s; "
            f"claim ms p50 {ms['p50']} p99 {ms['p99']} max {ms['max']}; empty {report['empty_claims']}; "
            f"errors {report['errors'] or 0}; lost finishes {report['lost_finishes']}; "
            f"double claims {c['ids_claimed_by_two_workers'] + c['attempts_over_1']}; "
            f"claimed not finished {c['claimed_not_finished']}; left queued {c['left_queued']}; cores busy: "
            f"workers {report['cores_busy']['workers']}, machine {report['cores_busy']['machine']} "
            f"of {report['cores_busy']['of']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.queue", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    p.add_argument("--url", help="an existing, empty database (default: a throwaway server, or SQLite file)")
    p.add_argument("--workers", type=int, default=500)
    p.add_argument("--processes", type=int, help=f"default: workers / {THREADS_PER_PROCESS} (SQLite: one per worker)")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--work-ms", type=float, nargs=2, default=(500.0, 1500.0), metavar=("MIN", "MAX"),
                   help="how long a worker holds a job, uniform in [MIN, MAX]")
    p.add_argument("--idle-ms", type=float, default=100.0, help="the wait after an empty claim")
    p.add_argument("--in-step", action="store_true", help="every worker's first claim at the same instant")
    p.add_argument("--jobs", type=int, help="queued jobs (default: more than the workers can claim in --seconds)")
    p.add_argument("--history", type=int, default=0, help="finished jobs ahead of the queued ones")
    p.add_argument("--without-index", action="store_true", help=f"first: {DROP_CLAIM_INDEX} (the claim before it)")
    p.add_argument("--json", type=Path, help="append the run to this JSON file's runs")
    args = p.parse_args(argv)

    sqlite = args.backend == "sqlite" or (args.url or "").startswith("sqlite")
    processes = args.processes or (args.workers if sqlite else math.ceil(args.workers / THREADS_PER_PROCESS))
    if sqlite and processes != args.workers:
        p.error("SQLite: one worker per process (--processes = --workers): a process' engine is per URL")
    mean_s = sum(args.work_ms) / 2000
    jobs = args.jobs or math.ceil(args.workers / max(mean_s, 0.01) * args.seconds * 1.5) + args.workers
    with contextlib.ExitStack() as stack:
        if args.url:
            url = args.url
        elif sqlite:
            url = f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory())}/altune.db"
        else:
            url = stack.enter_context(throwaway_postgres(max_connections=args.workers + 100))
        upgrade(url)
        plan = Plan(url=url, workers=args.workers, processes=processes, seconds=args.seconds,
                    work_ms=tuple(args.work_ms), idle_ms=args.idle_ms,
                    in_step=args.in_step)
        report = run(plan, jobs, args.history, not args.without_index)
        report["server"] = server_version(url)
    report["command"] = "python -m bench.queue " + " ".join(argv if argv is not None else sys.argv[1:])
    report["environment"] = environment()
    print(summary(report))
    for kind, message in report["error_samples"].items():
        print(f"  {kind}: {message}")
    for row in report["statements"] or []:
        print(f"  {row['calls']:>7} calls {row['mean_ms']:>8} ms mean {row['max_ms']:>8} ms max  {row['query']}")
    if report["explain_after"]:
        print("EXPLAIN ANALYZE of the claim after the run:\n" + report["explain_after"])
    if args.json:
        doc = json.loads(args.json.read_text()) if args.json.exists() else {"bench": "queue", "runs": []}
        doc["runs"].append(report)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    c = report["check"]
    ok = c["ids_claimed_by_two_workers"] == c["ids_claimed_twice_by_one_worker"] == c["attempts_over_1"] == 0
    return 0 if ok and c["claimed_not_finished"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
