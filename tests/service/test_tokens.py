"""Tokens, on by default: scopes, revocation, where a token may travel, anonymous access, the first start.

In-process (TestClient) on SQLite: what is checked is the API's answer and the rows, not the backend.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
from sqlalchemy import select
from support.auth import bearer
from support.jobs import finish_job

from service.db import session_scope
from service.models import Job, Token

DENSE = {"kind": "operator", "operator": "dense", "params": {"m": 16, "n": 16, "k": 16}, "target": "host",
         "budget": 4}


@pytest.fixture
def auth_settings(sqlite_url, tmp_path):
    from service.settings import Settings

    return Settings(database_url=sqlite_url, data_dir=tmp_path)


@pytest.fixture
def app(auth_settings) -> Iterator:
    """A client without a token; each test sends what it means to."""
    from fastapi.testclient import TestClient

    from service.api import create_app

    with TestClient(create_app(auth_settings)) as c:
        yield c


def test_cli_prints_a_token_once_and_stores_only_its_hash(sqlite_url, capsys, monkeypatch):
    from service.cli import main

    monkeypatch.setenv("ALTUNE_DATABASE_URL", sqlite_url)
    main(["token", "create", "--scope", "write", "--name", "ci", "--max-queued", "3"])
    token = capsys.readouterr().out.strip()
    assert token.startswith("alt_") and len(token) > 40
    with session_scope(sqlite_url) as s:
        (row,) = s.scalars(select(Token)).all()
        assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
        assert token not in repr([getattr(row, c.key) for c in Token.__table__.columns])
        assert (row.name, row.scope, row.max_queued, row.max_running) == ("ci", "write", 3, None)

    main(["token", "create", "--scope", "read"])
    capsys.readouterr()
    main(["token", "list"])
    listing = capsys.readouterr().out
    assert "ci" in listing and "token-2" in listing and "queued=3" in listing and token not in listing
    main(["token", "revoke", "ci"])
    main(["token", "revoke", "2"])
    with session_scope(sqlite_url) as s:
        assert all(t.revoked_at is not None for t in s.scalars(select(Token)))
    with pytest.raises(SystemExit, match="no token with id or name 'nope'"):
        main(["token", "revoke", "nope"])
    with pytest.raises(SystemExit, match="exists already"):
        main(["token", "create", "--scope", "read", "--name", "ci"])


def test_no_token_is_401_saying_how_to_get_one(app):
    for method, path in [("GET", "/api/v1/jobs"), ("GET", "/api/v1/operators"), ("POST", "/api/v1/jobs")]:
        r = app.request(method, path, json=DENSE if method == "POST" else None)
        assert r.status_code == 401, (path, r.text)
        assert "altune token create" in r.json()["detail"] and r.headers["www-authenticate"] == "Bearer"
    assert "scope write" in app.post("/api/v1/jobs", json=DENSE).json()["detail"]
    # what carries no data stays open: health, the dashboard's page, the API's description
    assert app.get("/healthz").status_code == 200
    assert app.get("/").status_code == 200
    assert app.get("/openapi.json").status_code == 200


def test_scopes_nest_and_only_the_owner_or_an_admin_cancels(app, sqlite_url, make_token):
    read, alice, bob = (make_token(sqlite_url, s, n) for s, n in [("read", "r"), ("write", "alice"),
                                                                  ("write", "bob")])
    admin = make_token(sqlite_url, "admin", "root")
    assert app.get("/api/v1/jobs", headers=bearer(read)).status_code == 200
    r = app.post("/api/v1/jobs", json=DENSE, headers=bearer(read))
    assert r.status_code == 403 and "token 'r' has scope read" in r.json()["detail"]
    assert "altune token create --scope write" in r.json()["detail"]

    mine = app.post("/api/v1/jobs", json=DENSE, headers=bearer(alice)).json()
    with session_scope(sqlite_url) as s:
        owner = s.get(Job, mine["id"]).owner_id
        assert owner == s.scalar(select(Token.id).where(Token.name == "alice")) == mine["owner_id"]

    r = app.post(f"/api/v1/jobs/{mine['id']}/cancel", headers=bearer(bob))
    assert r.status_code == 403 and "only its owner or an admin" in r.json()["detail"]
    assert app.post(f"/api/v1/jobs/{mine['id']}/cancel", headers=bearer(read)).status_code == 403
    assert app.post(f"/api/v1/jobs/{mine['id']}/cancel", headers=bearer(alice)).json()["status"] == "cancelled"

    other = app.post("/api/v1/jobs", json=DENSE, headers=bearer(bob)).json()
    assert app.post(f"/api/v1/jobs/{other['id']}/cancel", headers=bearer(admin)).json()["status"] == "cancelled"


def test_delete_needs_the_owner_or_an_admin_and_a_finished_job(app, sqlite_url, make_token):
    alice, bob = make_token(sqlite_url, "write", "alice"), make_token(sqlite_url, "write", "bob")
    job_id = app.post("/api/v1/jobs", json=DENSE, headers=bearer(alice)).json()["id"]
    r = app.delete(f"/api/v1/jobs/{job_id}", headers=bearer(alice))
    assert r.status_code == 409 and "cancel it first" in r.json()["detail"]
    finish_job(sqlite_url, job_id)
    assert app.delete(f"/api/v1/jobs/{job_id}", headers=bearer(bob)).status_code == 403
    assert app.delete(f"/api/v1/jobs/{job_id}", headers=bearer(alice)).status_code == 204
    with session_scope(sqlite_url) as s:
        assert s.get(Job, job_id) is None
    assert app.get(f"/api/v1/jobs/{job_id}", headers=bearer(alice)).status_code == 404


def test_revoked_and_unknown_tokens_are_401(app, sqlite_url, make_token):
    from service.tokens import revoke_token

    token = make_token(sqlite_url, "admin", "soon-gone")
    assert app.get("/api/v1/jobs", headers=bearer(token)).status_code == 200
    with session_scope(sqlite_url) as s:
        revoke_token(s, "soon-gone")
    for headers in (bearer(token), bearer("alt_made-up")):
        r = app.get("/api/v1/jobs", headers=headers)
        assert r.status_code == 401 and "unknown or revoked" in r.json()["detail"]


def test_query_token_and_cookie_are_taken_on_get_only(app, sqlite_url, make_token):
    token = make_token(sqlite_url, "write", "browser")
    assert app.get("/api/v1/jobs", params={"token": token}).status_code == 200
    app.cookies.set("altune_token", token)
    assert app.get("/api/v1/jobs").status_code == 200
    # a cookie travels by itself with another site's form: it never authorizes a write
    assert app.post("/api/v1/jobs", json=DENSE).status_code == 401
    app.cookies.clear()
    r = app.post("/api/v1/jobs", json=DENSE, params={"token": token})
    assert r.status_code == 401 and "GET only" in r.json()["detail"]


def test_event_stream_takes_the_token_in_the_query(app, sqlite_url, make_token):
    token = make_token(sqlite_url, "write", "streamer")
    job_id = app.post("/api/v1/jobs", json=DENSE, headers=bearer(token)).json()["id"]
    finish_job(sqlite_url, job_id, "cancelled")  # a finished job's stream ends after its snapshot
    assert app.get(f"/api/v1/jobs/{job_id}/events").status_code == 401
    r = app.get(f"/api/v1/jobs/{job_id}/events", params={"token": token, "last_event_id": 0})
    assert r.status_code == 200 and "event: end" in r.text


@pytest.mark.parametrize("anonymous", ["read", "all"])
def test_anonymous_access_is_opened_explicitly(auth_settings, sqlite_url, anonymous):
    from fastapi.testclient import TestClient

    from service.api import create_app

    with TestClient(create_app(auth_settings.model_copy(update={"anonymous": anonymous}))) as app:
        assert app.get("/api/v1/jobs").status_code == 200
        r = app.post("/api/v1/jobs", json=DENSE)
        if anonymous == "read":
            assert r.status_code == 401
        else:
            assert r.status_code == 201 and r.json()["owner_id"] is None
        assert app.get("/api/v1/jobs", headers=bearer("alt_wrong")).status_code == 401, "a token sent is checked"


def test_own_visibility_hides_other_tokens_jobs(auth_settings, sqlite_url, make_token):
    from fastapi.testclient import TestClient

    from service.api import create_app

    alice, bob = make_token(sqlite_url, "write", "alice"), make_token(sqlite_url, "write", "bob")
    admin = make_token(sqlite_url, "admin", "root")
    with TestClient(create_app(auth_settings.model_copy(update={"jobs_visible": "own"}))) as app:
        a = app.post("/api/v1/jobs", json=DENSE, headers=bearer(alice)).json()["id"]
        b = app.post("/api/v1/jobs", json=DENSE, headers=bearer(bob)).json()["id"]
        assert [j["id"] for j in app.get("/api/v1/jobs", headers=bearer(alice)).json()["data"]] == [a]
        assert app.get(f"/api/v1/jobs/{b}", headers=bearer(alice)).status_code == 404
        assert app.get(f"/api/v1/jobs/{b}/trials", headers=bearer(alice)).status_code == 404
        assert app.get(f"/api/v1/jobs/{b}/events", headers=bearer(alice)).status_code == 404
        assert app.get("/api/v1/jobs", headers=bearer(admin)).json()["count"] == 2


def test_openapi_names_the_security_schemes_and_the_401(app):
    spec = app.get("/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer", "description": schemes["bearer"]["description"]}
    assert schemes["token_query"]["in"] == "query" and schemes["token_cookie"]["in"] == "cookie"
    for path, ops in spec["paths"].items():
        if path.startswith("/api/v1/"):
            for method, op in ops.items():
                assert {"bearer": []} in op["security"], (method, path)
                assert "401" in op["responses"], (method, path)
    assert {"403", "429"} <= set(spec["paths"]["/api/v1/jobs"]["post"]["responses"])


def test_first_start_makes_one_admin_token_and_prints_the_url(auth_settings, sqlite_url, app):
    from service.cli import _access_line, first_token

    token = first_token(sqlite_url)
    assert token is not None and first_token(sqlite_url) is None, "only on a database without tokens"
    line = _access_line(auth_settings, "http://127.0.0.1:8000/", token)
    assert f"http://127.0.0.1:8000/?token={token}" in line
    assert app.post("/api/v1/jobs", json=DENSE, headers=bearer(token)).status_code == 201
    assert "ALTUNE_ANONYMOUS=read" in _access_line(auth_settings.model_copy(update={"anonymous": "read"}),
                                                   "http://h:1/", None)
