"""indexes for the counts of every POST /jobs: a key's queued jobs (quota), and a queue's queued jobs
(queue_position), so neither reads the queued jobs of every key and queue

Revision ID: 0008
Revises: 0007
"""

from alembic import op
import sqlalchemy as sa

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_owner_id_status", ["owner_id", "status"], unique=False)
        batch_op.create_index("ix_jobs_queued", ["hardware", "framework", "created_at"], unique=False,
                              postgresql_where=sa.text("status = 'queued'"), sqlite_where=sa.text("status = 'queued'"))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_queued")
        batch_op.drop_index("ix_jobs_owner_id_status")
