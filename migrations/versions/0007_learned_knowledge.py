"""What a target learns across jobs (`tuner.knowledge`): every task's measured program features, and the models.

- knowledge_samples: one row per workload a job measured, its program features and latencies (`Samples.to_bytes`,
  compressed arrays) under the feature version they were computed with; a target's cost model is refit from its
  latest rows of the current version. Append-only: workers finishing at once never contend.
- learned_models: per scope (target and device) and name ("cost_model", or a PPO policy's key), the latest
  model's bytes. A cost model of another feature version is read, ignored with a log line, and replaced.

Revision ID: 0007_learned_knowledge
Revises: 0006_schedule_transfer
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_learned_knowledge"
down_revision = "0006_schedule_transfer"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "knowledge_samples",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("feature_version", sa.String(64), nullable=False),
        sa.Column("workload_key", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_knowledge_samples_scope", "knowledge_samples", ["scope", "feature_version", "id"])
    op.create_table(
        "learned_models",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("scope", "name", name="uq_learned_models_name"),
    )


def downgrade() -> None:
    op.drop_table("learned_models")
    op.drop_index("ix_knowledge_samples_scope", table_name="knowledge_samples")
    op.drop_table("knowledge_samples")
