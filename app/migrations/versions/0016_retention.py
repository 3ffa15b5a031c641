"""retention: jobs.retention_days, indexes on finished_at, and the counters table

Retention (app/retention.py) reads the expired finished jobs as a range of `finished_at`: every
job past the server's retention by ix_jobs_finished_at, and those with a shorter retention of
their own by ix_jobs_own_retention (only their rows). `counters` holds the totals /metrics
reports (rows and files deleted) and when retention is next due; its rows are made here.
The spec field is new, so no stored job has a retention of its own: nothing to backfill.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

COUNTERS = (
    "retention_deleted_jobs",
    "retention_deleted_comparisons",
    "retention_deleted_sweeps",
    "retention_deleted_files",
    "retention_deleted_bytes",
    "retention_due_at_s",
)


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("retention_days", sa.Integer(), nullable=True))
        batch_op.create_index("ix_jobs_finished_at", ["finished_at"], unique=False)
        batch_op.create_index(
            "ix_jobs_own_retention",
            ["finished_at"],
            unique=False,
            postgresql_where=sa.text("retention_days IS NOT NULL"),
            sqlite_where=sa.text("retention_days IS NOT NULL"),
        )
    counters = op.create_table(
        "counters",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("value", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.bulk_insert(counters, [{"name": name, "value": 0} for name in COUNTERS])


def downgrade() -> None:
    op.drop_table("counters")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_own_retention")
        batch_op.drop_index("ix_jobs_finished_at")
        batch_op.drop_column("retention_days")
