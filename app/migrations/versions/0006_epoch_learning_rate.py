"""the learning rate of each epoch (schedules), nullable for metrics stored before it

Revision ID: 0006
Revises: 0005
"""

from alembic import op
import sqlalchemy as sa

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("epoch_metrics", schema=None) as batch_op:
        batch_op.add_column(sa.Column("learning_rate", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("epoch_metrics", schema=None) as batch_op:
        batch_op.drop_column("learning_rate")
