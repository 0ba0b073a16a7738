"""What bounds the event streams: how many one API process keeps open (in all, and per token), and how long a
stream outlives its token.

Caps (`ALTUNE_MAX_STREAMS`, `ALTUNE_MAX_STREAMS_PER_TOKEN`): a stream takes a slot before it sends anything and
gives it back when its response ends, whichever way (the job finished, the client went away, the server stops);
a stream over a cap is refused with 429 saying which cap and how to raise it. A request without a token holds
its slot under its client's address (behind a reverse proxy every anonymous client is the proxy's address, so
they share one allowance; give such users tokens). The counts live in the process: one `altune serve` is one
process.

Revocation: a stream re-reads its token's row every `TOKEN_CHECK_SECONDS` (one primary-key read) and ends when
the token was revoked or deleted; the client's reconnect is then refused with 401, like any request with that
token.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic

from fastapi import HTTPException, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from starlette.types import Receive, Scope, Send

from service.db import API_CONNECTIONS, StorageError, session_scope
from service.models import Token
from service.settings import Settings
from service.tokens import Caller

TOKEN_CHECK_SECONDS = 5.0  # how often an open stream re-reads its token
RETRY_AFTER_SECONDS = 10  # a refused stream's Retry-After


class StreamSlots:
    """The event streams open in this process, in all and by holder (a token, or an anonymous client's address)."""

    def __init__(self) -> None:
        self.total = 0
        self.by_holder: dict[str, int] = {}

    def take(self, request: Request, caller: Caller, settings: Settings) -> Callable[[], None]:
        """A slot for one more stream of `caller`'s: the function that gives it back (once; later calls do nothing).

        Raises:
            HTTPException: 429 over `max_streams` or `max_streams_per_token`, naming the cap and its setting.
        """
        if caller.token_id is not None:
            holder, who = f"token {caller.token_id}", f"token {caller.name!r}"
        else:
            address = request.client.host if request.client is not None else "unknown"
            holder, who = f"address {address}", f"requests without a token from {address}"
        held = self.by_holder.get(holder, 0)
        if self.total >= settings.max_streams:
            raise _refusal(f"the server has {self.total} event streams open, its limit (ALTUNE_MAX_STREAMS="
                           f"{settings.max_streams}); try again when some have closed, or raise ALTUNE_MAX_STREAMS")
        if held >= settings.max_streams_per_token:
            raise _refusal(f"{who} has {held} event streams open, the limit per token (ALTUNE_MAX_STREAMS_PER_TOKEN="
                           f"{settings.max_streams_per_token}); close some (a dashboard tab holds one or two) or raise "
                           "ALTUNE_MAX_STREAMS_PER_TOKEN")
        self.total += 1
        self.by_holder[holder] = held + 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            self.total -= 1
            left = self.by_holder[holder] - 1
            if left:
                self.by_holder[holder] = left
            else:
                del self.by_holder[holder]

        return give_back


def _refusal(message: str) -> HTTPException:
    return HTTPException(429, message, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def slots_of(request: Request) -> StreamSlots:
    """The app's stream slots (made with the app: `create_app`)."""
    return request.app.state.streams


class SlotStream(StreamingResponse):
    """A streaming response that gives its slot back when it ends, even one whose body never started."""

    def __init__(self, *args: object, give_back: Callable[[], None], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.give_back = give_back

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.give_back()


class TokenWatch:
    """Whether the token of a stream's caller still holds: re-read at most every `TOKEN_CHECK_SECONDS`."""

    def __init__(self, url: str, caller: Caller) -> None:
        self.url = url
        self.token_id = caller.token_id
        self.checked = monotonic()

    def due(self) -> bool:
        return self.token_id is not None and monotonic() - self.checked >= TOKEN_CHECK_SECONDS

    def revoked(self) -> bool:
        """Whether the token was revoked or deleted (a database error: not known, so not revoked). Blocking."""
        self.checked = monotonic()
        try:
            with session_scope(self.url, API_CONNECTIONS) as s:
                row = s.execute(select(Token.revoked_at).where(Token.id == self.token_id)).first()
        except StorageError:
            return False
        return row is None or row.revoked_at is not None
