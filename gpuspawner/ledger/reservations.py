"""The ledger's reservations (table ``gpuspawner_reservations``, migrations 0006
and 0007): GPUs of a model kept for a group's members, once or every week (whole
GPUs, or a share total in ``share_milli``; a weekly one until ``repeat_until``).

A mixin of :class:`gpuspawner.ledger.ledger.Ledger`: the same database, locks and
error handling. What a reservation means (its windows, conflicts, what it keeps
free) is :mod:`gpuspawner.core.reservations`'s and :mod:`gpuspawner.plan.reservations`'s; the ledger only keeps them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime

import sqlalchemy as sa

from ..core.reservations import Reservation
from ..core.sharing import UNIT
from .checks import aware_utc, checked_name, utc_now
from .schema import TIMEZONE_MAX
from .schema import reservations as table  # the method reservations() reads it

__all__ = ["LedgerReservations"]


def _reservation(row: sa.Row) -> Reservation:
    m = row._mapping  # by name: a Row's .count and .index are tuple methods
    return Reservation(
        group=m["group_name"],
        model=m["model"],
        count=m["count"] if m["share_milli"] is None else m["share_milli"] / UNIT,
        shares=m["share_milli"] is not None,
        until=m["repeat_until"],
        start=m["starts_at"],
        end=m["ends_at"],
        weekly=bool(m["weekly"]),
        lend=bool(m["lend"]),
        timezone=m["timezone"],
        name=m["name"],
        id=m["id"],
        created_by=m["created_by"],
        created_at=m["created_at"],
    )


class LedgerReservations:
    """The reservations' reads and writes (see the module)."""

    engine: sa.Engine
    _write_lock: threading.Lock
    _db: Callable[[str], AbstractContextManager[None]]

    def add_reservation(self, r: Reservation, created_at: datetime | None = None) -> Reservation:
        """Store ``r`` and return it with the ledger's id and its ``created_at``
        (``created_at`` if given, else ``r``'s, else now). ``r`` must not have an
        id yet (one read back from the ledger is stored already)."""
        if not isinstance(r, Reservation):
            raise ValueError(f"a reservation must be a Reservation, not {type(r).__name__}")
        if r.id is not None:
            raise ValueError(f"reservation #{r.id} is in the ledger already")
        if len(r.timezone) > TIMEZONE_MAX:
            raise ValueError(f"a reservation's time zone is at most {TIMEZONE_MAX} characters: {r.timezone[:40]}...")
        when = aware_utc(created_at, "created_at") or aware_utc(r.created_at, "created_at") or utc_now()
        values = dict(
            name=checked_name(r.name, "name", required=False),
            group_name=checked_name(r.group, "group", required=True),
            model=checked_name(r.model, "model", required=True),
            count=-(-r.milli // UNIT),  # rounded up: a hub without share_milli keeps at least as much
            share_milli=r.milli if r.shares else None,
            repeat_until=r.until,
            starts_at=r.start,
            ends_at=r.end,
            weekly=r.weekly,
            lend=r.lend,
            timezone=r.timezone,
            created_by=checked_name(r.created_by, "created_by", required=False),
            created_at=when,
        )
        t = table
        with self._write_lock, self._db(f"storing the reservation {r.label}"), self.engine.begin() as conn:
            key = conn.execute(t.insert().values(values)).inserted_primary_key
        assert key is not None  # an insert of one row has one
        return replace(r, id=key[0], created_at=when)

    def reservations(self) -> list[Reservation]:
        """Every stored reservation, by start, then id."""
        t = table
        with self._db("reading the reservations"), self.engine.connect() as conn:
            rows = conn.execute(sa.select(t).order_by(t.c.starts_at, t.c.id)).all()
        return [_reservation(row) for row in rows]

    def remove_reservation(self, reservation_id: int) -> Reservation | None:
        """Delete reservation ``reservation_id`` and return it as it was; None when
        there is no such reservation (removing twice is harmless)."""
        if isinstance(reservation_id, bool) or not isinstance(reservation_id, int):
            raise ValueError(f"a reservation id is a whole number, not {reservation_id!r}")
        t = table
        with self._write_lock, self._db(f"removing reservation #{reservation_id}"), self.engine.begin() as conn:
            row = conn.execute(sa.select(t).where(t.c.id == reservation_id)).first()
            if row is None:
                return None
            conn.execute(t.delete().where(t.c.id == reservation_id))
        return _reservation(row)
