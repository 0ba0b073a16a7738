"""Dependencies shared by the routers, as `Annotated` aliases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.orm import Session

from service.db import session_scope
from service.settings import Settings


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(settings: SettingsDep) -> Iterator[Session]:
    with session_scope(settings.resolved_database_url) as session:
        yield session


# scope="function": the session commits when the handler returns, before the response is sent,
# so a client that reads right after a 201 finds the row, and a failed commit is never answered 2xx
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def invalid(loc: tuple[str | int, ...], message: str) -> RequestValidationError:
    """A 422 shaped exactly like FastAPI's own validation errors, so clients parse one format."""
    return RequestValidationError([{"loc": loc, "msg": message, "type": "value_error"}])
