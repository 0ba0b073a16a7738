"""Per-token quotas: 429 naming the limit and when it frees (queued jobs, trials and upload bytes per UTC day),
and the running limit the workers keep. The database logic runs on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select
from support.auth import bearer

from service.db import session_scope, utcnow
from service.models import Job, Token, Usage

DENSE = {"kind": "operator", "operator": "dense", "params": {"m": 16, "n": 16, "k": 16}, "target": "host",
         "budget": 40}


def _jobs_of(url: str, name: str) -> int:
    with session_scope(url) as s:
        owner = s.scalar(select(Token.id).where(Token.name == name))
        return s.scalar(select(func.count()).select_from(Job).where(Job.owner_id == owner))


def test_queued_jobs_over_the_limit_are_429_and_not_written(app, settings, make_token):
    url = settings.resolved_database_url
    token = make_token(url, "write", "busy", max_queued=2)
    for _ in range(2):
        assert app.post("/api/v1/jobs", json=DENSE, headers=bearer(token)).status_code == 201
    r = app.post("/api/v1/jobs", json=DENSE, headers=bearer(token))
    assert r.status_code == 429
    assert "max_queued" in r.json()["detail"] and "2 jobs queued" in r.json()["detail"]
    assert int(r.headers["retry-after"]) > 0
    assert _jobs_of(url, "busy") == 2, "the refused job was rolled back"
    # another token has its own allowance; a queued job that is cancelled frees a place
    assert app.post("/api/v1/jobs", json=DENSE, headers=bearer(make_token(url, "write", "idle"))).status_code == 201
    first = app.get("/api/v1/jobs", headers=bearer(token)).json()["data"][-1]["id"]
    assert app.post(f"/api/v1/jobs/{first}/cancel", headers=bearer(token)).status_code == 200
    assert app.post("/api/v1/jobs", json=DENSE, headers=bearer(token)).status_code == 201


def test_trials_per_day_over_the_limit_are_429_until_the_utc_day_ends(app, settings, make_token):
    url = settings.resolved_database_url
    token = make_token(url, "write", "daily", max_trials_per_day=100)
    assert app.post("/api/v1/jobs", json=DENSE, headers=bearer(token)).status_code == 201
    assert app.post("/api/v1/jobs", json=DENSE, headers=bearer(token)).status_code == 201
    r = app.post("/api/v1/jobs", json=DENSE, headers=bearer(token))
    assert r.status_code == 429
    detail = r.json()["detail"]
    tomorrow = (utcnow() + timedelta(days=1)).date().isoformat()
    assert "max_trials_per_day" in detail and "100 trials" in detail and f"resets at {tomorrow}T00:00:00Z" in detail
    assert 0 < int(r.headers["retry-after"]) <= 86_401
    # yesterday's submissions do not count (the ledger's rows, whatever became of the jobs)
    with session_scope(url) as s:
        for usage in s.scalars(select(Usage)):
            usage.created_at -= timedelta(days=1)
    assert app.post("/api/v1/jobs", json=DENSE, headers=bearer(token)).status_code == 201


def test_defaults_come_from_settings_and_apply_to_anonymous_requests(settings):
    from fastapi.testclient import TestClient

    from service.api import create_app

    tight = settings.model_copy(update={"anonymous": "all", "token_max_queued": 1})
    with TestClient(create_app(tight)) as app:
        assert app.post("/api/v1/jobs", json=DENSE).status_code == 201
        r = app.post("/api/v1/jobs", json=DENSE)
        assert r.status_code == 429 and "anonymous requests may have 1 jobs queued" in r.json()["detail"]


def test_upload_over_the_daily_bytes_is_429_before_it_is_read(sqlite_url, tmp_path, make_token):
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.settings import Settings

    settings = Settings(database_url=sqlite_url, data_dir=tmp_path)
    token = make_token(sqlite_url, "write", "uploader", max_upload_bytes_per_day=1000)
    with TestClient(create_app(settings)) as app:
        r = app.post("/api/v1/models", files={"file": ("m.pt2", bytes(5000))}, data={"spec": "{}"},
                     headers=bearer(token))
    assert r.status_code == 429 and "max_upload_bytes_per_day" in r.json()["detail"], r.text
    assert "retry-after" in r.headers
    assert not (settings.resolved_artifact_dir / "models").exists() or not any(
        (settings.resolved_artifact_dir / "models").iterdir()), "nothing of the refused upload on disk"


def test_workers_leave_jobs_over_the_running_limit_queued(settings, make_token):
    from service.worker import Worker

    url = settings.resolved_database_url
    make_token(url, "write", "one-at-a-time", max_running=1)
    make_token(url, "write", "other")
    with session_scope(url) as s:
        limited, other = (s.scalar(select(Token.id).where(Token.name == n)) for n in ("one-at-a-time", "other"))
        ids = []
        for owner in (limited, limited, other, None):
            job = Job(kind="operator", name="dense", spec=DENSE, target="host", budget=4, owner_id=owner)
            s.add(job)
            s.flush()
            ids.append(job.id)
    worker = Worker(settings, "w")
    assert worker.claim() == ids[0]
    assert worker.claim() == ids[2], "the limited token's second job waits while its first runs"
    assert worker.claim() == ids[3], "anonymous jobs have no running limit"
    assert worker.claim() is None
    with session_scope(url) as s:
        s.get(Job, ids[0]).status = "succeeded"
    assert worker.claim() == ids[1]
    with session_scope(url) as s:
        s.get(Job, ids[1]).lease_expires_at = utcnow() - timedelta(seconds=1)  # its worker died
    assert Worker(settings, "heir").claim() == ids[1], "a takeover is not a new start"
    with session_scope(url) as s:
        assert s.get(Job, ids[1]).takeovers == 1 and s.get(Job, ids[0]).takeovers == 0
