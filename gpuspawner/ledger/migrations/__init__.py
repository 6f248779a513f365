"""The ledger's schema migrations (alembic), run from code: users need no alembic.ini.

Revisions live in ``versions/``; alembic records the ledger's revision in its own table,
``gpuspawner_alembic_version``, so the ledger can share the hub's database without
touching JupyterHub's ``alembic_version``.

To add a revision (a schema change), write ``versions/NNNN_what.py`` by hand after the
last one, or let alembic start it::

    python -c "from alembic import command; from gpuspawner.ledger.migrations import config; \\
        command.revision(config(), 'what changes')"

and extend ``tests/unit/test_ledger.py``'s upgrade tests if the data needs converting.
"""

from __future__ import annotations

import threading
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

__all__ = ["MigrationError", "VERSION_TABLE", "config", "current", "downgrade", "head", "revisions", "upgrade"]

#: Alembic's version table for the ledger: JupyterHub's own is ``alembic_version``.
VERSION_TABLE = "gpuspawner_alembic_version"
_ONE_AT_A_TIME = threading.Lock()  # see _run


class MigrationError(Exception):
    """A migration could not run; the message says which database and why
    (the Ledger passes it on as a LedgerError)."""


def config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent))
    return cfg


def revisions() -> list[str]:
    """Every revision, oldest first."""
    return [s.revision for s in reversed(list(ScriptDirectory.from_config(config()).walk_revisions()))]


def head() -> str:
    return ScriptDirectory.from_config(config()).get_current_head()


def current(engine: sa.Engine) -> tuple[str, ...]:
    """The database's revision(s); () for a database without the ledger's tables."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_heads()


def upgrade(engine: sa.Engine, url: str = "", revision: str = "head") -> None:
    """Create the ledger's tables or bring them up to ``revision``, in one transaction
    where the database allows (PostgreSQL does, SQLite mostly)."""
    known = revisions()
    unknown = [r for r in current(engine) if r not in known]
    if unknown:
        raise MigrationError(
            f"GPU ledger database {url or engine.url}: its tables are at schema revision "
            f"{', '.join(unknown)}, which this gpuspawner does not know (it knows up to {known[-1]}). "
            "A newer gpuspawner wrote them: upgrade gpuspawner, or point gpu_db_url at another database."
        )
    _run(command.upgrade, engine, revision, url)


def downgrade(engine: sa.Engine, revision: str) -> None:
    """Take the ledger's tables back to ``revision`` ("base": drop them). For tests and
    for going back to an older gpuspawner."""
    _run(command.downgrade, engine, revision)


def _run(step, engine: sa.Engine, revision: str, url: str = "") -> None:
    """``url``: the database as messages show it (the Ledger's, passwords hidden)."""
    cfg = config()
    try:
        # Alembic's ``op`` and ``context`` are one per process: two ledgers migrating
        # at once in two threads would run each other's steps on a torn context.
        with _ONE_AT_A_TIME, engine.begin() as conn:
            cfg.attributes["connection"] = conn  # env.py runs the migrations on it
            step(cfg, revision)
    except CommandError as e:
        raise MigrationError(
            f"GPU ledger database {url or engine.url}: schema migration to {revision} failed: {e}"
        ) from e
