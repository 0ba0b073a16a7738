"""Who a request is, and what it may do: tokens as FastAPI security dependencies.

A token travels as `Authorization: Bearer <token>` (`HTTPBearer`). A browser cannot put a header on an
`EventSource` or a download link, so a GET (and HEAD) also takes it as the `token` query parameter
(`APIKeyQuery`) or the `altune_token` cookie the dashboard sets (`APIKeyCookie`). Writes take only the
header: a cookie travels by itself with any request the browser makes, so a cookie good for writes would let
another site's page submit in the user's name (a query token on a POST is refused for the same reason it
leaks: logs and history). All three are security schemes in the OpenAPI document.

`ReadCaller`, `WriteCaller` and `AdminCaller` are the dependencies routes take; `/api/v1` requires
`ReadCaller` on every route. No token: 401 unless `ALTUNE_ANONYMOUS` admits the scope; an unknown or revoked
token: 401 (even where anonymous requests would pass: a token sent is a token checked); a token whose scope
is too low: 403. Each answer says what is missing and how to get it. A write without `Authorization` is refused by
`WritesNeedAToken` before its body is read (FastAPI parses a body before it runs the dependencies).

The lookup is one indexed query on `AUTH_SESSIONS` threads and connections of its own (`db.py`), so checking
a token never waits for a request's thread or connection, nor they for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio
from anyio.lowlevel import RunVar
from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyCookie, APIKeyQuery, HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as ASGIScope

from service.api.deps import SettingsDep
from service.db import API_CONNECTIONS, AUTH_SESSIONS, session_scope
from service.models import Owner, Token
from service.quotas import QuotaExceeded
from service.settings import Settings
from service.tokens import Caller, Scope, covers, hash_token

COOKIE = "altune_token"
QUERY = "token"
_GETS = frozenset({"GET", "HEAD"})
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_QUERY_ON_WRITE = ("a token in `?token=` is taken on GET only (links, event streams); send it as "
                   "`Authorization: Bearer <token>`")
_HOW = "create one with `altune token create --scope {scope}` on the server (the first `altune serve` printed an " \
       "admin token in its dashboard URL)"

bearer = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="`Authorization: Bearer <token>`; a token from `altune token create`")
query_token = APIKeyQuery(name=QUERY, auto_error=False, scheme_name="token_query",
                          description="GET only (links, EventSource): `?token=<token>`")
cookie_token = APIKeyCookie(name=COOKIE, auto_error=False, scheme_name="token_cookie",
                            description="GET only: the cookie the dashboard sets for its event streams and downloads")

T = TypeVar("T")
_limiter: RunVar[anyio.CapacityLimiter] = RunVar("altune_auth_limiter")


async def in_auth_thread(func: Callable[..., T], *args: Any) -> T:
    """Run a short query on one of the AUTH_SESSIONS threads kept for token lookups and quota pre-checks."""
    try:
        limiter = _limiter.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(AUTH_SESSIONS)
        _limiter.set(limiter)
    return await anyio.to_thread.run_sync(func, *args, limiter=limiter)


def _lookup(url: str, token_hash: str) -> Caller | None:
    with session_scope(url, API_CONNECTIONS) as session:
        row = Token.find_by_hash(session, token_hash)
        return None if row is None or row.revoked_at is not None else Caller.of(row)


def unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})


async def get_caller(
    request: Request,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    query: Annotated[str | None, Depends(query_token)],
    cookie: Annotated[str | None, Depends(cookie_token)],
) -> Caller | None:
    """The token's caller, or None when the request carries no token (the scope check decides)."""
    token = credentials.credentials if credentials is not None else None
    if token is None and request.method in _GETS:
        token = query or cookie
    if token is None:
        if query and request.method not in _GETS:
            raise unauthorized(_QUERY_ON_WRITE)
        return None
    caller = await in_auth_thread(_lookup, settings.resolved_database_url, hash_token(token))
    if caller is None:
        raise unauthorized(f"the token is unknown or revoked; {_HOW.format(scope='read')}")
    return caller


def _anonymous_scope(settings: Settings) -> Scope | None:
    return {"none": None, "read": "read", "all": "write"}[settings.anonymous]  # type: ignore[return-value]


_WHAT = {"read": "reading", "write": "submitting, cancelling, uploading or deleting", "admin": "this"}


def _no_token(wanted: Scope) -> str:
    return f"{_WHAT[wanted]} needs a token of scope {wanted}: send `Authorization: Bearer <token>`; " \
           f"{_HOW.format(scope=wanted)}"


def _requirement(needed: Scope) -> Callable[..., Any]:
    what = _WHAT[needed]

    async def require(request: Request, settings: SettingsDep,
                      caller: Annotated[Caller | None, Depends(get_caller)]) -> Caller:
        if caller is None:
            anonymous = _anonymous_scope(settings)
            if anonymous is not None and covers(anonymous, needed):
                return Caller.anonymous(anonymous)
            # the router's read check runs first on every route: a write without a token hears what it needs
            wanted = "write" if needed == "read" and request.method not in _GETS else needed
            raise unauthorized(_no_token(wanted))
        if not covers(caller.scope, needed):
            raise HTTPException(403, f"token {caller.name!r} has scope {caller.scope}; {what} needs scope {needed}: "
                                     f"{_HOW.format(scope=needed)}")
        return caller

    require.__name__ = f"require_{needed}"
    return require


require_read = _requirement("read")
require_write = _requirement("write")
require_admin = _requirement("admin")
ReadCaller = Annotated[Caller, Depends(require_read)]
WriteCaller = Annotated[Caller, Depends(require_write)]
AdminCaller = Annotated[Caller, Depends(require_admin)]


def visible_owner(caller: Caller, settings: Settings) -> Owner | None:
    """Whose jobs the caller reads: None for everyone's, or its own (`ALTUNE_JOBS_VISIBLE=own`, not admin)."""
    if settings.jobs_visible == "all" or caller.is_admin:
        return None
    return Owner(caller.token_id)


def too_many(e: QuotaExceeded) -> HTTPException:
    """A 429 for a request over quota: the message names the limit and when it frees; Retry-After in seconds."""
    return HTTPException(429, e.message, headers={"Retry-After": str(e.retry_after)})


class WritesNeedAToken:
    """ASGI middleware: a write to `/api/v1` without `Authorization` is answered 401 before its body is read.

    FastAPI reads and parses a route's body before it runs any dependency, `require_write` included, so without
    this an anonymous client had its body parsed (and a malformed one answered 422) before it heard that it
    needs a token. A write takes its token only from the header, so a write without one is refused whatever
    the body, unless `ALTUNE_ANONYMOUS=all`; the dependencies stay the rule for everything else (a token sent is
    checked there).
    """

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.open = _anonymous_scope(settings) == "write"

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        if (not self.open and scope["type"] == "http" and scope["method"] not in _SAFE
                and scope["path"].startswith("/api/v1/") and "authorization" not in Headers(scope=scope)):
            query = QueryParams(scope.get("query_string", b"").decode("latin-1"))
            error = unauthorized(_QUERY_ON_WRITE if query.get(QUERY) else _no_token("write"))
            await JSONResponse(status_code=401, content={"detail": error.detail},
                               headers=error.headers)(scope, receive, send)
            return
        await self.app(scope, receive, send)
