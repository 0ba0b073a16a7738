"""Tokens as `altune token create` makes them, and the header that carries one."""

from __future__ import annotations

from service.db import session_scope
from service.settings import Settings
from service.tokens import create_token


def new_token(url: str, scope: str = "admin", name: str | None = None, **limits: int | None) -> str:
    """A new token in the database at `url`: the token itself (only its hash is stored)."""
    with session_scope(url) as session:
        return create_token(session, scope, name, **limits)[1]  # type: ignore[arg-type]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def open_to_all(settings: Settings) -> Settings:
    """The settings with ALTUNE_ANONYMOUS=all: for servers whose tests are about tuning, streaming or the dashboard
    and reach the API from many places (httpx, a browser) without a token; the token tests run with auth on."""
    return settings.model_copy(update={"anonymous": "all"})
