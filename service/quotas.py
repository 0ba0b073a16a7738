"""Per-token quotas: jobs queued and running at once, trials (job budgets) and upload bytes per UTC day.

A token's own limit wins; where it has none (None), the server's default (`ALTUNE_TOKEN_MAX_*`) applies.
Anonymous requests (`ALTUNE_ANONYMOUS`) share one allowance with the defaults.

The daily limits count the usage ledger (`models.Usage`: a row per submitted job, written with it and kept
when it is deleted), so deleting jobs gives nothing back. Two checks:

- `check_submission`, before any work: a model submission is checked from what its request says (the
  declared size, the spec's budget) before its body is read and again before the import, so an over-quota
  token costs no import;
- `check_new_job`, authoritative, after the new job is written, in its transaction, with the token's row
  locked (`SELECT ... FOR UPDATE` on PostgreSQL; SQLite has one writer at a time already): two submissions
  of one token at once cannot both pass on the last free place.

The running limit is the workers' (`Worker.claim` skips a queued job whose owner runs as many as it may);
it is not a refusal.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.db import utcnow
from service.models import Job, Token, Usage
from service.settings import Settings
from service.tokens import Caller

QUEUE_RETRY_SECONDS = 30  # Retry-After for a full queue: the time a place frees is unknown; poll this often


class QuotaExceeded(Exception):
    """A request over a token's limit: `limit` names it, `message` says how much is used and when it frees up,
    `retry_after` is the seconds until then."""

    def __init__(self, limit: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.message = message
        self.retry_after = retry_after


def limit_of(caller: Caller, name: str, settings: Settings) -> int:
    """The caller's limit `name` ("max_queued", ...): its token's own, or the server's default."""
    own = caller.limits.get(name)
    return own if own is not None else getattr(settings, f"token_{name}")


def day_bounds(now: datetime) -> tuple[datetime, datetime]:
    """The UTC day `now` is in: its start and the next (when the daily quotas reset)."""
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=1)


def _who(caller: Caller) -> str:
    return "anonymous requests" if caller.token_id is None else f"token {caller.name!r}"


def _daily(caller: Caller, limit: str, used: int, cap: int, unit: str, now: datetime) -> QuotaExceeded:
    _, reset = day_bounds(now)
    return QuotaExceeded(
        limit, f"quota exceeded: {_who(caller)} may submit {cap} {unit} per UTC day ({limit}), this request would "
               f"make {used}; it resets at {reset.isoformat()}Z", max(1, int((reset - now).total_seconds()) + 1))


def _queued(session: Session, caller: Caller) -> int:
    return session.scalar(select(func.count()).select_from(Job)
                          .where(Job.owned_by(caller.token_id), Job.status == "queued")) or 0


def _check(caller: Caller, settings: Settings, *, queued: int, trials: int, uploaded: int, now: datetime) -> None:
    """Raise the first limit that the counts, the new submission included, pass."""
    cap = limit_of(caller, "max_queued", settings)
    if queued > cap:
        raise QuotaExceeded("max_queued", f"quota exceeded: {_who(caller)} may have {cap} jobs queued at once "
                                          f"(max_queued) and has {queued - 1}; a place frees when one of them starts "
                                          f"or is cancelled", QUEUE_RETRY_SECONDS)
    cap = limit_of(caller, "max_trials_per_day", settings)
    if trials > cap:
        raise _daily(caller, "max_trials_per_day", trials, cap, "trials (job budgets)", now)
    cap = limit_of(caller, "max_upload_bytes_per_day", settings)
    if uploaded > cap:
        raise _daily(caller, "max_upload_bytes_per_day", uploaded, cap, "bytes of uploads", now)


def check_submission(session: Session, caller: Caller, settings: Settings, *, trials: int = 0,
                     upload_bytes: int = 0) -> None:
    """Before a submission is received or imported: would one more job of `trials` trials and `upload_bytes`
    bytes pass a limit? (No lock: `check_new_job` decides; this spares the work of a refusal.)

    Raises:
        QuotaExceeded: the first limit passed (queued jobs, trials per day, upload bytes per day).
    """
    now = utcnow()
    used_trials, used_bytes = Usage.totals_since(session, caller.token_id, day_bounds(now)[0])
    _check(caller, settings, queued=_queued(session, caller) + 1, trials=used_trials + trials,
           uploaded=used_bytes + upload_bytes, now=now)


def check_new_job(session: Session, caller: Caller, settings: Settings, job: Job) -> None:
    """Record the caller's new, flushed `job` in the usage ledger, then check that it is within quota.

    Raises:
        QuotaExceeded: the first limit passed (queued jobs, trials per day, upload bytes per day); the
            caller's transaction must roll back (the session scope does), the ledger row with it.
    """
    if caller.token_id is not None:  # one submission of this token at a time from here to its commit
        session.execute(select(Token.id).where(Token.id == caller.token_id).with_for_update())
    now = utcnow()
    Usage.record(session, job)
    trials, uploaded = Usage.totals_since(session, caller.token_id, day_bounds(now)[0])
    _check(caller, settings, queued=_queued(session, caller), trials=trials, uploaded=uploaded, now=now)
