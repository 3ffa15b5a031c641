"""workers: whether the worker reached its broker at its last heartbeat

A worker whose heartbeat reaches the database but whose broker connection is down cannot take
work; /workers and the queues' waiting reasons must not count it as online.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("broker_ok", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_column("broker_ok")
