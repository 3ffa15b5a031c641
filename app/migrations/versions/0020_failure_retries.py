"""failure_retries: a job's retries after failures the retry policy retries, and its last failure

- jobs.retries: how many times a failure sent the job back to its queue (all types).
- jobs.retry_counts: those retries by error.type, {type: n} (TRAINHUB_RETRY_POLICY counts per type).
- jobs.last_error: the `error` of the latest failure that was retried.

Jobs stored before had only a lost worker's attempts counted past the first: those become their
worker_lost retries (retries = attempts - 1), so a job in flight keeps what it has spent.

Failed jobs stored before the closed list of error types (app/failures.py) get its terms: the
old `data_not_found` and `dataset_corrupt` become `data_error` with the old type as `reason`, and
any other type outside the list becomes `internal` (the old type kept as `reason`). Plain
ADD COLUMNs (no table copy on SQLite, so 0018's triggers on jobs stay).

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# The closed list as of this revision (app/failures.FailureType may grow; this must not move).
TYPES = ("nan_loss", "out_of_memory", "hardware_mismatch", "worker_lost", "timeout", "data_error", "invalid_spec", "internal")
LEGACY = {"data_not_found": "data_error", "dataset_corrupt": "data_error"}


def upgrade() -> None:
    op.add_column("jobs", sa.Column("retries", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("retry_counts", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("last_error", sa.JSON(), nullable=True))
    jobs = sa.table("jobs", sa.column("id", sa.String), sa.column("status", sa.String), sa.column("error", sa.JSON))
    bind = op.get_bind()
    # Until now only a lost worker left a job's attempt counted (a release gives it back): the
    # attempts after the first were worker_lost retries, which the policy goes on counting.
    build = "json_build_object" if bind.dialect.name == "postgresql" else "json_object"
    op.execute(
        f"UPDATE jobs SET retries = attempts - 1, retry_counts = {build}('worker_lost', attempts - 1) WHERE attempts > 1"
    )
    # Only failed jobs whose error.type is outside the list are read (the others stay untouched).
    path = "(error ->> 'type')" if bind.dialect.name == "postgresql" else "json_extract(error, '$.type')"
    kind = sa.literal_column(path)
    outside = sa.select(jobs.c.id, jobs.c.error).where(
        jobs.c.status == "failed", jobs.c.error.is_not(None), sa.or_(kind.is_(None), kind.not_in(TYPES))
    )
    for job_id, error in bind.execute(outside).all():
        if not isinstance(error, dict):  # a JSON null: nothing to rename
            continue
        old = str(error.get("type") or "")
        fixed = {**error, "type": LEGACY.get(old, "internal")}
        if old and not error.get("reason"):
            fixed["reason"] = old
        bind.execute(sa.update(jobs).where(jobs.c.id == job_id).values(error=fixed))


def downgrade() -> None:
    op.drop_column("jobs", "last_error")
    op.drop_column("jobs", "retry_counts")
    op.drop_column("jobs", "retries")
