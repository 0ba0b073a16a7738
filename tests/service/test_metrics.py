"""`/metrics`: Prometheus text computed from the rows at scrape time, on SQLite and PostgreSQL (the queue wait is
date arithmetic each backend spells its own way)."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from service.db import session_scope, utcnow
from service.models import Job, TrialRow, TuningTask

SPEC = {"kind": "operator", "operator": "dense", "params": {"m": 16, "n": 16, "k": 16}, "target": "host", "budget": 4}


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _rows(url: str) -> None:
    """Four jobs: queued (waited 100 s so far), running (waited 10 s, taken over once), succeeded (waited 2 s,
    three trials, one failed), failed (never started)."""
    now = utcnow()
    with session_scope(url) as s:
        def job(status: str, created: float, started: float | None, takeovers: int = 0) -> Job:
            row = Job(kind="operator", name="dense", spec=SPEC, target="host", budget=4, status=status,
                      created_at=now - timedelta(seconds=created), takeovers=takeovers,
                      started_at=now - timedelta(seconds=started) if started is not None else None)
            s.add(row)
            s.flush()
            return row

        job("queued", 100, None)
        job("running", 50, 40, takeovers=1)
        done = job("succeeded", 30, 28)
        job("failed", 20, None)
        task = TuningTask(job_id=done.id, index=0, name="dense", workload_key="k", budget=4)
        s.add(task)
        s.flush()
        for i, error in enumerate([None, "timeout", None]):
            s.add(TrialRow(job_id=done.id, task_id=task.id, index=i, config={}, error=error,
                           latency_ms=None if error else 1.0))


def test_metrics_come_from_the_database(client, settings):
    _rows(settings.resolved_database_url)
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = _samples(r.text)
    assert {state: m[("altune_jobs", (("state", state),))]
            for state in ("queued", "running", "succeeded", "failed", "cancelled")} == {
        "queued": 1, "running": 1, "succeeded": 1, "failed": 1, "cancelled": 0}
    assert m[("altune_trials_measured_total", ())] == 3
    assert m[("altune_measurement_errors_total", ())] == 1
    assert m[("altune_lease_takeovers_total", ())] == 1
    # waits of the two started jobs: 2 s and 10 s
    assert m[("altune_queue_wait_seconds_count", ())] == 2
    assert abs(m[("altune_queue_wait_seconds_sum", ())] - 12) < 0.5
    buckets = {dict(k[1])["le"]: v for k, v in m.items() if k[0] == "altune_queue_wait_seconds_bucket"}
    assert (buckets["1.0"], buckets["5.0"], buckets["15.0"], buckets["+Inf"]) == (0, 1, 2, 2)
    assert 99 <= m[("altune_oldest_queued_seconds", ())] < 130


def test_metrics_need_a_read_token(sqlite_url, tmp_path):
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.settings import Settings

    settings = Settings(database_url=sqlite_url, data_dir=tmp_path)
    with TestClient(create_app(settings)) as app:
        assert app.get("/metrics").status_code == 401
    with TestClient(create_app(settings.model_copy(update={"anonymous": "read"}))) as app:
        assert app.get("/metrics").status_code == 200
