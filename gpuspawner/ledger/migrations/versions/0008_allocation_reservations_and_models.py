"""What each allocation reserved besides GPUs, and the models its request accepted.

Revision ID: 0008
Revises: 0007

``gpuspawner_allocations.reserved_cpu_milli`` and ``reserved_memory_mib``: the CPU
(thousandths of a core) and memory (MiB) the server's service reserved on its host;
``accepted_models``: the models its request accepted, as a JSON list (``[]``: any
model). NULL in each: not recorded (the rows written before this migration, and
holdings adopted from the cluster, whose request is not known). The frag policy
learns its mix of requests from them (docs/benchmarks.md).
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpuspawner_allocations") as batch:
        batch.add_column(sa.Column("reserved_cpu_milli", sa.Integer, nullable=True))
        batch.add_column(sa.Column("reserved_memory_mib", sa.Integer, nullable=True))
        batch.add_column(sa.Column("accepted_models", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpuspawner_allocations") as batch:
        batch.drop_column("accepted_models")
        batch.drop_column("reserved_memory_mib")
        batch.drop_column("reserved_cpu_milli")
