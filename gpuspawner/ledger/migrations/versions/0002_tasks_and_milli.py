"""Each allocation's swarm task ids; device shares as integer thousandths.

Revision ID: 0002
Revises: 0001

``gpuspawner_allocations.tasks``: the ids of the swarm tasks (containers) that ran for
the allocation, comma-separated ("" until the hub notes them).

``gpuspawner_allocation_devices.share`` (a float, 1.0 the whole device) becomes
``milli`` (an integer, 1000 the whole device), as gpuspawner counts shares everywhere
else. Batch mode rebuilds the table where the database cannot alter a column (SQLite).
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

DEVICES = "gpuspawner_allocation_devices"


def upgrade() -> None:
    with op.batch_alter_table("gpuspawner_allocations") as batch:
        batch.add_column(sa.Column("tasks", sa.Text, nullable=False, server_default=""))
    _convert("share", sa.Float, "milli", sa.Integer, "CAST(ROUND(share * 1000) AS INTEGER)")


def downgrade() -> None:
    _convert("milli", sa.Integer, "share", sa.Float, "milli / 1000.0")
    with op.batch_alter_table("gpuspawner_allocations") as batch:
        batch.drop_column("tasks")


def _convert(old: str, old_type, new: str, new_type, expression: str) -> None:
    """Replace the devices' column ``old`` by ``new``, filled with ``expression`` of ``old``."""
    with op.batch_alter_table(DEVICES) as batch:
        batch.add_column(sa.Column(new, new_type, nullable=True))
    op.execute(f"UPDATE {DEVICES} SET {new} = {expression}")
    with op.batch_alter_table(DEVICES) as batch:
        batch.alter_column(new, existing_type=new_type, nullable=False)
        batch.drop_column(old)
