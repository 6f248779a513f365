"""The most GPU memory each allocation's processes used.

Revision ID: 0005
Revises: 0004

``gpuspawner_allocations.peak_memory_mib``: the highest total, in MiB, of the
memory the server's own processes used on its devices, from the node agents'
reports, written when it grows by more than 64 MiB or 2 % (NULL: no report has said).
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpuspawner_allocations") as batch:
        batch.add_column(sa.Column("peak_memory_mib", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpuspawner_allocations") as batch:
        batch.drop_column("peak_memory_mib")
