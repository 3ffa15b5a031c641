"""rejected_submissions: invalid submissions count towards their key's per-minute rate

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rejected_submissions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("owner_id", sa.String(36), sa.ForeignKey("api_keys.id", ondelete="CASCADE"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_rejected_submissions_owner_id_at", "rejected_submissions", ["owner_id", "at"])


def downgrade() -> None:
    op.drop_index("ix_rejected_submissions_owner_id_at", table_name="rejected_submissions")
    op.drop_table("rejected_submissions")
