"""Jobs: rows as the API or a worker writes them, read back; a model uploaded over the API; polling a job until it
ends."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from sqlalchemy import select, update

from service.db import session_scope, utcnow
from service.models import Job, TrialRow

FINISHED = ("succeeded", "failed", "cancelled")
# a 16^3 dense: a search of a few seconds (12 trials), as a worker reads a job's spec (every field filled)
DENSE = {"kind": "operator", "operator": "dense", "params": {"m": 16, "n": 16, "k": 16}, "dtype": "float32",
         "epilogue": "none", "target": "host", "budget": 12, "seed": 0}


def add_jobs(url: str, spec: dict, n: int = 1) -> list[int]:
    """`n` queued operator jobs of `spec`, as `POST /jobs` writes them: their ids."""
    with session_scope(url) as s:
        jobs = [Job(kind="operator", name=spec["operator"], spec=spec, target=spec["target"], budget=spec["budget"])
                for _ in range(n)]
        s.add_all(jobs)
        s.flush()
        return [j.id for j in jobs]


def add_job(url: str, spec: dict) -> int:
    """A queued operator job of `spec`: its id."""
    return add_jobs(url, spec)[0]


def add_model_job(url: str, path: Path, shapes: list[list[int]], budget: int = 2, **spec) -> int:
    """A queued model job of the program saved at `path` (blocked layouts, no fusion, the host): its id."""
    record = {"kind": "model", "name": path.stem, "model_file": str(path), "input_shapes": shapes, "target": "host",
              "layout": "blocked", "fusion": "none", "budget": budget, "seed": 0} | spec
    with session_scope(url) as s:
        job = Job(kind="model", name=path.stem, spec=record, target="host", budget=budget)
        s.add(job)
        s.flush()
        return job.id


def get_job(url: str, job_id: int) -> Job:
    with session_scope(url) as s:
        return Job.find_or_raise_by_id(s, job_id)


def job_finished(url: str, job_id: int) -> Callable[[], bool]:
    """A check for `wait_until`: the job is neither queued nor running."""
    return lambda: get_job(url, job_id).status not in ("queued", "running")


def trial_rows(url: str, job_id: int) -> list[tuple[int, int, float | None]]:
    """(row id, trial index, latency) of every trial row of the job, by row id."""
    with session_scope(url) as s:
        rows = s.execute(select(TrialRow.id, TrialRow.index, TrialRow.latency_ms)
                         .where(TrialRow.job_id == job_id).order_by(TrialRow.id)).all()
        return [tuple(r) for r in rows]


def finish_job(url: str, job_id: int, status: str = "succeeded") -> None:
    """What a worker writes when a job ends: its status, when, and a best latency."""
    with session_scope(url) as s:
        s.execute(update(Job).where(Job.id == job_id).values(status=status, finished_at=utcnow(), best_latency_ms=1.0))


class Client(Protocol):
    def get(self, url: str, **kwargs): ...

    def post(self, url: str, **kwargs): ...


def wait_for_job(client: Client, job_id: int, until: tuple[str, ...] = FINISHED, timeout: float = 300,
                 trials: int = 0) -> dict:
    """Polls `GET /api/v1/jobs/{job_id}` (an httpx or a test client) until the job is in one of `until` with at
    least `trials` trials done: the job."""
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(f"/api/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        job = r.json()
        if job["status"] in until and job["trials_done"] >= trials:
            return job
        assert time.monotonic() < deadline, f"job {job_id} not {until} with {trials} trials in {timeout} s: {job}"
        time.sleep(0.3)


def upload_model(client: Client, data: bytes, headers: dict | None = None, filename: str = "net.pt2", **spec):
    """`POST /api/v1/models` (an httpx or a test client) with the file and the spec's fields: the response."""
    return client.post("/api/v1/models", files={"file": (filename, data, "application/octet-stream")},
                       data={"spec": json.dumps(spec)}, headers=headers)
