"""jobs: room on each page for HOT updates, and no index on owner_id alone

A job's row is updated several times after its insert (enqueued_at right after, then epoch, status,
timings). With pages filled to 100% the new version lands on another page and every index of the
table gets a new entry; with fillfactor 85 an update of unindexed columns (enqueued_at, epoch,
timings) stays on its page and touches no index (a HOT update). ix_jobs_owner_id is dropped: the
three indexes that start with owner_id (status, created_at, idempotency key) serve its lookups, and
each insert maintained it for nothing.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_owner_id")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE jobs SET (fillfactor = 85)")  # pages written from now on


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE jobs RESET (fillfactor)")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_owner_id", ["owner_id"], unique=False)
