"""The usage ledger: one row per submitted job (token, trials, upload bytes, when), kept when the job is
deleted, so that deleting jobs does not reset the daily quotas. Filled from the jobs there are.

Revision ID: 0004_usage_ledger
Revises: 0003_tokens
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_usage_ledger"
down_revision = "0003_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_ledger",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("upload_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["tokens.id"], name="fk_usage_ledger_token_id_tokens",
                                ondelete="CASCADE"),
    )
    op.create_index("ix_usage_ledger_token_id_created_at", "usage_ledger", ["token_id", "created_at"])
    op.execute("INSERT INTO usage_ledger (token_id, job_id, trials, upload_bytes, created_at) "
               "SELECT owner_id, id, budget, upload_bytes, created_at FROM jobs")


def downgrade() -> None:
    op.drop_index("ix_usage_ledger_token_id_created_at", table_name="usage_ledger")
    op.drop_table("usage_ledger")
