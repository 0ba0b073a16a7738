"""Rounds of a model job's tasks as leased work (`service.rounds`), and the queue tables' vacuuming.

- task_rounds: one row per round the job's scheduler dispatched ("measure n more candidates of this task"),
  claimed by any worker under a lease like a job (`queued` -> `running` -> `done`, or `cancelled` when the job
  stopped), taken over when its worker's lease runs out. `payload` is the round (`tuner.rounds.Round.to_json`:
  the task's TIR function as TVM's JSON, its start configurations), `result` its untuned latency or error.
- workers: every worker process's presence (`seen_at`, renewed every third of a lease while it lives), so that a
  job's scheduler keeps as many rounds in flight as there are workers to run them.
- jobs: a partial index of the claimable jobs (queued or running), so that a claim does not walk the finished ones.
- PostgreSQL only: the queue tables (jobs, task_rounds) are updated in place all the time (claims, lease renewals,
  counters), so their autovacuum runs after 1% of rows changed rather than 20%, and their pages keep room for
  in-place (HOT) updates; trials are insert-mostly and keep the defaults.

Revision ID: 0008_task_rounds
Revises: 0007_learned_knowledge
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_task_rounds"
down_revision = "0007_learned_knowledge"
branch_labels = None
depends_on = None

QUEUE_TABLES = ("jobs", "task_rounds", "workers")
QUEUE_STORAGE = ("autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 200, "
                 "autovacuum_analyze_scale_factor = 0.02, fillfactor = 70")


def upgrade() -> None:
    op.create_table(
        "task_rounds",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("task_id", sa.Integer(), sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("worker_id", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_task_rounds_job_status", "task_rounds", ["job_id", "status"])
    op.create_index("ix_task_rounds_status_id", "task_rounds", ["status", "id"])
    op.create_table(
        "workers",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("seen_at", sa.DateTime(), nullable=False),
    )
    claimable = sa.text("status IN ('queued', 'running')")
    op.create_index("ix_jobs_claimable", "jobs", ["id"], postgresql_where=claimable, sqlite_where=claimable)
    if op.get_bind().dialect.name == "postgresql":
        for table in QUEUE_TABLES:
            op.execute(f"ALTER TABLE {table} SET ({QUEUE_STORAGE})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE jobs RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, "
                   "autovacuum_analyze_scale_factor, fillfactor)")
    op.drop_index("ix_jobs_claimable", table_name="jobs")
    op.drop_table("workers")
    op.drop_table("task_rounds")
