"""What every router shares: bounded ids and offsets, the error responses the OpenAPI schema describes, the
422 handler, the check that refuses writes from another origin, and the body limit (`BodyLimit`).

Bounds: a path or query integer outside what its column holds never reaches the database (SQLite's driver raised
`OverflowError`, a 500; PostgreSQL a 503); it is a 422 naming the parameter.

Cross-origin writes: the API sends no CORS headers, so a page elsewhere cannot read its answers, but a
browser still sends a "simple" cross-origin POST (a form, a multipart upload) and the server would act on
it. Tokens close most of that door: a write needs `Authorization: Bearer`, which a page of another origin
cannot add without a CORS preflight the server never grants, and the dashboard's cookie is taken on GET only
(`api/auth.py`). The door stays open where writes need no token (`ALTUNE_ANONYMOUS=all`): any web page open
in a user's browser could then submit or cancel jobs on a server at 127.0.0.1. So every state-changing
request that a browser marks as coming from another origin (its `Origin` header, or `Sec-Fetch-Site:
cross-site`) is still refused with 403, with or without a token; clients that are not browsers (curl, the
CLI, httpx) send neither header and are unaffected. `ALTUNE_ALLOWED_ORIGINS` lists origins that may write
anyway: a dashboard served elsewhere, which can only write anonymously (`ALTUNE_ANONYMOUS=all`), since without
CORS headers its page cannot send `Authorization` here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from compiler.target import check_available
from service.schemas import MAX_INT32, MAX_INT64, ErrorPublic

# ids are `integer` columns (32 bits on PostgreSQL); offsets go to SQL's 64-bit OFFSET
JobId = Annotated[int, Path(ge=1, le=MAX_INT32, description="the job's id")]
Offset = Annotated[int, Query(ge=0, le=MAX_INT64, description="rows to skip")]

_ERROR_DOCS: dict[int, str] = {
    400: "a body that cannot be parsed (not UTF-8, not JSON, a broken multipart form) or a malformed header",
    401: "no token, or an unknown or revoked one (`Authorization: Bearer <token>`; `altune token create`)",
    403: "the token's scope is too low, the job is another token's, or a write came from a web page of another "
         "origin (see `ALTUNE_ALLOWED_ORIGINS`)",
    404: "no such job, or it has nothing of the kind asked for",
    409: "the job has already finished",
    413: "the body is larger than the server takes: a JSON body over `ALTUNE_MAX_JSON_BODY_BYTES`, an upload "
         "over `ALTUNE_MAX_UPLOAD_BYTES`",
    429: "over the token's quota (jobs queued, trials or upload bytes per UTC day), or too many event streams open "
         "(`ALTUNE_MAX_STREAMS`, `ALTUNE_MAX_STREAMS_PER_TOKEN`): the message names the limit and when it frees or "
         "how to raise it, `Retry-After` the seconds to wait",
    503: "the database cannot be reached or refused the request",
}


def check_target(name: str) -> None:
    """`compiler.target.check_available`: the name is one of `TARGETS` (pure Python: no TVM in the API).

    Raises:
        TargetError: an unknown target, or one not supported yet (cuda), saying what to use instead.
    """
    check_available(name)


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error codes a route can answer, each with an `ErrorPublic` body."""
    return {code: {"model": ErrorPublic, "description": _ERROR_DOCS[code]} for code in codes}


def _json_safe(value: Any) -> Any:
    """The value with every non-finite float as its string ("nan", "inf"): JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, but always valid JSON: it echoes the refused input, which may be NaN or 1e400 (inf)."""
    return JSONResponse(status_code=422, content={"detail": _json_safe(jsonable_encoder(exc.errors()))})


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own answer, but a 405 lists in `Allow` every method of the path, not just one route's.

    Two routes share a path (GET and POST /api/v1/jobs); Starlette answers 405 from the first that matches
    the path, with only its own methods. The OpenAPI schema has every method of every path.
    """
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        for template, operations in request.app.openapi()["paths"].items():
            if re.fullmatch(re.sub(r"\{[^/]+\}", "[^/]+", template), request.url.path):
                headers["Allow"] = ", ".join(sorted(m.upper() for m in operations))
                break
    return JSONResponse(status_code=exc.status_code, content={"detail": exc.detail}, headers=headers)


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


class SameOriginWrites:
    """ASGI middleware: a state-changing request from a browser page of another origin gets 403."""

    def __init__(self, app: ASGIApp, allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset(o.rstrip("/").lower() for o in allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in _SAFE_METHODS:
            reason = self._refusal(scope)
            if reason is not None:
                await JSONResponse(status_code=403, content={"detail": reason})(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> str | None:
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            if headers.get("sec-fetch-site") == "cross-site":
                return "cross-origin writes are refused: this request came from a page of another site"
            return None  # not a browser (curl, the CLI), or a browser's same-origin request
        origin = origin.rstrip("/").lower()
        own = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}".lower()
        if origin == own or origin in self.allowed:
            return None
        return (f"cross-origin writes are refused: the request's Origin {origin!r} is not this server ({own!r}); "
                "list it in ALTUNE_ALLOWED_ORIGINS to allow it")


class BodyTooLarge(StarletteHTTPException):
    """413: a request body over the limit (raised from `receive`; FastAPI passes HTTP exceptions on unchanged)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes (ALTUNE_MAX_JSON_BODY_BYTES)")


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is refused with 413 before the route parses it.

    FastAPI reads and parses a JSON body before it runs any dependency, the token check included, so the
    limit has to come first: a `Content-Length` over it is answered at once, before a byte is read; a body
    without one (chunked) is counted as it arrives and refused at the first byte over. `exempt` lists
    (method, path) of routes that bound their bodies themselves (the multipart upload, `uploads.py`).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, exempt: Iterable[tuple[str, str]] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = frozenset(exempt)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"].rstrip("/")) in self.exempt:
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except BodyTooLarge:  # read outside FastAPI's handling (a middleware, a stream): answered here
            if started:
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = BodyTooLarge(self.max_bytes).detail
        # Connection: close: the rest of the body is never read, so the connection cannot carry another request
        await JSONResponse(status_code=413, content={"detail": detail},
                           headers={"Connection": "close"})(scope, receive, send)
