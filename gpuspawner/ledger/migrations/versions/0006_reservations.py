"""Reservations of whole GPUs for a group's members.

Revision ID: 0006
Revises: 0005

``gpuspawner_reservations``: one row per reservation, ``count`` whole GPUs of
``model`` for the members of ``group_name`` from ``starts_at`` to ``ends_at``
(naive UTC; the first window when ``weekly``, which repeats at the same local
time in ``timezone``, an IANA name), with its ``name`` ("": the group's),
``created_by`` and ``created_at`` (naive UTC). ``id`` is the ledger's, never given
again after a removal (AUTOINCREMENT on SQLite).
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpuspawner_reservations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(255), nullable=False, server_default=""),
        sa.Column("group_name", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("starts_at", sa.DateTime, nullable=False),
        sa.Column("ends_at", sa.DateTime, nullable=False),
        sa.Column("weekly", sa.Boolean, nullable=False),
        sa.Column("lend", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("gpuspawner_reservations")
