"""The ledger's line of waiting requests (table ``gpuspawner_queue``, migration
0004), and the run times of past servers that the line's estimate uses.

A mixin of :class:`gpuspawner.ledger.ledger.Ledger`: the same database, locks and
error handling. The order itself is :mod:`gpuspawner.core.line_order`'s.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime

import sqlalchemy as sa

from ..core.line_order import Waiter
from .checks import aware_utc, checked_name, utc_now
from .schema import NAME_MAX, UTCDateTime, allocations, metadata

__all__ = ["LedgerQueue", "queue"]

REQUEST_MAX = 4096  # characters of a waiting request's user_options, as JSON
RUNS_KEPT = 200  # past servers' run times the estimate uses (the newest)

queue = sa.Table(
    "gpuspawner_queue",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("service", sa.String(NAME_MAX), nullable=False, unique=True),
    sa.Column("username", sa.String(NAME_MAX), nullable=False),
    sa.Column("server", sa.String(NAME_MAX), nullable=False),
    sa.Column("model", sa.String(NAME_MAX), nullable=False),
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("since", UTCDateTime, nullable=False),
    sa.Column("request", sa.Text, nullable=False),
)


def _waiter(row) -> Waiter:
    return Waiter(
        id=row.id,
        service=row.service,
        user=row.username,
        server=row.server,
        model=row.model,
        priority=row.priority,
        since=row.since,
        request=json.loads(row.request),
    )


class LedgerQueue:
    """The line's reads and writes (see the module)."""

    engine: sa.Engine
    _write_lock: threading.Lock
    _db: Callable[[str], AbstractContextManager[None]]

    def enqueue(
        self,
        service: str,
        user: str,
        server: str,
        model: str,
        priority: int,
        request: dict,
        since: datetime | None = None,
    ) -> Waiter:
        """Put ``service`` at the back of ``model``'s line; a service already in
        line keeps its place (a spawn resumed after a hub restart)."""
        values = dict(
            service=checked_name(service, "service", required=True),
            username=checked_name(user, "user", required=True),
            server=checked_name(server, "server", required=False),
            model=checked_name(model, "model", required=True),
            since=aware_utc(since, "since") or utc_now(),
        )
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be a whole number, not {priority!r}")
        text = json.dumps(request, sort_keys=True)
        if len(text) > REQUEST_MAX:
            raise ValueError(f"the request is longer than {REQUEST_MAX} characters as JSON")
        q = queue
        with self._write_lock, self._db(f"putting {service} in line"), self.engine.begin() as conn:
            row = conn.execute(sa.select(q).where(q.c.service == service)).first()
            if row is None:
                conn.execute(q.insert().values(priority=priority, request=text, **values))
                row = conn.execute(sa.select(q).where(q.c.service == service)).one()
            return _waiter(row)

    def dequeue(self, service: str) -> bool:
        """Take ``service`` out of line; False when it was not in it."""
        checked_name(service, "service", required=True)
        q = queue
        with self._write_lock, self._db(f"taking {service} out of line"), self.engine.begin() as conn:
            return bool(conn.execute(q.delete().where(q.c.service == service)).rowcount)

    def waiting(self) -> list[Waiter]:
        """Every request in line, in arrival order (:func:`gpuspawner.core.line_order.ordered` orders them)."""
        with self._db("reading the line"), self.engine.connect() as conn:
            return [_waiter(r) for r in conn.execute(sa.select(queue).order_by(queue.c.id))]

    def run_seconds(self, model: str) -> list[float]:
        """How long the newest ended servers of ``model`` held their GPUs, in seconds."""
        a = allocations
        with self._db(f"reading how long servers of {model} ran"), self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(a.c.started_at, a.c.ended_at)
                .where(a.c.model == model, a.c.ended_at.is_not(None))
                .order_by(a.c.ended_at.desc())
                .limit(RUNS_KEPT)
            )
            return [max(0.0, (r.ended_at - r.started_at).total_seconds()) for r in rows]
