"""Prometheus metrics computed from the database when scraped, so they are right with any number of API
processes and workers: every value is a query over the rows the workers write, none is a counter in memory.

- `altune_jobs{state}` (gauge): jobs by state, every state present (0 when none).
- `altune_trials_measured_total` (counter): trials stored; `rate()` of it is trials per second.
- `altune_measurement_errors_total` (counter): trials that failed (build, crash, timeout, wrong result).
- `altune_lease_takeovers_total` (counter): claims of a running job whose worker's lease had expired.
- `altune_queue_wait_seconds` (histogram): created -> first started, over every job that has started.
- `altune_oldest_queued_seconds` (gauge): how long the oldest queued job has waited (0: none queued).

The counters are counts of rows: deleting a job (`DELETE /jobs/{id}`) lowers them, which Prometheus reads as
a counter reset.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.orm import Session

from service.db import utcnow
from service.models import JOB_STATUSES, Job, TrialRow

QUEUE_WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)


def _seconds_between(session: Session, start: ColumnElement, end: ColumnElement) -> ColumnElement[float]:
    """`end - start` in seconds, in SQL (each backend spells date arithmetic its own way)."""
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        return (func.julianday(end) - func.julianday(start)) * 86400.0
    if dialect == "postgresql":
        return func.extract("epoch", end - start)
    raise ValueError(f"unsupported database for metrics: {dialect}")


class DatabaseCollector(Collector):
    """Collects every metric above with a handful of aggregate queries on `session`."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration: collect() queries the database

    def collect(self) -> Iterator[Metric]:
        s = self.session
        counts = dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).tuples().all())
        jobs = GaugeMetricFamily("altune_jobs", "jobs by state", labels=["state"])
        for state in JOB_STATUSES:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs

        trials, failed = s.execute(select(func.count(TrialRow.id), func.count(TrialRow.error))).one()
        yield CounterMetricFamily("altune_trials_measured", "trials measured and stored (rate: trials per second)",
                                  value=trials)
        yield CounterMetricFamily("altune_measurement_errors",
                                  "trials that failed to build, crashed, timed out or gave a wrong result",
                                  value=failed)
        takeovers = s.scalar(select(func.coalesce(func.sum(Job.takeovers), 0))) or 0
        yield CounterMetricFamily("altune_lease_takeovers",
                                  "claims of a running job whose worker's lease had expired", value=takeovers)

        wait = _seconds_between(s, Job.created_at, Job.started_at)
        row = s.execute(
            select(func.count(), func.coalesce(func.sum(wait), 0.0),
                   *(func.coalesce(func.sum(case((wait <= bound, 1), else_=0)), 0) for bound in QUEUE_WAIT_BUCKETS))
            .where(Job.started_at.is_not(None))
        ).one()
        started, total, cumulative = row[0], float(row[1]), row[2:]
        yield HistogramMetricFamily(
            "altune_queue_wait_seconds", "seconds from a job's submission to its first start",
            buckets=[*((str(b), n) for b, n in zip(QUEUE_WAIT_BUCKETS, cumulative, strict=True)), ("+Inf", started)],
            sum_value=max(total, 0.0),
        )
        oldest = s.scalar(select(func.min(Job.created_at)).where(Job.status == "queued"))
        yield GaugeMetricFamily("altune_oldest_queued_seconds", "how long the oldest queued job has waited",
                                value=(utcnow() - oldest).total_seconds() if oldest is not None else 0.0)
