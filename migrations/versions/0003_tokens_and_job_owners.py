"""API tokens (only their hashes) with per-token limits; jobs record their owner, upload size and takeovers.

Revision ID: 0003_tokens
Revises: 0002_jobs_updated_at
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_tokens"
down_revision = "0002_jobs_updated_at"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.Column("max_queued", sa.Integer(), nullable=True),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("max_trials_per_day", sa.Integer(), nullable=True),
        sa.Column("max_upload_bytes_per_day", sa.BigInteger(), nullable=True),
        sa.UniqueConstraint("name", name="uq_tokens_name"),
        sa.UniqueConstraint("token_hash", name="uq_tokens_token_hash"),
    )
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("owner_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("upload_bytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("takeovers", sa.Integer(), nullable=False, server_default="0"))
        batch_op.create_foreign_key("fk_jobs_owner_id_tokens", "tokens", ["owner_id"], ["id"], ondelete="SET NULL")
        batch_op.create_index("ix_jobs_owner_id", ["owner_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_index("ix_jobs_owner_id")
        batch_op.drop_constraint("fk_jobs_owner_id_tokens", type_="foreignkey")
        batch_op.drop_column("takeovers")
        batch_op.drop_column("upload_bytes")
        batch_op.drop_column("owner_id")
    op.drop_table("tokens")
