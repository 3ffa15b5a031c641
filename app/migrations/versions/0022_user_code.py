"""user code: uploaded model code, jobs that train it, keys allowed to run it

Revision ID: 0022
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN, also on SQLite: a batch would rebuild the table, and SQLite drops a
    # rebuilt table's triggers (jobs: tallies, webhooks) or refuses it when a trigger names it.
    op.add_column("api_keys", sa.Column("allow_code", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table(
        "code_uploads",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner_id", sa.String(36), sa.ForeignKey("api_keys.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("entrypoints", sa.JSON(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("location", sa.String(1000), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("owner_id", "sha256", name="uq_code_uploads_owner_sha256"),
    )
    op.create_index("ix_code_uploads_sha256", "code_uploads", ["sha256"])
    op.create_index("ix_code_uploads_owner_id_created_at", "code_uploads", ["owner_id", "created_at"])
    op.add_column("jobs", sa.Column("code_id", sa.String(40), nullable=True))
    op.create_index("ix_jobs_code_id", "jobs", ["code_id"])
    # What a user-code job's child prints, streamed as `log` events while it runs (app/events.py).
    op.create_table(
        "job_logs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(36), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_job_logs_job_id", "job_logs", ["job_id"])
    if op.get_bind().dialect.name == "postgresql":  # wakes the job's streams, as a metrics row does (0021)
        op.execute(
            "CREATE TRIGGER trainhub_notify_log_written AFTER INSERT ON job_logs "
            "FOR EACH ROW EXECUTE FUNCTION trainhub_notify_epoch()"
        )


def downgrade() -> None:
    op.drop_index("ix_job_logs_job_id", "job_logs")
    op.drop_table("job_logs")  # its trigger goes with it
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_code_id")
        batch_op.drop_column("code_id")
    op.drop_index("ix_code_uploads_owner_id_created_at", "code_uploads")
    op.drop_index("ix_code_uploads_sha256", "code_uploads")
    op.drop_table("code_uploads")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("allow_code")
