"""Engine, sessions and the schema-version check.

`session_scope` is the one place that commits, rolls back and turns
SQLAlchemy's errors into `StorageError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


class StorageError(RuntimeError):
    """The database refused or could not be reached."""


class SchemaOutdatedError(StorageError):
    """The database schema is older than this code; `altune db upgrade` fixes it."""


def utcnow() -> datetime:
    """Naive UTC: what every DateTime column stores, on SQLite and PostgreSQL alike."""
    return datetime.now(UTC).replace(tzinfo=None)


# -- the connection budget: every thread that touches the database holds at most one connection and never waits
# for one that another request holds (the arithmetic for a shared PostgreSQL is in docs/design.md)
API_THREADS = 32
"""Threads serving the API's sync handlers (set at start-up) and sessions SessionDep admits at once.

A request keeps its session until its response is serialized, after its handler's thread is given back, so
the admission count and not the thread count bounds the connections requests hold.
"""
STREAM_THREADS = 4
"""Threads the event streams poll on, a limiter of their own: streams never take a request's thread or connection."""
MODEL_SESSIONS = 2
"""Model submissions that write their job at once; each opens its session only after the (seconds-long) import,
so an upload never holds a request's session slot while torch and TVM work, and has connections of its own."""
AUTH_SESSIONS = 2
"""Token lookups (and quota checks before an upload is read) at once, on threads and connections of their own."""
API_CONNECTIONS = API_THREADS + STREAM_THREADS + MODEL_SESSIONS + AUTH_SESSIONS
WORKER_CONNECTIONS = 5
"""A worker's job loop, its lease heartbeat and its presence (`service.worker`), its own job's rounds and their
lease heartbeat (`service.rounds`); also what any other caller of `get_engine(url)` gets."""


@cache
def get_engine(url: str, connections: int = WORKER_CONNECTIONS) -> Engine:
    """One engine per URL and pool size per process, its pool `connections` wide (no overflow).

    SQLite gets WAL and a busy timeout so the API and a worker can share it.
    """
    pool = {"pool_size": connections, "max_overflow": 0}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        else:
            pool = {}  # one connection per thread (SingletonThreadPool): there is nothing to size
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **pool)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, **pool)


@cache
def _sessionmaker(url: str, connections: int) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url, connections), expire_on_commit=False)


@contextmanager
def session_scope(url: str, connections: int = WORKER_CONNECTIONS) -> Iterator[Session]:
    """A session that commits on success and rolls back on error, from the engine with a pool `connections` wide.

    Raises:
        StorageError: from any SQLAlchemy error, with the original as its cause.
    """
    session = _sessionmaker(url, connections)()
    try:
        yield session
        session.commit()
    except SQLAlchemyError as e:
        session.rollback()
        raise StorageError(f"database error: {e}") from e
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the Alembic migrations up to `revision`; an SQLite file's folder is created first."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)  # a fresh clone has no ./var
    command.upgrade(alembic_config(url), revision)


def is_embedded(url: str) -> bool:
    """An SQLite database: this process tree owns it, so `altune serve` may create and migrate it itself."""
    return url.startswith("sqlite")


def check_schema(url: str) -> None:
    """Raise SchemaOutdatedError unless the database is at the newest migration."""
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    try:
        with get_engine(url).connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as e:
        raise StorageError(f"cannot reach the database {url}: {e}") from e
    if current != head:
        raise SchemaOutdatedError(
            f"database schema is at {current or 'nothing'}, this altune needs {head}: run `altune db upgrade`"
        )
