"""sweeps: hyperparameter searches whose trials are jobs; the schema of their Optuna studies

Optuna's RDB storage keeps its own tables (and its own alembic_version): on PostgreSQL they live
in the `optuna` schema (app/sweeps/study.py), apart from ours.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("owner_id", sa.String(36), sa.ForeignKey("api_keys.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("advanced_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_sweeps_status", "sweeps", ["status"])
    op.create_index("ix_sweeps_owner_id_created_at", "sweeps", ["owner_id", "created_at"])
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sweep_id", sa.String(36), nullable=True))
        batch_op.add_column(sa.Column("trial_number", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("trial_params", sa.JSON(), nullable=True))
        batch_op.create_foreign_key("fk_jobs_sweep_id", "sweeps", ["sweep_id"], ["id"])
        batch_op.create_index("ix_jobs_sweep_id", ["sweep_id"], unique=False)
        batch_op.create_unique_constraint("uq_jobs_sweep_trial", ["sweep_id", "trial_number", "framework"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE SCHEMA IF NOT EXISTS optuna")


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint("uq_jobs_sweep_trial", type_="unique")
        batch_op.drop_index("ix_jobs_sweep_id")
        batch_op.drop_constraint("fk_jobs_sweep_id", type_="foreignkey")
        batch_op.drop_column("trial_params")
        batch_op.drop_column("trial_number")
        batch_op.drop_column("sweep_id")
    op.drop_index("ix_sweeps_owner_id_created_at", table_name="sweeps")
    op.drop_index("ix_sweeps_status", table_name="sweeps")
    op.drop_table("sweeps")
