"""Shared fixtures: one database per test, on SQLite always and on PostgreSQL where it answers."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

POSTGRES_URL = os.environ.get("ALTUNE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _postgres_reason() -> str | None:
    """None when PostgreSQL answers, else why the PostgreSQL variants are skipped."""
    try:
        import psycopg

        url = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url, connect_timeout=3):
            return None
    except Exception as e:
        return f"PostgreSQL not reachable at {POSTGRES_URL}: {e}"


_PG_SKIP = _postgres_reason()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A database of this test run's own on the PostgreSQL server, so parallel runs never meet."""
    if _PG_SKIP:
        pytest.skip(_PG_SKIP)
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"altune_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    from service.db import get_engine

    get_engine.cache_clear()  # engines made for the per-test URL hold connections to it
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _reset_postgres(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    """A migrated, empty database."""
    from service.db import upgrade

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'altune.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
        _reset_postgres(url)
    upgrade(url)
    return url


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    from service.db import upgrade

    url = f"sqlite:///{tmp_path / 'altune.db'}"
    upgrade(url)
    return url


@pytest.fixture
def settings(db_url, tmp_path):
    from service.settings import Settings

    return Settings(database_url=db_url, data_dir=tmp_path, lease_seconds=5, poll_seconds=0.2)


def new_token(url: str, scope: str = "admin", name: str | None = None, **limits: int | None) -> str:
    """A new token in the database at `url` (as `altune token create` makes it): the token itself."""
    from service.db import session_scope
    from service.tokens import create_token

    with session_scope(url) as session:
        return create_token(session, scope, name, **limits)[1]  # type: ignore[arg-type]


def open_to_all(settings):
    """The settings with ALTUNE_ANONYMOUS=all: for servers whose tests are about tuning, streaming or the dashboard
    and reach the API from many places (httpx, a browser) without a token; the token tests run with auth on."""
    return settings.model_copy(update={"anonymous": "all"})


@pytest.fixture
def make_token():
    """`make_token(url, scope, name, **limits)`: a new token (a fixture: `from conftest import` may find
    tests/web/conftest.py first)."""
    return new_token


@pytest.fixture
def admin_token(settings) -> str:
    return new_token(settings.resolved_database_url, "admin", "test-admin")


@pytest.fixture
def client(settings, admin_token):
    """The app in-process with auth on (the default), sending an admin token with every request."""
    from fastapi.testclient import TestClient

    from service.api import create_app

    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {admin_token}"}) as c:
        yield c


def _run_async(coro):
    """`asyncio.run(coro)` in a thread of its own: the web tests' session-wide browser (playwright's sync API)
    keeps an event loop running in this process's main thread, where `asyncio.run` then refuses to start."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@pytest.fixture
def run_async():
    """`run_async(coro)`: `asyncio.run` that works in any test process (see `_run_async`; a fixture, since
    `from conftest import` may find tests/web/conftest.py)."""
    return _run_async


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """The real API on a loopback port with one worker (unless `worker=False`), both in threads of this process."""

    def __init__(self, settings, *, worker: bool = True) -> None:
        import uvicorn

        from service.api import create_app
        from service.worker import Worker

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.worker = Worker(settings) if worker else None
        self._threads = [threading.Thread(target=self.server.run, daemon=True)]
        if self.worker is not None:
            self._threads.append(threading.Thread(target=self.worker.run_forever, daemon=True))

    def __enter__(self) -> LiveServer:
        for t in self._threads:
            t.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start in 30 s"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.server.should_exit = True
        for t in self._threads:
            t.join(60)


@pytest.fixture
def live_server(settings) -> Iterator[LiveServer]:
    """The real API and a worker, open to anonymous reads and writes (`open_to_all`)."""
    with LiveServer(open_to_all(settings)) as server:
        yield server


@pytest.fixture
def api_server(sqlite_url, tmp_path) -> Iterator[LiveServer]:
    """The real API on a loopback port over SQLite, without a worker: submitted jobs stay queued. Auth is on:
    `api_server.token` is an admin token."""
    from service.settings import Settings

    with LiveServer(Settings(database_url=sqlite_url, data_dir=tmp_path), worker=False) as server:
        server.token = new_token(sqlite_url, "admin", "test-admin")
        yield server
