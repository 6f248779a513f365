"""Node agents' tokens, one per host, stored as their SHA-256.

Revision ID: 0003
Revises: 0002

``gpuspawner_agent_tokens``: ``host`` (the swarm node's hostname), ``token_sha256``
(hex, unique: a token belongs to one host) and ``issued_at`` (naive UTC).
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpuspawner_agent_tokens",
        sa.Column("host", sa.String(255), primary_key=True),
        sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("issued_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gpuspawner_agent_tokens")
