"""The read side of a job's trials, as the dashboard asks for it: pages by cursor, the chart downsampled in SQL,
each task's best trial, trials per stage.

A job may have 100,000 trials, so nothing here reads all of its rows: a page is one indexed range query of at
most `limit + 1` rows (keyset: after the cursor, never `OFFSET`), the chart one aggregate over the index
(job_id, id, task_id, latency_ms) that returns at most `points` x tasks groups, and the counts read the indexes of
`0009_read_indexes` without touching the rows (their JSON configurations stay on disk).

Cursors are opaque strings to clients: `"<id>"` when paging by id; when paging by latency `"<latency>:<id>"` for a
measured trial and `"e:<id>"` for an error trial (error trials come after the measured ones, by id).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from sqlalchemy import ColumnElement, Select, func, or_, select, tuple_
from sqlalchemy.orm import Session

from service.models import Job, TrialRow, TuningTask

TrialSort = Literal["id", "latency"]
TrialStatus = Literal["all", "ok", "error"]
MAX_ID = 2**31 - 1
# `web/static/util.js` isTimeout: /time ?out|timed out/i
TIMEOUT_PATTERNS = ("%timeout%", "%time out%", "%timed out%")
TASK_GROUPS = 10_000  # (bucket, task) groups read for the tasks' best-so-far steps, at most


@dataclass(frozen=True)
class Cursor:
    """Where a page ended: the last trial's id and, paging by latency, its latency (None: an error trial)."""

    id: int
    latency_ms: float | None = None

    def encode(self, sort: TrialSort) -> str:
        if sort == "id":
            return str(self.id)
        return f"e:{self.id}" if self.latency_ms is None else f"{self.latency_ms!r}:{self.id}"

    @classmethod
    def decode(cls, text: str, sort: TrialSort) -> Cursor:
        """The cursor a page's `next` gave.

        Raises:
            ValueError: not a cursor of this sort, saying what one looks like.
        """
        how = "a trial id" if sort == "id" else "<latency>:<id> or e:<id>"
        try:
            if sort == "id":
                cursor = cls(int(text))
            else:
                latency, _, ident = text.rpartition(":")
                cursor = cls(int(ident), None if latency == "e" else float(latency))
        except ValueError:
            raise ValueError(f"cursor must be {how} (the `next` of the page before), got {text!r}") from None
        if not 0 <= cursor.id <= MAX_ID or (cursor.latency_ms is not None and not math.isfinite(cursor.latency_ms)):
            raise ValueError(f"cursor must be {how} (the `next` of the page before), got {text!r}")
        return cursor


def _status(status: TrialStatus) -> ColumnElement[bool] | None:
    if status == "ok":
        return TrialRow.latency_ms.is_not(None)
    if status == "error":
        return TrialRow.latency_ms.is_(None)
    return None


def count_trials(session: Session, job_id: int, status: TrialStatus = "all") -> int:
    """The job's trials (measured ones, error ones, or all), counted on an index."""
    query = select(func.count()).select_from(TrialRow).where(TrialRow.job_id == job_id)
    condition = _status(status)
    if condition is not None:
        query = query.where(condition)
    return session.scalar(query) or 0


def _by_id(job_id: int, desc: bool, after: int | None, condition: ColumnElement[bool] | None) -> Select:
    query = select(TrialRow).where(TrialRow.job_id == job_id)
    if condition is not None:
        query = query.where(condition)
    if after is not None:
        query = query.where(TrialRow.id < after if desc else TrialRow.id > after)
    return query.order_by(TrialRow.id.desc() if desc else TrialRow.id)


def where_page(session: Session, job_id: int, *, limit: int, sort: TrialSort = "id", desc: bool = False,
               status: TrialStatus = "all", cursor: Cursor | None = None, offset: int = 0,
               ) -> tuple[list[TrialRow], Cursor | None]:
    """A page of the job's trials after `cursor`, and the cursor of the next page (None: this is the last).

    By id: measurement order (`offset` skips rows first, the older way of paging; by id only). By latency: the
    measured trials fastest first (`desc`: slowest first), ties by id, then the error trials by id. Each query
    reads at most `limit + 1` rows along an index.
    """
    assert offset == 0 or sort == "id", f"{offset=} pages by id only, not by {sort}"
    want = limit + 1  # one more than asked: whether a next page exists
    if sort == "id" or status == "error":
        query = _by_id(job_id, desc, None if cursor is None else cursor.id, _status(status))
        rows = list(session.scalars(query.limit(want).offset(offset)))
    else:
        rows = []
        if cursor is None or cursor.latency_ms is not None:
            query = select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.latency_ms.is_not(None))
            if cursor is not None:
                key, at = tuple_(TrialRow.latency_ms, TrialRow.id), tuple_(cursor.latency_ms, cursor.id)
                query = query.where(key < at if desc else key > at)
            order = (TrialRow.latency_ms.desc(), TrialRow.id.desc()) if desc else (TrialRow.latency_ms, TrialRow.id)
            rows = list(session.scalars(query.order_by(*order).limit(want)))
        if len(rows) < want and status == "all":
            after = cursor.id if cursor is not None and cursor.latency_ms is None else None
            query = _by_id(job_id, desc, after, TrialRow.latency_ms.is_(None))
            rows += session.scalars(query.limit(want - len(rows)))
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], Cursor(last.id, last.latency_ms if sort == "latency" and status != "error" else None)


@dataclass(frozen=True)
class ChartPoint:
    """A bucket of consecutive trials (numbered from 1 in measurement order): their fastest and slowest latency,
    how many failed, and the best latency of the job up to the bucket's last trial."""

    first: int
    last: int
    errors: int
    min_ms: float | None
    max_ms: float | None
    best_ms: float | None


@dataclass(frozen=True)
class TaskBest:
    """A task's best latency so far improved in the bucket ending at trial `last`."""

    task_id: int
    last: int
    best_ms: float


@dataclass(frozen=True)
class Chart:
    """A job's search curve in at most `points` buckets, and what its page shows beside it."""

    count: int
    last_id: int  # the newest trial counted: an event stream resumed from it misses nothing
    points: list[ChartPoint] = field(default_factory=list)
    task_best: list[TaskBest] = field(default_factory=list)
    stage_boundary: int | None = None  # the first loop-only trial after joint ones
    stages: dict[str, int] = field(default_factory=dict)
    timeouts: int = 0


def chart(session: Session, job_id: int, points: int) -> Chart:
    """The job's trials in at most `points` buckets of consecutive ids, from aggregates over an index.

    Buckets are ranges of trial ids (`width` ids each), so grouping needs no row numbers; a trial's number is
    the count of the job's trials before its bucket plus its place in it. Only trials up to the newest id read
    first are counted, so the figures agree with each other while workers write.
    """
    lo, hi = session.execute(select(func.min(TrialRow.id), func.max(TrialRow.id))
                             .where(TrialRow.job_id == job_id)).one()
    if lo is None:
        return Chart(count=0, last_id=0)
    width = max(1, math.ceil((hi - lo + 1) / points))
    mine = (TrialRow.job_id == job_id) & (TrialRow.id <= hi)
    bucket = ((TrialRow.id - lo) // width).label("bucket")
    rows = session.execute(
        select(bucket, func.count(), func.count(TrialRow.latency_ms), func.min(TrialRow.latency_ms),
               func.max(TrialRow.latency_ms)).where(mine).group_by(bucket)
    ).all()
    rows.sort(key=lambda r: r.bucket)
    out: list[ChartPoint] = []
    ends: list[tuple[int, int]] = []  # (bucket, the number of its last trial)
    seen = 0
    best: float | None = None
    for b, total, measured, low, high in rows:
        if low is not None and (best is None or low < best):
            best = low
        out.append(ChartPoint(seen + 1, seen + total, total - measured, low, high, best))
        seen += total
        ends.append((b, seen))
    stages = session.execute(select(TrialRow.stage, func.count()).where(mine).group_by(TrialRow.stage)).all()
    timeouts = session.scalar(select(func.count()).select_from(TrialRow).where(
        mine, TrialRow.latency_ms.is_(None), or_(*(TrialRow.error.ilike(p) for p in TIMEOUT_PATTERNS)))) or 0
    task_ids = list(session.scalars(select(TuningTask.id).where(TuningTask.job_id == job_id)))
    if len(task_ids) == 1:  # the job's steps are its one task's: no second pass over the index
        steps = [TaskBest(task_ids[0], p.last, p.best_ms) for i, p in enumerate(out)
                 if p.best_ms is not None and (i == 0 or p.best_ms != out[i - 1].best_ms)]
    else:
        steps = _task_steps(session, mine, lo, width, len(task_ids), ends)
    return Chart(count=seen, last_id=hi, points=out, task_best=steps,
                 stage_boundary=_stage_boundary(session, mine), stages={s: n for s, n in stages}, timeouts=timeouts)


def _task_steps(session: Session, mine: ColumnElement[bool], lo: int, width: int, tasks: int,
                ends: list[tuple[int, int]]) -> list[TaskBest]:
    """Where each task's best latency improved, at the chart's buckets; for a job of many tasks at coarser ones
    (`factor` buckets each), so that at most `TASK_GROUPS` (bucket, task) groups are read."""
    factor = max(1, math.ceil(tasks * len(ends) / TASK_GROUPS))
    last_of = {b // factor: end for b, end in ends}  # ascending: the coarse bucket's last trial wins
    coarse = ((TrialRow.id - lo) // (width * factor)).label("coarse")
    groups = session.execute(
        select(coarse, TrialRow.task_id, func.min(TrialRow.latency_ms))
        .where(mine, TrialRow.latency_ms.is_not(None)).group_by(coarse, TrialRow.task_id)
    ).all()
    groups.sort(key=lambda g: (g.coarse, g.task_id))
    steps: list[TaskBest] = []
    best: dict[int, float] = {}
    for c, task_id, low in groups:
        if task_id not in best or low < best[task_id]:
            best[task_id] = low
            steps.append(TaskBest(task_id, last_of[c], low))
    return steps


def _stage_boundary(session: Session, mine: ColumnElement[bool]) -> int | None:
    """The number of the first loop-only trial measured after a joint-stage one (three index probes), or None."""
    joint = session.scalar(select(func.min(TrialRow.id)).where(mine, TrialRow.stage == "joint"))
    if joint is None:
        return None
    loop = session.scalar(select(func.min(TrialRow.id)).where(mine, TrialRow.stage == "loop", TrialRow.id > joint))
    if loop is None:
        return None
    return (session.scalar(select(func.count()).select_from(TrialRow).where(mine, TrialRow.id < loop)) or 0) + 1


def where_best_per_task(session: Session, job_id: int) -> list[TrialRow]:
    """Each task's fastest measured trial (ties: the first), one index probe per task, in task order."""
    best_id = (select(TrialRow.id).where(TrialRow.task_id == TuningTask.id, TrialRow.latency_ms.is_not(None))
               .order_by(TrialRow.latency_ms, TrialRow.id).limit(1).correlate(TuningTask).scalar_subquery())
    ids = select(best_id).where(TuningTask.job_id == job_id)
    rows = session.scalars(select(TrialRow).where(TrialRow.id.in_(ids))).all()
    return sorted(rows, key=lambda t: t.task_id)


def stage_summaries(session: Session, job_ids: list[int]) -> dict[int, tuple[dict[str, int], datetime | None]]:
    """Trials per stage of each job and when its latest trial was measured (jobs without trials are absent).

    Two queries for a whole page of jobs: the counts read the index (job_id, stage, id) alone, the latest time is
    one probe of (job_id, created_at) per job; neither reads a trial's row.
    """
    if not job_ids:
        return {}
    counts = session.execute(select(TrialRow.job_id, TrialRow.stage, func.count())
                             .where(TrialRow.job_id.in_(job_ids)).group_by(TrialRow.job_id, TrialRow.stage)).all()
    newest = (select(func.max(TrialRow.created_at)).where(TrialRow.job_id == Job.id).correlate(Job)
              .scalar_subquery())
    latest = {job_id: at for job_id, at in session.execute(select(Job.id, newest).where(Job.id.in_(job_ids)))}
    out: dict[int, tuple[dict[str, int], datetime | None]] = {}
    for job_id, stage, n in counts:
        out.setdefault(job_id, ({}, latest.get(job_id)))[0][stage] = n
    return out
