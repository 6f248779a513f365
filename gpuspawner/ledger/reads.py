"""What the ledger reads: allocations as Records, and GPU-hours per user or model."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

import sqlalchemy as sa

from ..core.sharing import UNIT
from .schema import COLUMNS, Record, allocation_devices, allocations, split_models, split_tasks


class Usage(NamedTuple):
    key: str  # a user name or a model name
    gpu_hours: float
    peak_memory_mib: int | None = None  # the most GPU memory one of its allocations used


def hours_within(start: datetime, end: datetime, since: datetime | None, until: datetime) -> float:
    """Hours of [start, end] that lie within [since, until] (None: from the beginning)."""
    lo = start if since is None else max(start, since)
    hi = min(end, until)
    return max(0.0, (hi - lo).total_seconds() / 3600)


def select_records(conn: sa.Connection, *where) -> list[Record]:
    """The allocations that meet ``where``, with their devices, oldest first."""
    a, d = allocations, allocation_devices
    rows = conn.execute(
        sa.select(a, d.c.uuid, d.c.milli)
        .select_from(a.outerjoin(d, d.c.allocation_id == a.c.id))
        .where(*where)
        .order_by(a.c.started_at, a.c.id, d.c.position)
    )
    found: dict[int, tuple] = {}  # id: (row, its devices, their shares)
    for row in rows:
        _, uuids, milli = found.setdefault(row.id, (row, [], []))
        if row.uuid is not None:  # an allocation without GPUs has no device rows
            uuids.append(row.uuid)
            milli.append(row.milli)
    return [
        Record(
            id=row.id,
            devices=tuple(uuids),
            milli=tuple(milli),
            tasks=split_tasks(row.tasks),
            accepts=split_models(row.accepted_models),
            **{field: getattr(row, column) for field, column in COLUMNS.items()},
        )
        for row, uuids, milli in found.values()
    ]


def open_record(conn: sa.Connection, service: str) -> Record | None:
    """``service``'s open allocation, if it has one."""
    found = select_records(conn, allocations.c.service == service, allocations.c.ended_at.is_(None))
    return found[-1] if found else None


def overlapping(since: datetime | None, until: datetime | None) -> list:
    """Conditions for allocations that overlap [since, until] (None: unbounded)."""
    where = []
    if since is not None:
        where.append(sa.or_(allocations.c.ended_at.is_(None), allocations.c.ended_at > since))
    if until is not None:
        where.append(allocations.c.started_at < until)
    return where


def history_conditions(since: datetime | None, until: datetime | None, user: str | None, device: str | None) -> list:
    """Conditions for the allocations of ``history``."""
    where = overlapping(since, until)
    if user is not None:
        where.append(allocations.c.username == user)
    if device is not None:
        where.append(
            allocations.c.id.in_(
                sa.select(allocation_devices.c.allocation_id).where(allocation_devices.c.uuid == device)
            )
        )
    return where


# by reason: why each allocation ended ("idle", "max_hours", "budget", "server stopped", …; "" while open),
# so GPU-hours of servers stopped for idleness are counted apart (docs/idle.md).
# by quota: how each allocation stood against the quotas when granted ("lab-a within", "lab-a
# borrowed", "borrowed" for users in no group with a quota of its model, "no quota"; docs/quotas.md).
QUOTA_KEY = sa.case(
    (allocations.c.borrowed.is_(None), sa.literal("no quota")),
    (allocations.c.quota_group.is_(None), sa.literal("borrowed")),
    (allocations.c.borrowed.is_(True), allocations.c.quota_group + sa.literal(" borrowed")),
    else_=allocations.c.quota_group + sa.literal(" within"),
)
USAGE_KEYS = {
    "user": allocations.c.username,
    "model": allocations.c.model,
    "reason": allocations.c.end_reason,
    "quota": QUOTA_KEY,
}


def usage_query(by: str, since: datetime | None, until: datetime):
    """A query for one row per allocation within [since, until] that held GPUs: (key,
    started_at, ended_at, summed shares, peak memory); ``by`` is one of USAGE_KEYS."""
    a, d = allocations, allocation_devices
    # The inner join drops allocations without GPUs; the overlap is computed in Python
    # (usage_totals), alike for every backend.
    return (
        sa.select(USAGE_KEYS[by], a.c.started_at, a.c.ended_at, sa.func.sum(d.c.milli), a.c.peak_memory_mib)
        .join_from(a, d, d.c.allocation_id == a.c.id)
        .where(*overlapping(since, until))
        .group_by(a.c.id, USAGE_KEYS[by], a.c.started_at, a.c.ended_at, a.c.peak_memory_mib)
    )


def user_spans(conn: sa.Connection, user: str, since: datetime) -> list[tuple[datetime, datetime | None, float]]:
    """``user``'s allocations that held GPUs after ``since``: (started, ended or
    None while open, GPUs held, shares as their fraction)."""
    rows = conn.execute(usage_query("user", since, None).where(allocations.c.username == user))
    return [(started, ended, milli / UNIT) for _, started, ended, milli, _peak in rows]


def usage_totals(rows, now: datetime, since: datetime | None, until: datetime) -> list[Usage]:
    """GPU-hours per key from the rows of usage_query, largest first, keys without any left out."""
    totals: dict[str, float] = {}
    peaks: dict[str, int] = {}
    for key, started, ended, milli, peak in rows:
        hours = hours_within(started, ended or now, since, until) * (milli / UNIT)
        if hours > 0:
            totals[key] = totals.get(key, 0.0) + hours
            if peak is not None:
                peaks[key] = max(peak, peaks.get(key, 0))
    return [Usage(k, h, peaks.get(k)) for k, h in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))]
