"""Alembic's entry point for the ledger: runs the migrations on the connection that
``gpuspawner.ledger.migrations`` hands over (online only; there is no alembic.ini)."""

from alembic import context

from gpuspawner.ledger.migrations import VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError("run the ledger's migrations through gpuspawner.ledger.migrations.upgrade()")

context.configure(connection=connection, version_table=VERSION_TABLE, target_metadata=None)
with context.begin_transaction():
    context.run_migrations()
