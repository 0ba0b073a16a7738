"""The worker's state out of the user's spec, and a schedule key that says what makes a schedule valid.

- jobs.report and jobs.layout_blocks: a model job's report and its joint stage's chosen blocks, which the worker
  used to write into the job's spec (`spec["report"]`, `spec["blocks"]`, `spec["layout_search"]`); moved out of
  the spec of the jobs there are.
- schedules.device, .pipeline and .space_version join the unique key: a schedule is valid for the workload, the
  target, the device it was measured on ("" for the worker's own CPU), the TIR pipeline and the version of the
  search spaces (`tuner.SPACE_VERSION`). Rows from before get version 0, which no current space reads: they stay
  for the record and are never fitted to today's knobs.

Revision ID: 0005_worker_state
Revises: 0004_usage_ledger
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0005_worker_state"
down_revision = "0004_usage_ledger"
branch_labels = None
depends_on = None

SCRATCH = ("report", "blocks", "layout_search")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("report", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("layout_blocks", sa.JSON(), nullable=True))
    bind = op.get_bind()
    jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("spec", sa.JSON),
                    sa.column("report", sa.JSON), sa.column("layout_blocks", sa.JSON))
    for job_id, spec in bind.execute(sa.select(jobs.c.id, jobs.c.spec)).all():
        spec = json.loads(spec) if isinstance(spec, str) else spec
        if not isinstance(spec, dict) or not any(k in spec for k in SCRATCH):
            continue
        report = spec.get("report")
        if spec.get("layout_search") is not None:
            report = {**(report or {}), "layout_search": spec["layout_search"]}
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(
            spec={k: v for k, v in spec.items() if k not in SCRATCH}, report=report,
            layout_blocks=spec.get("blocks")))
    # 0001 left the old key unnamed: PostgreSQL named it itself; SQLite's batch copy names it by the convention
    old = "schedules_workload_key_target_key_key" if bind.dialect.name == "postgresql" else "uq_schedules_workload_key"
    with op.batch_alter_table("schedules", naming_convention={"uq": "uq_%(table_name)s_%(column_0_name)s"}) as batch:
        batch.add_column(sa.Column("device", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("pipeline", sa.String(16), nullable=False, server_default="licm"))
        batch.add_column(sa.Column("space_version", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_constraint(old, type_="unique")
        batch.create_unique_constraint("uq_schedules_key",
                                       ["workload_key", "target_key", "device", "pipeline", "space_version"])


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_constraint("uq_schedules_key", type_="unique")
    op.execute("DELETE FROM schedules WHERE space_version <> 0 OR device <> '' OR pipeline <> 'licm'")
    with op.batch_alter_table("schedules") as batch:
        batch.create_unique_constraint("uq_schedules_workload_key_target_key", ["workload_key", "target_key"])
        batch.drop_column("space_version")
        batch.drop_column("pipeline")
        batch.drop_column("device")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("layout_blocks")
        batch.drop_column("report")
