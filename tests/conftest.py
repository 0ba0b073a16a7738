"""Shared fixtures: one database per test, on SQLite always and on PostgreSQL where it answers; the markers that say
what a slow test does. Plain helpers and factories are in tests/support/ (`from support.jobs import ...`)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from support.auth import new_token, open_to_all
from support.databases import reset_postgres
from support.servers import LiveServer

from service.api import create_app
from service.db import get_engine, upgrade
from service.settings import Settings

POSTGRES_URL = os.environ.get("ALTUNE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

# What a slow test does, one marker each; every one of them implies `slow`, which `make test-fast` leaves out
# (`-m "not slow"`). Select by what you are changing: `-m tunes`, `-m "slow and not browser"`.
SLOW_MARKERS = {
    "tunes": "builds and measures candidates: a search, a measurer, a worker, `altune tune`, a bench run",
    "builds_model": "exports, imports or builds a whole model (the zoo's, the corpus', an upload's)",
    "sandbox": "runs an upload through the sandbox's child (it imports torch and TVM, confined: seconds each)",
    "server": "starts `altune serve`, `altune worker` or an RPC tracker as child processes",
    "browser": "drives a headless chromium through the dashboard (playwright)",
    "fuzz": "sends generated requests by the hundred (schemathesis)",
    "bench": "runs a benchmark: programs built and timed in fresh processes (bench.*)",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, what in SLOW_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what} (implies slow)")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: "not slow" must see the `slow` added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(name) for name in SLOW_MARKERS) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


# -- databases ---------------------------------------------------------------------------------------------------


def _postgres_reason() -> str | None:
    """None when PostgreSQL answers, else why the PostgreSQL variants are skipped."""
    try:
        import psycopg  # optional: the PostgreSQL variants skip without it

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
    name = f"altune_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    get_engine.cache_clear()  # engines made for the per-test URL hold connections to it
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    """A migrated, empty database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'altune.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
        reset_postgres(url)
    upgrade(url)
    return url


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'altune.db'}"
    upgrade(url)
    return url


@pytest.fixture
def settings(db_url, tmp_path) -> Settings:
    # torch.compile's timing (a minute per model job's prepare), the anytime build (one more build per model job) and
    # learning across jobs (a later job of a test would start warm from an earlier one's) only where a test asks
    return Settings(database_url=db_url, data_dir=tmp_path, lease_seconds=5, poll_seconds=0.2,
                    time_torch_compile=False, anytime_artifact=False, learn=False)


# -- tokens and clients ------------------------------------------------------------------------------------------


@pytest.fixture
def make_token():
    """`make_token(url, scope, name, **limits)`: a new token (`support.auth.new_token`)."""
    return new_token


@pytest.fixture
def admin_token(settings) -> str:
    return new_token(settings.resolved_database_url, "admin", "test-admin")


@pytest.fixture
def client(settings, admin_token):
    """The app in-process with auth on (the default), sending an admin token with every request."""
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {admin_token}"}) as c:
        yield c


@pytest.fixture
def app(settings):
    """The app in-process with auth on and no token: each test sends what it means to (`support.auth.bearer`)."""
    with TestClient(create_app(settings)) as c:
        yield c


def _run_async(coro):
    """`asyncio.run(coro)` in a thread of its own: the web tests' session-wide browser (playwright's sync API)
    keeps an event loop running in this process's main thread, where `asyncio.run` then refuses to start."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@pytest.fixture
def run_async():
    """`run_async(coro)`: `asyncio.run` that works in any test process (see `_run_async`)."""
    return _run_async


# -- servers -----------------------------------------------------------------------------------------------------


@pytest.fixture
def live_server(settings) -> Iterator[LiveServer]:
    """The real API and a worker, open to anonymous reads and writes (`open_to_all`)."""
    with LiveServer(open_to_all(settings)) as server:
        yield server


@pytest.fixture
def api_server(sqlite_url, tmp_path) -> Iterator[LiveServer]:
    """The real API on a loopback port over SQLite, without a worker: submitted jobs stay queued. Auth is on:
    `api_server.token` is an admin token."""
    with LiveServer(Settings(database_url=sqlite_url, data_dir=tmp_path), worker=False) as server:
        server.token = new_token(sqlite_url, "admin", "test-admin")
        yield server
