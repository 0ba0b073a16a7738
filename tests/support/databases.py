"""Databases for the tests: a PostgreSQL schema emptied between tests."""

from __future__ import annotations

from sqlalchemy import create_engine, text


def reset_postgres(url: str) -> None:
    """Drops everything in the database's public schema (the next `upgrade(url)` migrates it from nothing)."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
