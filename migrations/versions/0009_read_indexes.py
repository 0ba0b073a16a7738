"""Indexes for the read path: the dashboard and the API stay fast while jobs of 100,000 trials tune (issue 63).

- trials (job_id, id, task_id, latency_ms): a job's trials in measurement order, what its chart buckets read from
  the index alone (`service.trial_reads.chart`), the event streams' cursor (`id > N`) and paging by id.
- trials (job_id, latency_ms, id): paging by latency, and counting a job's error trials (latency null).
- trials (job_id, stage, id): trials per stage without reading the rows, and the joint / loop-only boundary.
- trials (job_id, created_at): when a job's latest trial was measured, one index probe.
- trials (task_id, latency_ms, id): each task's best trial, one index probe.
- tasks (workload_key): the jobs list's `workload` filter.
- jobs (owner_id, updated_at): the jobs stream of a token that sees only its own jobs.

Revision ID: 0009_read_indexes
Revises: 0008_task_rounds
"""

from __future__ import annotations

from alembic import op

revision = "0009_read_indexes"
down_revision = "0008_task_rounds"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_trials_job_id_id", "trials", ["job_id", "id", "task_id", "latency_ms"]),
    ("ix_trials_job_id_latency_ms", "trials", ["job_id", "latency_ms", "id"]),
    ("ix_trials_job_id_stage", "trials", ["job_id", "stage", "id"]),
    ("ix_trials_job_id_created_at", "trials", ["job_id", "created_at"]),
    ("ix_trials_task_id_latency_ms", "trials", ["task_id", "latency_ms", "id"]),
    ("ix_tasks_workload_key", "tasks", ["workload_key"]),
    ("ix_jobs_owner_id_updated_at", "jobs", ["owner_id", "updated_at"]),
)


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
