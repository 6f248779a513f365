"""How each allocation stood against the groups' quotas when it was granted.

Revision ID: 0009
Revises: 0008

``gpuspawner_allocations.quota_group``: the group whose quota it drew on (NULL: none,
its user being in no group with a quota of its model); ``borrowed``: true when it was
beyond that quota (or in none), false within it. Both NULL: its model had no quota, or
the row was written before this migration (docs/quotas.md).
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpuspawner_allocations") as batch:
        batch.add_column(sa.Column("quota_group", sa.Text, nullable=True))
        batch.add_column(sa.Column("borrowed", sa.Boolean, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpuspawner_allocations") as batch:
        batch.drop_column("borrowed")
        batch.drop_column("quota_group")
