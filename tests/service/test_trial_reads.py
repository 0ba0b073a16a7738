"""A job's trials as the dashboard reads them (`service.trial_reads` through the API): the chart downsampled in the
database against the same figures computed here in Python, and paging by cursor that returns every trial once.

The rows: two jobs written in turns (their trial ids interleave, as with two workers), the first with three
tasks, a joint stage then loop-only trials, one trial in seven an error (some of them timeouts) and ties in
latency; on SQLite always and on PostgreSQL where it answers.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from sqlalchemy import insert

from service.db import session_scope, utcnow
from service.models import Job, TrialRow, TuningTask

TRIALS = 3000
TASKS = 3
SPEC = {"kind": "operator", "operator": "dense", "params": {"m": 16, "n": 16, "k": 16}, "dtype": "float32",
        "epilogue": "none", "target": "host", "budget": TRIALS, "seed": 0}


def _write(url: str) -> tuple[int, int, list[dict]]:
    """(the job's id, the other job's id, the job's trials as written, in id order)."""
    rng = random.Random(3)
    now = utcnow()
    with session_scope(url) as s:
        jobs = [Job(kind="operator", name="dense", spec=SPEC, target="host", budget=TRIALS, status="succeeded")
                for _ in range(2)]
        s.add_all(jobs)
        s.flush()
        tasks = [TuningTask(job_id=jobs[0].id, index=k, name="dense", workload_key=f"dense[{k}]", budget=TRIALS)
                 for k in range(TASKS)]
        tasks.append(TuningTask(job_id=jobs[1].id, index=0, name="dense", workload_key="dense[x]", budget=TRIALS))
        s.add_all(tasks)
        s.flush()
        job_id, other_id = jobs[0].id, jobs[1].id
        task_ids, other_task = [t.id for t in tasks[:TASKS]], tasks[TASKS].id
    counters = [0] * (TASKS + 1)
    for start in range(0, TRIALS, 500):
        rows = []
        for n in range(start, start + 500):
            for own in (True, False):
                if not own and n % 3:
                    continue  # the other job writes a third as often: uneven interleaving
                k = rng.randrange(TASKS) if own else TASKS
                error = n % 7 == 3
                latency = None if error else round(rng.uniform(0.5, 40) / (1 + n / 300), 2)  # rounded: ties
                rows.append({"job_id": job_id if own else other_id, "task_id": (task_ids + [other_task])[k],
                             "index": counters[k], "config": {"tile": n}, "latencies_ms": None if error else [latency],
                             "latency_ms": latency, "stage": "joint" if own and n < 700 else "loop", "extra": {},
                             "error": (("timeout: ran longer than 10 s" if n % 2 else "build failed") if error
                                       else None), "created_at": now + timedelta(milliseconds=n)})
                counters[k] += 1
        with session_scope(url) as s:
            s.execute(insert(TrialRow), rows)
    with session_scope(url) as s:
        written = [{"id": t.id, "task_id": t.task_id, "latency_ms": t.latency_ms, "stage": t.stage, "error": t.error}
                   for t in s.query(TrialRow).filter(TrialRow.job_id == job_id).order_by(TrialRow.id)]
    return job_id, other_id, written


@pytest.fixture
def written(settings):
    return _write(settings.resolved_database_url)


def _reference_points(trials: list[dict], bounds: list[tuple[int, int]]) -> list[dict]:
    """The chart's buckets computed here: for each (first, last) trial number, the figures of those trials."""
    out, best = [], None
    for first, last in bounds:
        chunk = trials[first - 1:last]
        measured = [t["latency_ms"] for t in chunk if t["latency_ms"] is not None]
        low = min(measured, default=None)
        if low is not None and (best is None or low < best):
            best = low
        out.append({"first": first, "last": last, "errors": len(chunk) - len(measured), "min_ms": low,
                    "max_ms": max(measured, default=None), "best_ms": best})
    return out


@pytest.mark.parametrize("points", [200, 1000, 5000])
def test_chart_buckets_match_the_trials_computed_in_python(client, written, points):
    job_id, _, trials = written
    chart = client.get(f"/api/v1/jobs/{job_id}/trials/chart", params={"points": points}).json()

    assert chart["count"] == len(trials) and chart["last_id"] == trials[-1]["id"]
    got = chart["points"]
    assert len(got) <= points
    # the buckets tile the trials: consecutive, from 1 to the last, none empty
    assert got[0]["first"] == 1 and got[-1]["last"] == len(trials)
    assert all(a["last"] + 1 == b["first"] for a, b in zip(got, got[1:]))
    assert all(p["first"] <= p["last"] for p in got)
    if trials[-1]["id"] - trials[0]["id"] < points:
        assert all(p["first"] == p["last"] for p in got), "a job with fewer trial ids than points: one trial a bucket"
    assert got == _reference_points(trials, [(p["first"], p["last"]) for p in got])
    assert got[-1]["best_ms"] == min(t["latency_ms"] for t in trials if t["latency_ms"] is not None)

    # each task's best-so-far steps: where (at bucket granularity) each task's best improved
    by_task: dict[int, list[tuple[int, float]]] = {}
    for p in got:
        for task_id in sorted({t["task_id"] for t in trials}):
            chunk = [t["latency_ms"] for t in trials[p["first"] - 1:p["last"]]
                     if t["task_id"] == task_id and t["latency_ms"] is not None]
            steps = by_task.setdefault(task_id, [])
            if chunk and (not steps or min(chunk) < steps[-1][1]):
                steps.append((p["last"], min(chunk)))
    expected = sorted((last, task_id, ms) for task_id, steps in by_task.items() for last, ms in steps)
    assert sorted((s["last"], s["task_id"], s["best_ms"]) for s in chart["task_best"]) == expected

    stages = [t["stage"] for t in trials]
    assert chart["stages"] == {"joint": stages.count("joint"), "loop": stages.count("loop")}
    assert chart["stage_boundary"] == stages.index("loop", stages.index("joint")) + 1
    assert chart["timeouts"] == sum(1 for t in trials if t["error"] and "timeout" in t["error"])
    best = {}
    for t in trials:
        if t["latency_ms"] is not None and (t["task_id"] not in best or t["latency_ms"] < best[t["task_id"]][0]):
            best[t["task_id"]] = (t["latency_ms"], t["id"])
    assert [(b["task_id"], b["id"]) for b in chart["best"]] == sorted((k, v[1]) for k, v in best.items())
    assert all(b["config"] == {"tile": b["config"]["tile"]} for b in chart["best"]), "whole trials, with configs"


def test_chart_of_a_job_of_one_task(client, written):
    _, other_id, _ = written
    chart = client.get(f"/api/v1/jobs/{other_id}/trials/chart", params={"points": 100}).json()
    assert chart["count"] == 1000 and len(chart["points"]) <= 100 and chart["stage_boundary"] is None
    improved = [p for i, p in enumerate(chart["points"])
                if p["best_ms"] is not None and (i == 0 or p["best_ms"] != chart["points"][i - 1]["best_ms"])]
    assert [(s["last"], s["best_ms"]) for s in chart["task_best"]] == [(p["last"], p["best_ms"]) for p in improved]
    assert len({s["task_id"] for s in chart["task_best"]}) == 1 and len(chart["best"]) == 1


def test_chart_of_a_job_without_trials(client, settings):
    with session_scope(settings.resolved_database_url) as s:
        job = Job(kind="operator", name="dense", spec=SPEC, target="host", budget=1)
        s.add(job)
        s.flush()
        job_id = job.id
    chart = client.get(f"/api/v1/jobs/{job_id}/trials/chart").json()
    assert chart == {"count": 0, "last_id": 0, "points": [], "task_best": [], "stage_boundary": None, "stages": {},
                     "timeouts": 0, "best": []}
    assert client.get("/api/v1/jobs/999999/trials/chart").json()["detail"] == "job 999999 not found"


def _expected(trials: list[dict], sort: str, order: str, status: str) -> list[int]:
    rows = [t for t in trials if status == "all" or (status == "ok") == (t["latency_ms"] is not None)]
    desc = order == "desc"
    if sort == "id":
        return [t["id"] for t in sorted(rows, key=lambda t: t["id"], reverse=desc)]
    measured = sorted((t for t in rows if t["latency_ms"] is not None), key=lambda t: (t["latency_ms"], t["id"]),
                      reverse=desc)
    errors = sorted((t for t in rows if t["latency_ms"] is None), key=lambda t: t["id"], reverse=desc)
    return [t["id"] for t in measured + errors]


@pytest.mark.parametrize(("sort", "order", "status", "limit"), [
    ("id", "asc", "all", 500), ("id", "desc", "all", 337), ("id", "asc", "error", 100), ("id", "desc", "ok", 1000),
    ("latency", "asc", "all", 250), ("latency", "desc", "all", 499), ("latency", "asc", "ok", 1000),
    ("latency", "desc", "error", 60),
])
def test_pages_return_every_trial_once_in_order(client, written, sort, order, status, limit):
    job_id, other_id, trials = written
    expected = _expected(trials, sort, order, status)
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": limit, "sort": sort, "order": order, "status": status} | ({"cursor": cursor} if cursor else {})
        r = client.get(f"/api/v1/jobs/{job_id}/trials", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["count"] == len(expected) and len(page["data"]) <= limit
        seen += [t["id"] for t in page["data"]]
        pages += 1
        cursor = page["next"]
        if cursor is None:
            break
        assert len(page["data"]) == limit, "only the last page is short"
    assert seen == expected, "every trial of the job exactly once, in the order asked, none of the other job's"
    assert pages == max(1, -(-len(expected) // limit))


def test_offset_paging_still_works_and_bad_cursors_are_422(client, written):
    job_id, _, trials = written
    first = client.get(f"/api/v1/jobs/{job_id}/trials", params={"limit": 5}).json()
    rest = client.get(f"/api/v1/jobs/{job_id}/trials", params={"limit": 5, "offset": 5}).json()
    assert [t["id"] for t in first["data"] + rest["data"]] == [t["id"] for t in trials[:10]]
    assert first["count"] == len(trials) and first["next"] == str(trials[4]["id"])
    for params, field in [({"cursor": "nope"}, "cursor"), ({"cursor": "1.5:x", "sort": "latency"}, "cursor"),
                          ({"cursor": "nan:3", "sort": "latency"}, "cursor"), ({"cursor": str(2**40)}, "cursor"),
                          ({"offset": 5, "sort": "latency"}, "offset"), ({"offset": 5, "cursor": "3"}, "offset"),
                          ({"limit": 1001}, "limit"), ({"sort": "stage"}, "sort")]:
        r = client.get(f"/api/v1/jobs/{job_id}/trials", params=params)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", field], (params, r.text)
