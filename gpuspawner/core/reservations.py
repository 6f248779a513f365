"""Reservations: COUNT GPUs of a MODEL kept for a group's members in a window of
time, once or every week (pure: no JupyterHub, no Docker, no ledger). COUNT is
whole GPUs, or with ``shares`` a total of GPU (2.5: two and a half GPUs' worth)
that members take as shares or whole GPUs.

A weekly reservation repeats at the same local time in its time zone, so a
course at 14:00–16:00 in Europe/Berlin stays at 14:00 local across a
daylight-saving change (its UTC times move by an hour). A local time that does
not exist on a day (the hour skipped in spring) is read with the offset before
the change, as :mod:`zoneinfo` does (02:30 becomes 03:30).

What an open window keeps free, which reservation a holding counts toward and
whom a window's start stops are scheduling rules: :mod:`gpuspawner.plan.reservations`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .sharing import UNIT, fmt, to_milli

__all__ = [
    "RESERVATION",
    "Reservation",
    "ReservationError",
    "Window",
    "conflicts",
    "local",
    "zone_of",
]

RESERVATION = "reservation"  # the end reason of a server stopped for one
WEEK = timedelta(days=7)
HORIZON_WEEKS = 53  # overlaps of weekly windows are checked over a year ahead (every DST change)
NAME_MAX = 64
MAX_COUNT = 10_000  # GPUs one reservation may keep
_NAME = re.compile(r"[\w .:/+()@-]{1,64}")  # the whole name (fullmatch: "$" allows a newline at the end)


class ReservationError(ValueError):
    """A reservation that cannot be made as given; the message says why."""


@dataclass(frozen=True)
class Window:
    start: datetime  # UTC
    end: datetime

    def __contains__(self, t: datetime) -> bool:
        return self.start <= t < self.end

    def overlaps(self, other: Window) -> bool:
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True)
class Reservation:
    """``count`` GPUs of ``model`` for ``group``'s members from ``start`` to ``end``
    (UTC; the first window when ``weekly``): whole GPUs, or with ``shares`` a total
    that may be a fraction (2.5), taken as shares or whole GPUs."""

    group: str
    model: str
    count: int | float
    start: datetime
    end: datetime
    weekly: bool = False
    timezone: str = "UTC"  # where a weekly window keeps its local time
    name: str = ""  # shown to people; the group's name when empty
    lend: bool = False  # unused GPUs of an open window go to others until a member waits for one
    shares: bool = False  # ``count`` is a total of GPU, kept as free room rather than untouched devices
    until: datetime | None = None  # weekly: no window starts at or after it (None: every week on)
    id: int | None = None  # the ledger's
    created_by: str = ""
    created_at: datetime | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for what, value in (("group", self.group), ("model", self.model)):
            if not isinstance(value, str) or not value.strip() or len(value) > NAME_MAX:
                raise ReservationError(f"a reservation needs a {what} (at most {NAME_MAX} characters)")
        if self.name and not _NAME.fullmatch(self.name):
            raise ReservationError(
                f"a reservation's name is at most {NAME_MAX} letters, digits, spaces or . : / + ( ) @ - _"
            )
        if not all(isinstance(v, bool) for v in (self.weekly, self.lend, self.shares)):
            raise ReservationError("a reservation's weekly, lend and shares are true or false")
        if self.shares:
            try:
                milli = to_milli(self.count, "a reservation's share total")
            except ValueError as exc:
                raise ReservationError(str(exc)) from None
            if not 0 < milli <= MAX_COUNT * UNIT:
                raise ReservationError(f"a reservation's share total is above 0 and at most {MAX_COUNT} GPUs")
            object.__setattr__(self, "count", milli // UNIT if milli % UNIT == 0 else milli / UNIT)
            if self.lend:
                # What borrowers give back could lie in pieces no waiting member can use.
                raise ReservationError("a share total is not lent: lend a reservation of whole GPUs")
        elif isinstance(self.count, bool) or not isinstance(self.count, int) or not 1 <= self.count <= MAX_COUNT:
            raise ReservationError(
                f"a reservation's count is a whole number of GPUs from 1, got {self.count!r} "
                "(a total such as 2.5 is kept as shares)"
            )
        for what, t in (("start", self.start), ("end", self.end)):
            if not isinstance(t, datetime) or t.tzinfo is None:
                raise ReservationError(f"a reservation's {what} needs a time zone (e.g. 2026-12-08T14:00+01:00)")
        if self.end <= self.start:
            raise ReservationError("a reservation's end must be after its start")
        if self.weekly and self.end - self.start >= WEEK:
            raise ReservationError("a weekly reservation's window must be shorter than a week")
        if self.until is not None:
            if not self.weekly:
                raise ReservationError("only a weekly reservation has an until (a one-off one ends at its end)")
            if not isinstance(self.until, datetime) or self.until.tzinfo is None:
                raise ReservationError("a reservation's until needs a time zone (e.g. 2027-02-10T00:00+01:00)")
            if self.until <= self.start:
                raise ReservationError("a reservation's until must be after its start")
            object.__setattr__(self, "until", self.until.astimezone(timezone.utc))
        _ = self.zone  # an unknown time zone is refused here
        object.__setattr__(self, "start", self.start.astimezone(timezone.utc))
        object.__setattr__(self, "end", self.end.astimezone(timezone.utc))

    @property
    def zone(self) -> ZoneInfo:
        return zone_of(self.timezone)

    @property
    def label(self) -> str:
        return self.name or self.group

    @property
    def milli(self) -> int:
        """What it keeps, in thousandths of a GPU."""
        return round(self.count * UNIT)

    @property
    def amount(self) -> str:
        """E.g. "10 A100" or "2.5 A100 in shares"."""
        return f"{fmt(self.milli)} {self.model}" + (" in shares" if self.shares else "")

    def when(self, t: datetime) -> str:
        """``t`` as people of this reservation read it: in its time zone."""
        return f"{t.astimezone(self.zone):%Y-%m-%d %H:%M} {self.timezone}"

    def window(self, k: int) -> Window:
        """The ``k``-th window (0: the first); a one-off reservation has only that one."""
        if k == 0 or not self.weekly:
            return Window(self.start, self.end)
        return Window(self._weeks_later(self.start, k), self._weeks_later(self.end, k))

    def _weeks_later(self, t: datetime, k: int) -> datetime:
        zone = self.zone
        local = t.astimezone(zone).replace(tzinfo=None) + k * WEEK  # the same wall time, k weeks on
        return local.replace(tzinfo=zone).astimezone(timezone.utc)

    def windows(self, since: datetime, until: datetime) -> Iterator[Window]:
        """Its windows that overlap [since, until), in order."""
        if not self.weekly:
            w = self.window(0)
            if w.overlaps(Window(since, until)):
                yield w
            return
        k = max(0, math.floor((since - self.end) / WEEK) - 1)  # a week of slack for DST shifts
        last = until if self.until is None else min(until, self.until)
        while True:
            w = self.window(k)
            if w.start >= last:
                return
            if w.end > since and w.end > w.start:  # none on a day its times fall in the skipped hour
                yield w
            k += 1

    def active(self, now: datetime) -> Window | None:
        """The window ``now`` is in, if any."""
        return next((w for w in self.windows(now, now + timedelta(microseconds=1)) if now in w), None)

    def next_window(self, now: datetime) -> Window | None:
        """The window ``now`` is in, else the next one to start; None: none is left."""
        until = max(now, self.start) + WEEK + timedelta(days=1) if self.weekly else self.end
        return next(self.windows(now, until), None)

    def over(self, now: datetime) -> bool:
        """No window is left (a one-off reservation that has ended, or a weekly one past its until)."""
        if not self.weekly:
            return self.end <= now
        return self.until is not None and self.until <= now and self.active(now) is None

    def as_json(self) -> dict:
        return {
            "id": self.id,
            "name": self.label,
            "group": self.group,
            "model": self.model,
            "count": self.count,
            "start": _iso(self.start),
            "end": _iso(self.end),
            "weekly": self.weekly,
            "timezone": self.timezone,
            "lend": self.lend,
            "shares": self.shares,
            "until": _iso(self.until) if self.until else None,
            "created_by": self.created_by,
            "created_at": _iso(self.created_at) if self.created_at else None,
        }

    def describe(self) -> str:
        """E.g. "CS101: 10 A100 every week, Tue 14:00–16:00 Europe/Berlin"; a share
        total: "Lab: 2.5 A100 in shares 2026-12-08 09:00–2026-12-10 09:00 UTC"."""
        zone = self.zone
        a, b = self.start.astimezone(zone), self.end.astimezone(zone)
        if self.weekly:
            when = f"every week, {a:%a %H:%M}–{b:%a %H:%M} {self.timezone}".replace(f"–{a:%a} ", "–")
            if self.until is not None:
                when += f" until {self.until.astimezone(zone):%Y-%m-%d %H:%M}"
        else:
            when = f"{a:%Y-%m-%d %H:%M}–{b:%Y-%m-%d %H:%M} {self.timezone}"
        return f"{self.label}: {self.amount} {when}" + (", lent while unused" if self.lend else "")


def local(t: datetime, zone: ZoneInfo) -> datetime:
    """``t``, a time without an offset, in ``zone``; ReservationError when that local
    time does not exist there (the hour skipped when clocks go forward)."""
    aware = t.replace(tzinfo=zone)
    try:
        back = aware.astimezone(timezone.utc).astimezone(zone).replace(tzinfo=None)
    except OverflowError:
        raise ReservationError(f"{t:%Y-%m-%d %H:%M} is out of range (too far in the past or the future)") from None
    if back != t:
        raise ReservationError(f"{t:%Y-%m-%d %H:%M} does not exist in {zone.key}: the clocks skip that hour")
    return aware


def zone_of(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; ReservationError when there is none, also for a
    name :mod:`zoneinfo` cannot open as a file (a folder of the tz database such as
    "Europe", a name too long for the file system: OSError)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise ReservationError(f"unknown time zone {name!r} (an IANA name, e.g. Europe/Berlin)") from None


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def conflicts(new: Reservation, existing: Iterable[Reservation], capacity: int, now: datetime) -> list[Reservation]:
    """The reservations of ``new``'s model whose windows, with ``new``'s, would
    ask for more than ``capacity`` GPUs at once (share totals as their fraction;
    checked over a year of weekly windows, from ``now``). Raises ReservationError
    when ``new`` alone is more than the model has."""
    if new.milli > capacity * UNIT:
        raise ReservationError(f"the cluster has {capacity} {new.model}, fewer than the {fmt(new.milli)} asked for")
    same = [
        r
        for r in existing
        if r.model == new.model and r is not new and (new.id is None or r.id != new.id) and not r.over(now)
    ]
    since = max(now, new.start) if new.weekly else new.start
    # A year from when all have begun (a later one-off, or a weekly one that starts later, is reached).
    until = max([since, *(r.end for r in same)]) + HORIZON_WEEKS * WEEK if new.weekly else new.end
    found: dict[int, Reservation] = {}
    for w in new.windows(since, until):
        others = [(o, r) for r in same for o in r.windows(w.start, w.end)]
        for t in sorted({w.start} | {o.start for o, _ in others if o.start > w.start}):
            at = [r for o, r in others if t in o]
            if new.milli + sum(r.milli for r in at) > capacity * UNIT:
                found.update((id(r), r) for r in at)
    return sorted(found.values(), key=lambda r: (r.start, r.id or 0))
