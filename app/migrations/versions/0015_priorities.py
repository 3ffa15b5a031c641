"""jobs: priority (0 low, 1 normal, 2 high) and how often preempted; api_keys: a priority cap

The fair-share index of queued jobs gains the priority, after the queue: every level is taken
before the next one down.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_priority", sa.String(8), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("preempted", sa.Integer(), nullable=False, server_default="0"))
        batch_op.drop_index("ix_jobs_queued_by_owner")
        batch_op.create_index(
            "ix_jobs_queued_by_owner",
            ["hardware", "framework", "devices", "priority", "owner_id", "created_at"],
            unique=False,
            postgresql_where=sa.text("status = 'queued'"),
            sqlite_where=sa.text("status = 'queued'"),
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_queued_by_owner")
        batch_op.create_index(
            "ix_jobs_queued_by_owner",
            ["hardware", "framework", "devices", "owner_id", "created_at"],
            unique=False,
            postgresql_where=sa.text("status = 'queued'"),
            sqlite_where=sa.text("status = 'queued'"),
        )
        batch_op.drop_column("preempted")
        batch_op.drop_column("priority")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("max_priority")
