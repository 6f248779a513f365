"""Reservations of a share total, and weekly ones that end.

Revision ID: 0007
Revises: 0006

``gpuspawner_reservations.share_milli``: for a reservation of a share total (2.5
GPUs' worth, taken as shares or whole GPUs), that total in thousandths; NULL for
one of whole GPUs. ``count`` holds the total rounded up, so a hub that predates
this column keeps at least as much. ``repeat_until``: for a weekly reservation, no
window starts at or after it (naive UTC); NULL: every week on.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


# SQLite rebuilds the table: it keeps AUTOINCREMENT only when told (0006: an id is never given again).
KEEP = {"sqlite_autoincrement": True}


def upgrade() -> None:
    with op.batch_alter_table("gpuspawner_reservations", table_kwargs=KEEP) as batch:
        batch.add_column(sa.Column("share_milli", sa.Integer, nullable=True))
        batch.add_column(sa.Column("repeat_until", sa.DateTime, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpuspawner_reservations", table_kwargs=KEEP) as batch:
        batch.drop_column("repeat_until")
        batch.drop_column("share_milli")
