"""failure_retries (placeholder: filled by the work of this change)

Revision ID: 0020
Revises: 0019
"""

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
