"""Allocations and their devices.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Partial indexes: "at most one open allocation per service" is enforced by the database
# where it can say so; elsewhere service is indexed plainly and the Ledger's lock enforces it.
PARTIAL_INDEXES = ("sqlite", "postgresql")


def upgrade() -> None:
    op.create_table(
        "gpuspawner_allocations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("service", sa.String(255), nullable=False),
        sa.Column("username", sa.String(255), nullable=False),
        sa.Column("server", sa.String(255), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("ended_at", sa.DateTime, nullable=True),
        sa.Column("end_reason", sa.Text, nullable=False),
    )
    if op.get_bind().dialect.name in PARTIAL_INDEXES:
        where = sa.text("ended_at IS NULL")
        op.create_index(
            "gpuspawner_allocations_open_service",
            "gpuspawner_allocations",
            ["service"],
            unique=True,
            sqlite_where=where,
            postgresql_where=where,
        )
    else:
        op.create_index("gpuspawner_allocations_open_service", "gpuspawner_allocations", ["service"])
    op.create_index("gpuspawner_allocations_started_at", "gpuspawner_allocations", ["started_at"])
    op.create_index("gpuspawner_allocations_username", "gpuspawner_allocations", ["username"])
    op.create_table(
        "gpuspawner_allocation_devices",
        sa.Column(
            "allocation_id",
            sa.Integer,
            sa.ForeignKey("gpuspawner_allocations.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("uuid", sa.String(255), nullable=False),
        sa.Column("share", sa.Float, nullable=False),
    )
    op.create_index("gpuspawner_allocation_devices_uuid", "gpuspawner_allocation_devices", ["uuid"])


def downgrade() -> None:
    op.drop_table("gpuspawner_allocation_devices")
    op.drop_table("gpuspawner_allocations")
