"""The line of requests waiting for a GPU model.

Revision ID: 0004
Revises: 0003

``gpuspawner_queue``: one row per waiting server (``service`` unique), with its
user, server, model, priority, when it joined (``since``, naive UTC) and the
user_options it waits with (``request``, JSON). ``id`` is the arrival order.
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpuspawner_queue",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("service", sa.String(255), nullable=False, unique=True),
        sa.Column("username", sa.String(255), nullable=False),
        sa.Column("server", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("since", sa.DateTime, nullable=False),
        sa.Column("request", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gpuspawner_queue")
