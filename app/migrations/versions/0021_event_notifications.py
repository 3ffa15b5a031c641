"""event_notifications (placeholder: filled by the work of this change)

Revision ID: 0021
Revises: 0020
"""

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
