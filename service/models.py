"""ORM models: jobs, tasks, trials, schedules, artifacts, API tokens, and the usage ledger the quotas count.

Query helpers live on the classes with fixed verbs: `find_by_*` returns None,
`find_or_raise_by_*` raises KeyError, `where_*` returns a list. They take the
session as their first argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON, BigInteger, Boolean, ColumnElement, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Text,
    UniqueConstraint, func, or_, select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship, selectinload

from service.db import utcnow

JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
SCOPES = ("read", "write", "admin")  # each implies the ones before it
FINISHED = ("succeeded", "failed", "cancelled")


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[float]: JSON}


def _insert(session: Session) -> Any:
    """The dialect's `insert` (with `on_conflict_do_update`): PostgreSQL's or SQLite's."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert
    if dialect == "sqlite":
        return sqlite.insert
    raise ValueError(f"unsupported database: {dialect}")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]]
    target: Mapped[str] = mapped_column(String(32))
    budget: Mapped[int]
    status: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    trials_done: Mapped[int] = mapped_column(default=0)
    errors: Mapped[int] = mapped_column(default=0)
    best_latency_ms: Mapped[float | None] = mapped_column(Float)
    baseline_ms: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime)
    attempts: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow, index=True)
    owner_id: Mapped[int | None] = mapped_column(
        ForeignKey("tokens.id", ondelete="SET NULL", name="fk_jobs_owner_id_tokens"), index=True)
    upload_bytes: Mapped[int] = mapped_column(BigInteger, default=0)  # the model file uploaded with it (quota)
    takeovers: Mapped[int] = mapped_column(default=0)  # claims of the job from a worker whose lease had expired
    # what the worker computed, never written into the user's spec: a model job's report (the whole-model check,
    # latencies, the joint stage) and the channel blocks its joint stage chose (a resumed job keeps them)
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    layout_blocks: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    tasks: Mapped[list[TuningTask]] = relationship(back_populates="job", order_by="TuningTask.id")

    @classmethod
    def find_by_id(cls, session: Session, job_id: int) -> Job | None:
        return session.get(cls, job_id)

    @classmethod
    def find_or_raise_by_id(cls, session: Session, job_id: int) -> Job:
        job = session.get(cls, job_id)
        if job is None:
            raise KeyError(f"job {job_id} not found")
        return job

    @classmethod
    def where_filter(
        cls, session: Session, *, status: str | None = None, workload: str | None = None, limit: int = 50,
        offset: int = 0, owner: Owner | None = None,
    ) -> tuple[list[Job], int]:
        """A page of jobs, newest first, in a status and/or with a task of a workload key, and their count.

        `owner`: only the jobs of this owner (`Owner(None)`: those submitted anonymously).
        """
        query = select(cls)
        if owner is not None:
            query = query.where(cls.owned_by(owner.token_id))
        if status:
            query = query.where(cls.status == status)
        if workload:
            query = query.where(cls.id.in_(select(TuningTask.job_id).where(TuningTask.workload_key == workload)))
        count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
        # the tasks of the whole page in one more query, not one per job when they are shown
        rows = session.scalars(
            query.order_by(cls.id.desc()).limit(limit).offset(offset).options(selectinload(cls.tasks))
        ).all()
        return list(rows), count

    @classmethod
    def owned_by(cls, token_id: int | None) -> ColumnElement[bool]:
        """The condition "submitted with this token" (None: anonymously, or before tokens existed)."""
        return cls.owner_id.is_(None) if token_id is None else cls.owner_id == token_id


# the jobs stream of a token that sees only its own jobs (`ALTUNE_JOBS_VISIBLE=own`): its changes since a moment
Index("ix_jobs_owner_id_updated_at", Job.owner_id, Job.updated_at)

# the claimable jobs (`service.worker`): a claim reads this, not the finished jobs before them
_CLAIMABLE = Job.status.in_(("queued", "running"))
Index("ix_jobs_claimable", Job.id, postgresql_where=_CLAIMABLE, sqlite_where=_CLAIMABLE)


@dataclass(frozen=True)
class Owner:
    """Whose jobs: a token's id, or None for the anonymous ones."""

    token_id: int | None


class Token(Base):
    """An API token: only its SHA-256 is stored; scope and per-token limits (None: the server's default)."""

    __tablename__ = "tokens"
    __table_args__ = (UniqueConstraint("name", name="uq_tokens_name"),
                      UniqueConstraint("token_hash", name="uq_tokens_token_hash"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(8))
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime)
    max_queued: Mapped[int | None]
    max_running: Mapped[int | None]
    max_trials_per_day: Mapped[int | None]
    max_upload_bytes_per_day: Mapped[int | None] = mapped_column(BigInteger)

    @classmethod
    def find_by_hash(cls, session: Session, token_hash: str) -> Token | None:
        return session.scalar(select(cls).where(cls.token_hash == token_hash))

    @classmethod
    def find_by_id_or_name(cls, session: Session, ref: str) -> Token | None:
        """The token with this id (all digits) or name."""
        if ref.isdigit():
            return session.get(cls, int(ref))
        return session.scalar(select(cls).where(cls.name == ref))

    @classmethod
    def where_all(cls, session: Session) -> list[Token]:
        return list(session.scalars(select(cls).order_by(cls.id)).all())

    @classmethod
    def any_exists(cls, session: Session) -> bool:
        return session.scalar(select(cls.id).limit(1)) is not None


class Usage(Base):
    """What a submission counted against its token's daily quotas: one row per job, written in the job's
    transaction and never deleted with it (deleting a job must not give its trials or bytes back)."""

    __tablename__ = "usage_ledger"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_id: Mapped[int | None] = mapped_column(
        ForeignKey("tokens.id", ondelete="CASCADE", name="fk_usage_ledger_token_id_tokens"))
    job_id: Mapped[int | None]  # no foreign key: the row outlives its job
    trials: Mapped[int]
    upload_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)

    @classmethod
    def record(cls, session: Session, job: Job) -> Usage:
        """The ledger row of a new (flushed) job: its owner, budget and uploaded bytes."""
        row = cls(token_id=job.owner_id, job_id=job.id, trials=job.budget, upload_bytes=job.upload_bytes or 0)
        session.add(row)
        session.flush()
        return row

    @classmethod
    def totals_since(cls, session: Session, token_id: int | None, since: datetime) -> tuple[int, int]:
        """Trials and upload bytes a token (None: anonymous requests) submitted from `since` on."""
        who = cls.token_id.is_(None) if token_id is None else cls.token_id == token_id
        trials, uploaded = session.execute(
            select(func.coalesce(func.sum(cls.trials), 0), func.coalesce(func.sum(cls.upload_bytes), 0))
            .where(who, cls.created_at >= since)
        ).one()
        return int(trials), int(uploaded)


Index("ix_usage_ledger_token_id_created_at", Usage.token_id, Usage.created_at)


class TuningTask(Base):
    """One workload to tune within a job (an operator job has one; a model job one per fused subgraph)."""

    __tablename__ = "tasks"
    __table_args__ = (UniqueConstraint("job_id", "index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    index: Mapped[int]
    name: Mapped[str] = mapped_column(String(128))
    workload_key: Mapped[str] = mapped_column(Text)
    weight: Mapped[int] = mapped_column(default=1)
    budget: Mapped[int]
    trials_done: Mapped[int] = mapped_column(default=0)
    best_latency_ms: Mapped[float | None] = mapped_column(Float)
    baseline_ms: Mapped[float | None] = mapped_column(Float)
    best_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    job: Mapped[Job] = relationship(back_populates="tasks")

    @classmethod
    def where_job(cls, session: Session, job_id: int) -> list[TuningTask]:
        return list(session.scalars(select(cls).where(cls.job_id == job_id).order_by(cls.index)).all())


Index("ix_tasks_workload_key", TuningTask.workload_key)  # the jobs list's `workload` filter


class TrialRow(Base):
    """One on-device measurement of one configuration."""

    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("task_id", "index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    index: Mapped[int]
    config: Mapped[dict[str, Any]]
    latencies_ms: Mapped[list[float] | None] = mapped_column(JSON)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    predicted: Mapped[float | None] = mapped_column(Float)
    stage: Mapped[str] = mapped_column(String(16), default="loop")
    extra: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)

    @classmethod
    def where_task(cls, session: Session, task_id: int) -> list[TrialRow]:
        return list(session.scalars(select(cls).where(cls.task_id == task_id).order_by(cls.index)).all())

    @classmethod
    def stage_summary(cls, session: Session, job_id: int) -> tuple[dict[str, int], datetime | None]:
        """Trials per stage of a job, and when its last trial was measured."""
        rows = session.execute(
            select(cls.stage, func.count(), func.max(cls.created_at)).where(cls.job_id == job_id).group_by(cls.stage)
        ).all()
        return {stage: n for stage, n, _ in rows}, max((last for _, _, last in rows), default=None)

    @classmethod
    def stage_summaries(cls, session: Session, job_ids: list[int]) -> dict[int, tuple[dict[str, int], datetime | None]]:
        """`stage_summary` of several jobs in one query (jobs without trials are absent)."""
        rows = session.execute(
            select(cls.job_id, cls.stage, func.count(), func.max(cls.created_at))
            .where(cls.job_id.in_(job_ids)).group_by(cls.job_id, cls.stage)
        ).all()
        out: dict[int, tuple[dict[str, int], datetime | None]] = {}
        for job_id, stage, n, last in rows:
            stages, newest = out.get(job_id, ({}, None))
            stages[stage] = n
            out[job_id] = (stages, max(newest, last) if newest is not None else last)
        return out

    @classmethod
    def where_job(cls, session: Session, job_id: int, limit: int, offset: int) -> tuple[list[TrialRow], int]:
        rows = session.scalars(
            select(cls).where(cls.job_id == job_id).order_by(cls.task_id, cls.index).limit(limit).offset(offset)
        ).all()
        count = session.scalar(select(func.count()).select_from(cls).where(cls.job_id == job_id)) or 0
        return list(rows), count


# The read path (0009_read_indexes): a job's trials by id with what its chart needs (the streams' cursor, paging in
# measurement order, the chart's buckets, read from the index alone), by latency (paging by latency, counting
# errors), by stage (stage counts, the joint / loop-only boundary), its newest trial, and each task's best.
Index("ix_trials_job_id_id", TrialRow.job_id, TrialRow.id, TrialRow.task_id, TrialRow.latency_ms)
Index("ix_trials_job_id_latency_ms", TrialRow.job_id, TrialRow.latency_ms, TrialRow.id)
Index("ix_trials_job_id_stage", TrialRow.job_id, TrialRow.stage, TrialRow.id)
Index("ix_trials_job_id_created_at", TrialRow.job_id, TrialRow.created_at)
Index("ix_trials_task_id_latency_ms", TrialRow.task_id, TrialRow.latency_ms, TrialRow.id)


@dataclass(frozen=True)
class ScheduleKey:
    """What makes a stored schedule valid for a task: the workload, the target, where it is measured (a device key
    of the RPC tracker; "" on the worker's own CPU), the TIR pipeline it is built with, and the version of the
    search spaces whose configuration it is (`tuner.SPACE_VERSION`: a row of another version is ignored)."""

    workload_key: str
    target_key: str
    device: str = ""
    pipeline: str = "licm"
    space_version: int = 0

    def where(self) -> ColumnElement[bool]:
        return ((Schedule.workload_key == self.workload_key) & (Schedule.target_key == self.target_key)
                & (Schedule.device == self.device) & (Schedule.pipeline == self.pipeline)
                & (Schedule.space_version == self.space_version))


class Schedule(Base):
    """The best known configuration of a workload on a target (device, pipeline, space version: `ScheduleKey`)."""

    __tablename__ = "schedules"
    __table_args__ = (UniqueConstraint("workload_key", "target_key", "device", "pipeline", "space_version",
                                       name="uq_schedules_key"),
                      Index("ix_schedules_signature", "target_key", "signature"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_key: Mapped[str] = mapped_column(Text, index=True)
    target_key: Mapped[str] = mapped_column(Text)
    device: Mapped[str] = mapped_column(Text, default="")
    pipeline: Mapped[str] = mapped_column(String(16), default="licm")
    space_version: Mapped[int] = mapped_column(Integer, default=0)
    config: Mapped[dict[str, Any]]
    latency_ms: Mapped[float] = mapped_column(Float)
    # the task's default schedule's latency then (None: not measured): served unmeasured only where it won
    default_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    # `tuner.transfer`: workloads of one form share a signature; their loop extents say how near they are
    signature: Mapped[str | None] = mapped_column(String(64), nullable=True)
    extents: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)

    @classmethod
    def find_by_key(cls, session: Session, key: ScheduleKey) -> Schedule | None:
        return session.scalar(select(cls).where(key.where()))

    @classmethod
    def upsert_if_faster(cls, session: Session, key: ScheduleKey, config: dict[str, Any], latency_ms: float,
                         job_id: int | None, *, default_ms: float | None = None, signature: str | None = None,
                         extents: list[int] | None = None) -> None:
        """Store the configuration unless the known one for `key` is at least as fast (with the task's default
        schedule's latency and its transfer signature and extents, when known).

        One `INSERT ... ON CONFLICT DO UPDATE ... WHERE` statement, so two workers finishing the same
        workload at once never collide on the unique key: the faster configuration stays, whatever the order.
        """
        stmt = _insert(session)(cls).values(workload_key=key.workload_key, target_key=key.target_key, device=key.device,
                                  pipeline=key.pipeline, space_version=key.space_version, config=config,
                                  latency_ms=latency_ms, job_id=job_id, updated_at=utcnow(), default_ms=default_ms,
                                  signature=signature, extents=extents)
        session.execute(stmt.on_conflict_do_update(
            index_elements=[cls.workload_key, cls.target_key, cls.device, cls.pipeline, cls.space_version],
            set_={"config": stmt.excluded.config, "latency_ms": stmt.excluded.latency_ms,
                  "job_id": stmt.excluded.job_id, "updated_at": stmt.excluded.updated_at,
                  "default_ms": stmt.excluded.default_ms, "signature": stmt.excluded.signature,
                  "extents": stmt.excluded.extents},
            where=stmt.excluded.latency_ms < cls.latency_ms,
        ))

    @classmethod
    def of_signature(cls, session: Session, key: ScheduleKey, signature: str, limit: int = 256) -> list[Schedule]:
        """The schedules of workloads sharing a transfer `signature`, valid where `key` is but for the workload
        (target, device, pipeline, space version), fastest first."""
        return list(session.scalars(select(cls).where(
            (cls.signature == signature) & (cls.target_key == key.target_key) & (cls.device == key.device)
            & (cls.pipeline == key.pipeline) & (cls.space_version == key.space_version),
        ).order_by(cls.latency_ms).limit(limit)))

    @classmethod
    def where_filter(
        cls,
        session: Session,
        *,
        workload: str | None = None,
        search: str | None = None,
        target_key: str | None = None,
        target_kind: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[Schedule], int]:
        """Schedules matching an exact workload key and/or a substring of it, an exact target key or a target kind
        ("llvm": every CPU target), newest first, and their count."""
        query = select(cls)
        if workload:
            query = query.where(cls.workload_key == workload)
        if search:
            query = query.where(cls.workload_key.contains(search))
        if target_key:
            query = query.where(cls.target_key == target_key)
        if target_kind:
            query = query.where(or_(cls.target_key == target_kind, cls.target_key.startswith(f"{target_kind} ")))
        count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
        rows = session.scalars(query.order_by(cls.updated_at.desc()).limit(limit).offset(offset)).all()
        return list(rows), count


class TaskRound(Base):
    """A round of a model job's task ("measure n more candidates"), claimed by any worker under a lease
    (`service.rounds`)."""

    __tablename__ = "task_rounds"
    __table_args__ = (Index("ix_task_rounds_job_status", "job_id", "status"),
                      Index("ix_task_rounds_status_id", "status", "id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default="queued")  # queued | running | done | cancelled
    payload: Mapped[dict[str, Any]]
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    worker_id: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime)
    attempts: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)


class WorkerRow(Base):
    """A worker process while it lives: `seen_at` renewed every third of a lease (`service.worker`)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)

    @classmethod
    def seen(cls, session: Session, worker_id: str, now: datetime) -> None:
        """Record that the worker lives (its row added on the first call)."""
        insert = _insert(session)
        session.execute(insert(cls).values(id=worker_id, started_at=now, seen_at=now)
                        .on_conflict_do_update(index_elements=[cls.id], set_={"seen_at": now}))

    @classmethod
    def live(cls, session: Session, since: datetime) -> int:
        """Workers seen since `since`."""
        return session.scalar(select(func.count()).select_from(cls).where(cls.seen_at >= since)) or 0


class Artifact(Base):
    """A compiled, downloadable result of a job."""

    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    path: Mapped[str] = mapped_column(Text)
    size: Mapped[int]
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)

    @classmethod
    def find_by_job(cls, session: Session, job_id: int) -> Artifact | None:
        return session.scalar(select(cls).where(cls.job_id == job_id))

    @classmethod
    def where_jobs(cls, session: Session, job_ids: list[int]) -> set[int]:
        """The ids among `job_ids` of the jobs that have an artifact."""
        return set(session.scalars(select(cls.job_id).where(cls.job_id.in_(job_ids))).all())


class KnowledgeSample(Base):
    """One workload's measurements in one job, as the target's cost model learns from them (`tuner.knowledge.Samples`:
    program features and latencies, compressed), under the feature version they were computed with."""

    __tablename__ = "knowledge_samples"
    __table_args__ = (Index("ix_knowledge_samples_scope", "scope", "feature_version", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scope: Mapped[str] = mapped_column(Text)  # `service.knowledge.scope_of`: target and device
    feature_version: Mapped[str] = mapped_column(String(64))
    workload_key: Mapped[str] = mapped_column(Text)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    rows: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)

    @classmethod
    def where_latest(cls, session: Session, scope: str, feature_version: str, max_rows: int) -> list[KnowledgeSample]:
        """The newest samples of `scope` and `feature_version` holding about `max_rows` rows in all, oldest first."""
        out, rows = [], 0
        for sample in session.scalars(select(cls).where((cls.scope == scope) & (cls.feature_version == feature_version))
                                      .order_by(cls.id.desc()).execution_options(yield_per=256)):
            out.append(sample)
            rows += sample.rows
            if rows >= max_rows:
                break
        return out[::-1]


class LearnedModel(Base):
    """The latest learned model of a scope (target and device) by name: "cost_model" or a PPO policy's key."""

    __tablename__ = "learned_models"
    __table_args__ = (UniqueConstraint("scope", "name", name="uq_learned_models_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scope: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    rows: Mapped[int] = mapped_column(Integer)  # training rows (a cost model's) or updates (a policy's)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)

    @classmethod
    def where_scope(cls, session: Session, scope: str) -> list[LearnedModel]:
        return list(session.scalars(select(cls).where(cls.scope == scope)))

    @classmethod
    def upsert(cls, session: Session, scope: str, name: str, data: bytes, rows: int, job_id: int | None) -> None:
        """Store `data` as the model of (scope, name), replacing the one before (the latest job's wins)."""
        stmt = _insert(session)(cls).values(scope=scope, name=name, data=data, rows=rows, job_id=job_id,
                                            updated_at=utcnow())
        session.execute(stmt.on_conflict_do_update(
            index_elements=[cls.scope, cls.name],
            set_={"data": stmt.excluded.data, "rows": stmt.excluded.rows, "job_id": stmt.excluded.job_id,
                  "updated_at": stmt.excluded.updated_at}))
