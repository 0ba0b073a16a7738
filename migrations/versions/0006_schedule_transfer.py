"""What a stored schedule needs to be served without measuring and carried to other shapes.

- schedules.default_ms: the task's default schedule's latency when the schedule was measured, so that a later job
  serves the stored schedule unmeasured only where it beat the default one (None on rows from before: served).
- schedules.signature and schedules.extents: the task's transfer signature and loop extents (`tuner.transfer`),
  so that a workload of the same form with other shapes starts from the nearest stored schedule; indexed by
  target and signature, the lookup a model job makes per task.

Revision ID: 0006_schedule_transfer
Revises: 0005_worker_state
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_schedule_transfer"
down_revision = "0005_worker_state"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("default_ms", sa.Float(), nullable=True))
        batch.add_column(sa.Column("signature", sa.String(64), nullable=True))
        batch.add_column(sa.Column("extents", sa.JSON(), nullable=True))
    op.create_index("ix_schedules_signature", "schedules", ["target_key", "signature"])


def downgrade() -> None:
    op.drop_index("ix_schedules_signature", table_name="schedules")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("extents")
        batch.drop_column("signature")
        batch.drop_column("default_ms")
