"""Server-sent events: a job's trials and state as workers write them, and changes to the jobs list.

Workers are other processes that only write to the database, so the API polls
it every `POLL_SECONDS` with cheap queries (the job row by primary key, the
job's trials above the last id sent, jobs by `updated_at`) and pushes what is
new. Wire format (`text/event-stream`):

- `GET /api/v1/jobs/{id}/events`: `event: job` (a `JobPublic`) first, then
  `event: trial` (a `TrialPublic`, `id:` = the trial row id) for every trial
  above the client's cursor in id order, and `event: job` whenever the job
  changes. Every event carries an `id:` (the last trial id sent), so a client
  that reconnects with `Last-Event-ID` (or `?last_event_id=`) gets a fresh
  snapshot and only the trials it missed, `TRIAL_BATCH` rows a query (a replay
  from far behind goes out page by page). Without a cursor only trials written
  after connecting are sent: the dashboard reads the history as a chart
  (`GET /jobs/{id}/trials/chart`, whose `last_id` it resumes from) and pages of
  `GET /jobs/{id}/trials`; `last_event_id=0` replays every trial. When the job
  has finished and every trial has been sent: `event: end` and the stream closes.
- `GET /api/v1/events`: `event: job` with a `JobPublic` whenever any job
  changes (`id:` = its `updated_at`, so a reconnecting client gets the jobs
  that changed since).

A comment line (`: ping`) goes out every `HEARTBEAT_SECONDS` of silence so
proxies keep the connection open.

The polls run on `STREAM_THREADS` threads of their own (a limiter per event
loop), each with one connection of the API's pool: any number of open streams
never takes a thread or a connection from the requests, nor they from the
streams; under load the streams poll less often.

Streams are capped per API process, in all and per token (`stream_limits.py`: 429 over a cap), and a stream
whose token is revoked or deleted ends within `TOKEN_CHECK_SECONDS` with a `: the token was revoked` comment.

A database that stops answering does not end a stream: it sends `: database unavailable` comments and polls
on until the database is back, then goes on from its cursor (nothing is skipped). A stream whose API process
dies is reconnected by the client with its last id.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from time import monotonic
from typing import Annotated, TypeVar

import anyio
from anyio.lowlevel import RunVar
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from fastapi.sse import format_sse_event
from sqlalchemy import func, select, true
from sqlalchemy.orm import Session, selectinload

from service.api.auth import ReadCaller, visible_owner
from service.api.common import JobId, errors
from service.api.stream_limits import SlotStream, TokenWatch, slots_of
from service.api.deps import SettingsDep
from service.db import API_CONNECTIONS, STREAM_THREADS, StorageError, session_scope
from service.models import FINISHED, Artifact, Job, Owner, TrialRow
from service.schemas import MAX_INT32, JobPublic, TrialPublic

POLL_SECONDS = 0.5  # how often a stream looks at the database
HEARTBEAT_SECONDS = 15.0  # a comment after this much silence
RETRY_MS = 2000  # how long a disconnected EventSource waits before reconnecting
TRIAL_BATCH = 500  # trials read per poll; a client far behind catches up over several polls
CATCH_UP_SECONDS = 0.1  # the wait after a full batch: a resumed stream replays 5000 trials a second, in pages
# A row's updated_at is stamped before its transaction commits, so a change can become visible after a later one
# has been seen: the jobs stream re-reads this window behind its watermark and skips what it already sent.
LIST_OVERLAP = timedelta(seconds=10)

router = APIRouter(tags=["events"])

_SSE_DOC = {200: {"content": {"text/event-stream": {}}, "description": "a stream of server-sent events"}}
_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_REVOKED = b": the token was revoked; reconnecting needs another\n\n"
T = TypeVar("T")
_limiter: RunVar[anyio.CapacityLimiter] = RunVar("altune_stream_limiter")


async def _in_thread(func: Callable[..., T], *args: object) -> T:
    """Run a database read on the streams' own threads (STREAM_THREADS per event loop), never the requests'."""
    try:
        limiter = _limiter.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(STREAM_THREADS)
        _limiter.set(limiter)
    return await anyio.to_thread.run_sync(func, *args, limiter=limiter)


async def _poll(func: Callable[..., T], *args: object) -> AsyncIterator[T | bytes]:
    """`func(*args)` on the streams' threads, waiting out a database outage: yields a comment (bytes) for the
    client at each failed attempt (a stream that says nothing looks dead to proxies), then the result."""
    while True:
        try:
            yield await _in_thread(func, *args)
            return
        except StorageError:
            yield b": database unavailable, retrying\n\n"
            await anyio.sleep(max(POLL_SECONDS, 1.0))


def _snapshot(session: Session, job: Job) -> JobPublic:
    out = JobPublic.model_validate(job)
    out.has_artifact = Artifact.find_by_job(session, job.id) is not None
    return out


class _Snapshots:
    """The newest snapshot read of each job, with its JSON, shared by every stream of this process: when a job
    changes, its N streams (and the N jobs-list streams) read and serialize it once, not N times."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.jobs: dict[tuple[str, int], tuple[datetime, JobPublic, str]] = {}

    def get(self, url: str, job_id: int, updated_at: datetime) -> tuple[JobPublic, str] | None:
        """The snapshot of the job as of `updated_at` (naive UTC, as stored), if one was read."""
        hit = self.jobs.get((url, job_id))
        return (hit[1], hit[2]) if hit is not None and hit[0] == updated_at else None

    def put(self, url: str, job: JobPublic) -> tuple[JobPublic, str]:
        if len(self.jobs) >= self.size:
            self.jobs.clear()  # only jobs with open streams are asked for: a rare, cheap reset
        entry = (job.updated_at.replace(tzinfo=None), job, job.model_dump_json())
        self.jobs[(url, job.id)] = entry
        return entry[1], entry[2]


_SNAPSHOTS = _Snapshots()


def _event(name: str, data: str | None = None, event_id: str | int | None = None, retry: int | None = None) -> bytes:
    return format_sse_event(data_str=data, event=name, id=None if event_id is None else str(event_id), retry=retry)


def _cursor(request: Request, last_event_id: int | None) -> int | None:
    """The client's last trial id: the Last-Event-ID header of a reconnect, else the query parameter."""
    header = request.headers.get("last-event-id")
    if header:
        try:
            cursor = int(header)
        except ValueError:
            raise HTTPException(400, f"Last-Event-ID must be a trial id, got {header!r}") from None
        if not 0 <= cursor <= MAX_INT32:
            raise HTTPException(400, f"Last-Event-ID must be a trial id (0 to {MAX_INT32}), got {header!r}")
        return cursor
    return last_event_id


# -- one job -------------------------------------------------------------------------------------------------


def _read_job(url: str, job_id: int, owner: Owner | None) -> tuple[JobPublic, int] | None:
    """The job's snapshot and its largest trial id (0 when none), or None when there is no such job (of `owner`'s)."""
    with session_scope(url, API_CONNECTIONS) as s:
        job = Job.find_by_id(s, job_id)
        if job is None or (owner is not None and job.owner_id != owner.token_id):
            return None
        last = s.scalar(select(func.max(TrialRow.id)).where(TrialRow.job_id == job_id)) or 0
        return _snapshot(s, job), last


def _poll_job(url: str, job_id: int, cursor: int,
              seen: datetime) -> tuple[tuple[JobPublic, str] | None, list[TrialPublic], bool]:
    """(a new snapshot and its JSON if the row changed since `seen`, trials after `cursor`, whether the job is gone).

    The job row is read before its trials: once it reads finished, every trial is already committed. A snapshot
    another stream already read at the same `updated_at` is reused.
    """
    with session_scope(url, API_CONNECTIONS) as s:
        row = s.execute(select(Job.updated_at, Job.status).where(Job.id == job_id)).first()
        if row is None:
            return None, [], True
        job = None
        if row.updated_at != seen:
            job = _SNAPSHOTS.get(url, job_id, row.updated_at) or _SNAPSHOTS.put(
                url, _snapshot(s, Job.find_or_raise_by_id(s, job_id)))
        trials = s.scalars(
            select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.id > cursor).order_by(TrialRow.id)
            .limit(TRIAL_BATCH)
        ).all()
        return job, [TrialPublic.model_validate(t) for t in trials], False


async def _job_events(url: str, job_id: int, first: JobPublic, cursor: int,
                      watch: TokenWatch) -> AsyncIterator[bytes]:
    yield _event("job", first.model_dump_json(), cursor, retry=RETRY_MS)
    sent = first.model_dump_json()
    seen = first.updated_at.replace(tzinfo=None)
    status = first.status
    last_write = monotonic()
    while True:
        async for polled in _poll(_poll_job, url, job_id, cursor, seen):
            if isinstance(polled, bytes):
                yield polled
            else:
                job, trials, gone = polled
        if gone:
            yield _event("end", '{"status": "deleted"}', cursor)
            return
        for trial in trials:
            cursor = trial.id
            yield _event("trial", trial.model_dump_json(), cursor)
        if job is not None:
            job, data = job
            seen, status = job.updated_at.replace(tzinfo=None), job.status
            if data != sent:
                sent = data
                yield _event("job", data, cursor)
        if trials or job is not None:
            last_write = monotonic()
        if status in FINISHED and len(trials) < TRIAL_BATCH:
            yield _event("end", json.dumps({"status": status}), cursor)
            return
        if monotonic() - last_write >= HEARTBEAT_SECONDS:
            yield b": ping\n\n"
            last_write = monotonic()
        if watch.due() and await _in_thread(watch.revoked):
            yield _REVOKED
            return
        await anyio.sleep(CATCH_UP_SECONDS if len(trials) == TRIAL_BATCH else POLL_SECONDS)


@router.get("/jobs/{job_id}/events", response_class=StreamingResponse, responses=_SSE_DOC | errors(400, 404, 429))
async def stream_job_events(
    job_id: JobId,
    request: Request,
    settings: SettingsDep,
    caller: ReadCaller,
    last_event_id: Annotated[
        int | None, Query(ge=0, le=MAX_INT32, description="last trial id the client has (the Last-Event-ID header wins); 0 replays all")
    ] = None,
) -> StreamingResponse:
    """Live job: its snapshot, then each trial as it is measured and each change, until it finishes.

    A stream resumed from an old id replays the trials it missed in pages of 500. At most `ALTUNE_MAX_STREAMS`
    streams are open at once, `ALTUNE_MAX_STREAMS_PER_TOKEN` of one token's (429 beyond); a stream ends when its
    token is revoked.
    """
    url = settings.resolved_database_url
    cursor = _cursor(request, last_event_id)
    give_back = slots_of(request).take(request, caller, settings)
    try:
        state = await _in_thread(_read_job, url, job_id, visible_owner(caller, settings))
    except BaseException:
        give_back()
        raise
    if state is None:
        give_back()
        raise HTTPException(404, f"job {job_id} not found")
    first, last_trial = state
    events = _job_events(url, job_id, first, last_trial if cursor is None else cursor, TokenWatch(url, caller))
    return SlotStream(events, media_type="text/event-stream", headers=_HEADERS, give_back=give_back)


# -- the jobs list -------------------------------------------------------------------------------------------


def _parse_watermark(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        since = datetime.fromisoformat(value).replace(tzinfo=None)
    except ValueError:
        raise HTTPException(400, f"Last-Event-ID must be an ISO timestamp, got {value!r}") from None
    # the stream reads LIST_OVERLAP behind the watermark: year 1 would underflow (every job is newer anyway)
    return max(since, datetime.min + LIST_OVERLAP)


def _changed_jobs(url: str, since: datetime | None, owner: Owner | None) -> tuple[list[tuple[int, datetime]],
                                                                                 datetime | None]:
    """(id, updated_at) of the jobs (of `owner`'s) updated after `since`, oldest change first, and the newest
    updated_at."""
    mine = Job.owned_by(owner.token_id) if owner is not None else true()
    with session_scope(url, API_CONNECTIONS) as s:
        if since is None:
            newest = s.scalar(select(func.max(Job.updated_at)).where(mine))
            if newest is None:
                return [], None
            since = newest
        rows = s.execute(
            select(Job.id, Job.updated_at).where(mine, Job.updated_at > since - LIST_OVERLAP).order_by(Job.updated_at)
        ).all()
        return [(r.id, r.updated_at) for r in rows], max((r.updated_at for r in rows), default=since)


def _read_snapshots(url: str, changed: list[tuple[int, datetime]]) -> list[tuple[JobPublic, str]]:
    """The jobs' snapshots as of their `updated_at` and their JSON: those another stream read already, the rest in
    three queries (jobs, their tasks, which have an artifact), not two more per job."""
    by_id = {i: hit for i, at in changed if (hit := _SNAPSHOTS.get(url, i, at)) is not None}
    missing = [i for i, _ in changed if i not in by_id]
    if missing:
        with session_scope(url, API_CONNECTIONS) as s:
            jobs = s.scalars(select(Job).where(Job.id.in_(missing)).options(selectinload(Job.tasks))).all()
            with_artifact = Artifact.where_jobs(s, [j.id for j in jobs])
            for j in jobs:
                snapshot = JobPublic.model_validate(j)
                snapshot.has_artifact = j.id in with_artifact
                by_id[j.id] = _SNAPSHOTS.put(url, snapshot)
    return [by_id[i] for i, _ in changed if i in by_id]


async def _list_events(url: str, since: datetime | None, owner: Owner | None,
                       watch: TokenWatch) -> AsyncIterator[bytes]:
    yield format_sse_event(comment="jobs", retry=RETRY_MS)
    sent: dict[int, datetime] = {}  # job id -> the updated_at last sent, within the overlap window
    watermark = since
    if since is None:
        # a first connection starts from now: what is already there, the client reads from GET /jobs
        rows, watermark = await _in_thread(_changed_jobs, url, None, owner)
        sent = dict(rows)
    last_write = monotonic()
    while True:
        async for polled in _poll(_changed_jobs, url, watermark, owner):
            if isinstance(polled, bytes):
                yield polled
            else:
                rows, newest = polled
        changed = [(i, at) for i, at in rows if sent.get(i) != at]
        if changed:
            async for polled in _poll(_read_snapshots, url, changed):
                if isinstance(polled, bytes):
                    yield polled
                else:
                    snapshots = polled
            for job, data in snapshots:
                yield _event("job", data, job.updated_at.replace(tzinfo=None).isoformat())
            sent.update(changed)
            last_write = monotonic()
        if newest is not None:
            watermark = newest
            sent = {i: at for i, at in sent.items() if at > newest - LIST_OVERLAP}
        if monotonic() - last_write >= HEARTBEAT_SECONDS:
            yield b": ping\n\n"
            last_write = monotonic()
        if watch.due() and await _in_thread(watch.revoked):
            yield _REVOKED
            return
        await anyio.sleep(POLL_SECONDS)


@router.get("/events", response_class=StreamingResponse, responses=_SSE_DOC | errors(400, 429))
async def stream_jobs_events(request: Request, settings: SettingsDep, caller: ReadCaller) -> StreamingResponse:
    """Live jobs list: a job snapshot each time any job changes (submitted, claimed, progressed, finished).

    Capped like the job streams (`ALTUNE_MAX_STREAMS`, `ALTUNE_MAX_STREAMS_PER_TOKEN`); it ends when its token is
    revoked.
    """
    url = settings.resolved_database_url
    since = _parse_watermark(request.headers.get("last-event-id"))
    give_back = slots_of(request).take(request, caller, settings)
    return SlotStream(_list_events(url, since, visible_owner(caller, settings), TokenWatch(url, caller)),
                      media_type="text/event-stream", headers=_HEADERS, give_back=give_back)
