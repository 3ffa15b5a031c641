"""comparisons by key and creation time: `GET /comparisons` in pages at flat cost

A key's comparisons page by page, newest first (app/pages.py), read the key's every comparison
through `ix_comparisons_owner_id` and sorted them, or walked `ix_comparisons_created_at` back past
other keys'. This index serves each page as one range; its prefix serves what
`ix_comparisons_owner_id` did, so that one goes.

Revision ID: 0025
Revises: 0024
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_comparisons_owner_id_created_at", "comparisons", ["owner_id", "created_at"])
    op.drop_index("ix_comparisons_owner_id", "comparisons")


def downgrade() -> None:
    op.create_index("ix_comparisons_owner_id", "comparisons", ["owner_id"])
    op.drop_index("ix_comparisons_owner_id_created_at", "comparisons")
