"""jobs by key, status and creation time: `GET /jobs?status=...` at flat cost

A key's job list filtered by status walked `ix_jobs_created_at` backwards, filtering by key and
status, so its cost grew with how far back the 50th match lay (a full scan for a status with
fewer than 50 jobs: 46 ms at 10^6 jobs for a rare one, bench/scale.py). This index serves it
directly; its prefix (owner_id, status) serves everything `ix_jobs_owner_id_status` did (a key's
queued jobs, its running count in a queue), so that one goes.

Revision ID: 0023
Revises: 0022
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_owner_status_created", "jobs", ["owner_id", "status", "created_at"])
    op.drop_index("ix_jobs_owner_id_status", "jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_owner_id_status", "jobs", ["owner_id", "status"])
    op.drop_index("ix_jobs_owner_status_created", "jobs")
