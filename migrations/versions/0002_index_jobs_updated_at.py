"""Index jobs.updated_at: the jobs event stream asks for rows changed since a moment.

Revision ID: 0002_jobs_updated_at
Revises: 0001_initial
"""

from __future__ import annotations

from alembic import op

revision = "0002_jobs_updated_at"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.create_index("ix_jobs_updated_at", ["updated_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_index("ix_jobs_updated_at")
