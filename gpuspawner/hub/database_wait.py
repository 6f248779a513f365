"""JupyterHub's own database connections wait out a short restart of the database.

JupyterHub asks its database synchronously, through one session that every request
shares. While the stack's PostgreSQL service restarts (seconds: its name does not even
resolve until the new task runs), each new connection failed at once, and users met
JupyterHub's own failures: logins 500, tokens 403, and a spawn in flight answered 500
although its server then started (JupyterHub's handler reread the server's row after
another request's failure had rolled the shared session back).

:func:`waiting_connections` gives JupyterHub's engine (``c.JupyterHub.db_kwargs``) a
connection factory that tries again every half second for up to ``wait`` seconds, and
pings a pooled connection before using it (a restart ends them all), so a restart is a
pause, not a failure. The wait blocks the hub's event loop, as every query of JupyterHub's
does; so a database that stays down costs it once: after a wait that ends in failure, each
connection is tried once, failing as fast as before, until one succeeds.

A connection JupyterHub's session already holds is not pinged: after a read, the session
keeps its transaction (and the connection) open until its next commit, and a restart ends
that connection under it, so the next request that asked would fail.
:func:`keep_idle_transaction_ended` ends such a transaction four times a second when it has
only read (a transaction with a change, pending or flushed, is JupyterHub's to commit or
roll back), so the next query checks a connection out of the pool, pinged.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url

__all__ = ["WAIT_SECONDS", "WaitingConnect", "keep_idle_transaction_ended", "waiting_connections"]

# On the test swarm the hub reached a restarted database 11 to 20 s after the restart
# command (its name resolves on the hub's node only once the swarm has spread the new
# task's address). The stack's health check gives the hub 5 checks 10 s apart: a 30 s
# wait costs 3 at most.
WAIT_SECONDS = 30.0
RETRY_EVERY = 0.5


class WaitingConnect:
    """A ``creator`` for :func:`sqlalchemy.create_engine`: the URL's own DB-API connection,
    tried again while the database is not there, for up to ``wait`` seconds."""

    def __init__(
        self,
        url: str,
        wait: float = WAIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        parsed = make_url(url)
        dialect_class = parsed.get_dialect()
        self._dialect = dialect_class(dbapi=dialect_class.import_dbapi())
        self._args = self._dialect.create_connect_args(parsed)
        self._wait, self._clock, self._sleep = wait, clock, sleep
        self._failing = False  # a wait ended in failure, and nothing has connected since

    def __deepcopy__(self, memo: dict) -> WaitingConnect:
        return self  # one factory, whoever copies the config that holds it (traitlets does)

    def __call__(self) -> Any:
        cargs, cparams = self._args
        deadline = self._clock() + (0 if self._failing else self._wait)
        while True:
            try:
                connection = self._dialect.connect(*cargs, **cparams)
            except self._dialect.loaded_dbapi.OperationalError:
                if self._clock() >= deadline:
                    self._failing = True
                    raise
                self._sleep(RETRY_EVERY)
            else:
                self._failing = False
                return connection


def waiting_connections(url: str, wait: float = WAIT_SECONDS) -> dict[str, Any]:
    """``c.JupyterHub.db_kwargs`` for ``url`` (``c.JupyterHub.db_url``): connections that
    wait up to ``wait`` seconds for the database, pooled ones pinged before use."""
    return {"creator": WaitingConnect(url, wait), "pool_pre_ping": True}


WROTE = "gpuspawner_transaction_wrote"  # in Session.info: the transaction has flushed a change


def _track_writes(db: Any) -> None:
    """Mark in ``db.info`` whether its transaction has written (a flush), until it ends."""
    if WROTE in db.info:
        return
    db.info[WROTE] = False

    def wrote(session: Any, _context: Any) -> None:
        session.info[WROTE] = True

    def ended(session: Any, transaction: Any) -> None:
        if transaction.parent is None:
            session.info[WROTE] = False

    event.listen(db, "after_flush", wrote)
    event.listen(db, "after_transaction_end", ended)


async def keep_idle_transaction_ended(session: Callable[[], Any], every: float = 0.25) -> None:
    """Every ``every`` seconds, end the transaction of ``session()`` (JupyterHub's shared
    session, or None) when it has only read: no pending change, nothing flushed. A commit
    that fails (the database went away under it) is rolled back, as JupyterHub does after a
    database error."""
    while True:
        await asyncio.sleep(every)
        db = session()
        if db is None:
            continue
        _track_writes(db)
        if not db.in_transaction() or db.info[WROTE] or db.new or db.dirty or db.deleted:
            continue
        try:
            db.commit()
        except Exception:  # noqa: BLE001 - the session must not stay in a failed transaction
            with contextlib.suppress(Exception):  # nor this loop end: JupyterHub's next use says why
                db.rollback()
