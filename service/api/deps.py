"""Dependencies shared by the routers, as `Annotated` aliases, and the API's thread budget."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated

import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.orm import Session

from service.db import API_CONNECTIONS, API_THREADS, session_scope
from service.settings import Settings


async def get_settings(request: Request) -> Settings:
    # async: a plain attribute read, no reason to wait for a worker thread under load
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(settings: SettingsDep) -> Iterator[Session]:
    with session_scope(settings.resolved_database_url, API_CONNECTIONS) as session:
        yield session


# scope="function": the session commits when the handler returns, before the response is sent, so a client that
# reads right after a 201 finds the row, and a failed commit is never answered 2xx. The session (and its pooled
# connection) lives until the response is serialized, which for a sync handler waits for a thread of its own, after
# the handler's thread has gone to the next request: without a bound, requests holding every connection wait for
# threads held by requests waiting for a connection. max_concurrency admits at most API_THREADS sessions, and the
# pool has a connection for each, so a handler's thread never waits for a connection; the rest wait for a slot
# without a thread.
SessionDep = Annotated[Session, Depends(get_session, scope="function", max_concurrency=API_THREADS)]


@asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    """Serve sync handlers on API_THREADS threads, one per session SessionDep admits (anyio's default is 40)."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = API_THREADS
    yield


def invalid(loc: tuple[str | int, ...], message: str) -> RequestValidationError:
    """A 422 shaped exactly like FastAPI's own validation errors, so clients parse one format."""
    return RequestValidationError([{"loc": loc, "msg": message, "type": "value_error"}])
