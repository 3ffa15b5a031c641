"""datasets: uploaded datasets, jobs that name one, regression metrics, workers' built-in datasets

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner_id", sa.String(36), sa.ForeignKey("api_keys.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("task", sa.String(16), nullable=False),
        sa.Column("input_shape", sa.JSON(), nullable=False),
        sa.Column("num_classes", sa.Integer(), nullable=False),
        sa.Column("class_names", sa.JSON(), nullable=False),
        sa.Column("train_size", sa.Integer(), nullable=False),
        sa.Column("test_size", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("upload_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("location", sa.String(1000), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("owner_id", "sha256", name="uq_datasets_owner_sha256"),
    )
    op.create_index("ix_datasets_sha256", "datasets", ["sha256"])
    op.create_index("ix_datasets_owner_id_created_at", "datasets", ["owner_id", "created_at"])
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dataset_id", sa.String(40), nullable=True))
        batch_op.create_index("ix_jobs_dataset_id", ["dataset_id"])
    with op.batch_alter_table("epoch_metrics", schema=None) as batch_op:
        batch_op.alter_column("train_accuracy", existing_type=sa.Float(), nullable=True)
        batch_op.alter_column("test_accuracy", existing_type=sa.Float(), nullable=True)
        batch_op.add_column(sa.Column("test_rmse", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("test_mae", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("test_r2", sa.Float(), nullable=True))
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("datasets", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_column("datasets")
    with op.batch_alter_table("epoch_metrics", schema=None) as batch_op:
        batch_op.drop_column("test_r2")
        batch_op.drop_column("test_mae")
        batch_op.drop_column("test_rmse")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_dataset_id")
        batch_op.drop_column("dataset_id")
    op.drop_index("ix_datasets_owner_id_created_at", "datasets")
    op.drop_index("ix_datasets_sha256", "datasets")
    op.drop_table("datasets")
