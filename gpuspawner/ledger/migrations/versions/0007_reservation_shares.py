"""Reservations of a share total.

Revision ID: 0007
Revises: 0006

``gpuspawner_reservations.share_milli``: for a reservation of a share total (2.5
GPUs' worth, taken as shares or whole GPUs), that total in thousandths; NULL for
one of whole GPUs. ``count`` holds the total rounded up, so a hub that predates
this column keeps at least as much.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpuspawner_reservations") as batch:
        batch.add_column(sa.Column("share_milli", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpuspawner_reservations") as batch:
        batch.drop_column("share_milli")
