"""jobs: indexes for the fair share across keys within a queue (app/scheduling.py)

The queued jobs of a queue grouped by key replace the queue's queued jobs by age; a key's
latest claim in a queue is read from its own index.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_queued")
        batch_op.create_index(
            "ix_jobs_queued_by_owner",
            ["hardware", "framework", "devices", "owner_id", "created_at"],
            unique=False,
            postgresql_where=sa.text("status = 'queued'"),
            sqlite_where=sa.text("status = 'queued'"),
        )
        batch_op.create_index(
            "ix_jobs_owner_queue_started", ["owner_id", "hardware", "framework", "devices", "started_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_owner_queue_started")
        batch_op.drop_index("ix_jobs_queued_by_owner")
        batch_op.create_index(
            "ix_jobs_queued",
            ["hardware", "framework", "created_at"],
            unique=False,
            postgresql_where=sa.text("status = 'queued'"),
            sqlite_where=sa.text("status = 'queued'"),
        )
