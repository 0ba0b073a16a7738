"""API tokens: made once, shown once, stored as their SHA-256; who a request is (`Caller`).

A token is 32 random bytes (`secrets.token_urlsafe`) behind the prefix `alt_`, so a fast hash is enough: there
is nothing to guess from the digest, and a lookup is one indexed equality. Scopes nest: `admin` implies
`write` implies `read`.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.orm import Session

from service.db import utcnow
from service.models import SCOPES, Token

Scope = Literal["read", "write", "admin"]
PREFIX = "alt_"
LIMITS = ("max_queued", "max_running", "max_trials_per_day", "max_upload_bytes_per_day")


def hash_token(token: str) -> str:
    """What the database stores and looks a token up by."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def covers(scope: str, needed: str) -> bool:
    """Whether a token of `scope` may do what needs `needed` (admin > write > read)."""
    return SCOPES.index(scope) >= SCOPES.index(needed)


def create_token(session: Session, scope: Scope, name: str | None = None, **limits: int | None) -> tuple[Token, str]:
    """Store a new token; return its row and the token itself (shown once, never stored).

    Raises:
        ValueError: an unknown scope or limit, a negative limit, or a name already taken or all digits.
    """
    if scope not in SCOPES:
        raise ValueError(f"unknown scope: {scope!r} (one of {', '.join(SCOPES)})")
    unknown = set(limits) - set(LIMITS)
    if unknown:
        raise ValueError(f"unknown limits: {sorted(unknown)} (known: {', '.join(LIMITS)})")
    negative = {k: v for k, v in limits.items() if v is not None and v < 0}
    if negative:
        raise ValueError(f"limits must be >= 0: {negative}")
    if name is not None:
        if not name or name.isdigit() or len(name) > 64:
            raise ValueError(f"a token name is 1 to 64 characters, not all digits (those are ids): {name!r}")
        if Token.find_by_id_or_name(session, name) is not None:
            raise ValueError(f"a token named {name!r} exists already")
    token = new_token()
    # a unique placeholder until the id is known: the default name is "token-<id>"
    row = Token(name=name or f"new-{secrets.token_hex(8)}", scope=scope, token_hash=hash_token(token),
                created_at=utcnow(), **limits)
    session.add(row)
    session.flush()
    if name is None:
        row.name = f"token-{row.id}"
        session.flush()
    return row, token


def revoke_token(session: Session, ref: str) -> Token:
    """Revoke the token with this id or name (again: no change).

    Raises:
        KeyError: no such token.
    """
    row = Token.find_by_id_or_name(session, ref)
    if row is None:
        raise KeyError(f"no token with id or name {ref!r}")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


@dataclass(frozen=True)
class Caller:
    """Who sent a request: a token (its id, name, scope and limits), or anonymous (`token_id` None)."""

    token_id: int | None
    name: str
    scope: Scope
    limits: dict[str, int | None]

    @classmethod
    def of(cls, row: Token) -> Caller:
        return cls(row.id, row.name, row.scope, {k: getattr(row, k) for k in LIMITS})  # type: ignore[arg-type]

    @classmethod
    def anonymous(cls, scope: Scope) -> Caller:
        return cls(None, "anonymous", scope, dict.fromkeys(LIMITS))

    @property
    def is_admin(self) -> bool:
        return self.scope == "admin"

    def may_change(self, owner_id: int | None) -> bool:
        """Whether this caller may cancel or delete a job of `owner_id`: its owner, or an admin."""
        return self.is_admin or owner_id == self.token_id
