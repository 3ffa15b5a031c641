"""webhooks (placeholder: filled by the work of this change)

Revision ID: 0019
Revises: 0018
"""

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
