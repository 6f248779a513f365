"""Reservations: COUNT GPUs of a MODEL kept for a group's members in a window of
time, once or every week (pure: no JupyterHub, no Docker, no ledger). COUNT is
whole GPUs, or with ``shares`` a total of GPU (2.5: two and a half GPUs' worth)
that members take as shares or whole GPUs.

A weekly reservation repeats at the same local time in its time zone, so a
course at 14:00–16:00 in Europe/Berlin stays at 14:00 local across a
daylight-saving change (its UTC times move by an hour). A local time that does
not exist on a day (the hour skipped in spring) is read with the offset before
the change, as :mod:`zoneinfo` does (02:30 becomes 03:30).

During a window, the GPUs its members do not hold are kept free for them: a
request of anyone else is granted only if as many untouched devices of the
model stay free (:func:`keep_free`); for a share total, as much free room (the
thousandths nobody holds, on untouched and shared devices alike). A holding
counts toward one reservation at most, though its user be a member of several
open ones (:func:`count_toward`). At a window's start, servers of others are
stopped, newest first, until that much is free (:func:`to_stop`); they are told
ahead (:data:`NOTICE_BEFORE`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .sharing import UNIT, fmt, to_milli

__all__ = [
    "RESERVATION",
    "Reservation",
    "ReservationError",
    "Holder",
    "Keep",
    "Need",
    "Window",
    "conflicts",
    "count_toward",
    "keep_free",
    "needs",
    "to_stop",
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


@dataclass(frozen=True)
class Keep:
    """What a request of someone else must leave free of a model: ``devices``
    untouched (reservations of whole GPUs) and, beyond theirs, ``room``
    thousandths nobody holds, on any device (share totals)."""

    devices: int = 0
    room: int = 0

    def __add__(self, other: Keep) -> Keep:
        return Keep(self.devices + other.devices, self.room + other.room)

    def __bool__(self) -> bool:
        return bool(self.devices or self.room)

    def met(self, untouched: int, room: int) -> bool:
        """Whether ``untouched`` devices and ``room`` free thousandths (theirs included) leave it."""
        return untouched >= self.devices and room >= self.devices * UNIT + self.room


@dataclass(frozen=True)
class Need:
    """What an active (or soon active) window still keeps free: ``reservation``'s
    GPUs that its members do not hold."""

    reservation: Reservation
    window: Window
    unmet: int  # whole devices (a reservation of whole GPUs)
    held: int | float = 0  # GPUs its members hold: whole ones (shares added up, rounded down); all, for a share total
    room: int = 0  # thousandths (a share total)

    @property
    def keep(self) -> Keep:
        return Keep(self.unmet, self.room)

    @property
    def left(self) -> str:
        """What its members may still take, e.g. "3" or "1.25"."""
        return fmt(max(0, self.reservation.milli - round(self.held * UNIT)))

    @property
    def kept(self) -> str:
        """What it keeps from others, in GPUs: "3" or "1.25"."""
        return fmt(self.unmet * UNIT + self.room)


class Holder(NamedTuple):
    """A holding as the reservations see it: ``key`` (its service's name), the ``model``
    of its devices, the thousandths it holds of them, and its user's groups now."""

    key: str
    model: str
    milli: int
    groups: Collection[str]


def count_toward(reservations: Iterable[Reservation], holders: Iterable[Holder], now: datetime) -> dict[str, int]:
    """Which reservation each holding counts toward (holder key -> reservation id): one
    at most, of ``reservations`` (those whose windows are open at the moment looked at),
    of its model and its user's groups. A holding that can count toward fewer of them is
    counted first (the larger first, then by key), and each goes to the one of its own
    that lacks the most (what it keeps less what is counted toward it so far), on a tie
    the one whose window opened first, then the lower id: so a member of two open
    windows does not meet both, and what it meets is what was lacking."""
    rs = [r for r in reservations if r.id is not None]
    opened = {r.id: (w.start if (w := r.next_window(now)) is not None else r.start) for r in rs}
    lacks = {r.id: r.milli for r in rs}
    of_model: dict[str, list[Reservation]] = {}
    for r in rs:
        of_model.setdefault(r.model, []).append(r)
    groups = {m: frozenset(r.group for r in mine) for m, mine in of_model.items()}
    choices = []
    out: dict[str, int] = {}
    for h in holders:
        if h.model not in groups or groups[h.model].isdisjoint(h.groups):
            continue  # a member of none (most holders at a large hub): skipped at once
        mine = [r for r in of_model[h.model] if r.group in h.groups]
        if len(mine) == 1:  # one choice: counted first, whatever the order among them
            out[h.key] = mine[0].id  # type: ignore[assignment]  # rs have ids
            lacks[mine[0].id] -= h.milli
        else:
            choices.append((h, mine))
    choices.sort(key=lambda hc: (len(hc[1]), -hc[0].milli, hc[0].key))
    for h, mine in choices:
        r = min(mine, key=lambda r: (-lacks[r.id], opened[r.id], r.id))
        out[h.key] = r.id  # type: ignore[assignment]  # rs have ids
        lacks[r.id] -= h.milli
    return out


def needs(
    reservations: Iterable[Reservation],
    now: datetime,
    members_hold: Mapping[int, float],
    ahead: timedelta = timedelta(0),
    members_waiting: Mapping[int, int] | None = None,
) -> list[Need]:
    """Each reservation whose window is open at ``now`` (or opens within ``ahead``),
    with the GPUs its members (``members_hold``: reservation id -> GPUs of its
    model they hold, shares as fractions) leave unused. A reservation that lends
    (of whole GPUs) needs only as many as its members wait for in line
    (``members_waiting``, in thousandths, each ask rounded up to whole GPUs), and
    only while its window is open."""
    out = []
    for r in reservations:
        w = r.next_window(now)
        if w is None or w.start > now + ahead:
            continue
        hold = members_hold.get(r.id or 0, 0.0)
        if r.shares:  # never lent
            out.append(Need(r, w, 0, round(hold, 3), max(0, r.milli - round(hold * UNIT))))
            continue
        held = math.floor(hold + 1e-9)
        unmet = max(0, r.count - held)
        if r.lend:
            waiting = (members_waiting or {}).get(r.id or 0, 0) if now in w else 0
            unmet = min(unmet, -(-waiting // UNIT))
        out.append(Need(r, w, unmet, held))
    return out


def keep_free(need_list: Iterable[Need], member_of: Iterable[int], now: datetime) -> dict[str, Keep]:
    """Per model, what a request of a member of ``member_of`` (reservation ids)
    must leave free: the unused GPUs of the open windows it is not a member of."""
    mine = set(member_of)
    out: dict[str, Keep] = {}
    for n in need_list:
        if now in n.window and n.reservation.id not in mine and n.keep:
            out[n.reservation.model] = out.get(n.reservation.model, Keep()) + n.keep
    return out


def to_stop(
    needed: int, devices: Mapping[str, Mapping[str, int]], candidates: Sequence[str], room: int = 0
) -> list[str]:
    """Which of ``candidates`` (holders, newest first) to stop so that ``needed``
    devices are untouched and, beyond them, ``room`` thousandths are free, among
    ``devices`` (uuid -> {holder: milli}; empty: free): the newest until enough
    are free, then any not needed after all are let off. The newest go first
    even where fewer older ones would do. When stopping all would free less, as
    much as stopping all would. Linear in the devices and what the candidates
    hold (a window's start at a thousand nodes)."""
    left = {uuid: len(held) for uuid, held in devices.items()}  # holders not stopped, per device
    used = {uuid: sum(held.values()) for uuid, held in devices.items()}  # thousandths they hold
    held_by: dict[str, list[tuple[str, int]]] = {}
    for uuid, held in devices.items():
        for holder, milli in held.items():
            held_by.setdefault(holder, []).append((uuid, milli))
    everyone = set(candidates)
    reachable = sum(1 for held in devices.values() if everyone.issuperset(held))
    needed = min(needed, reachable)
    most = sum(UNIT - sum(m for h, m in held.items() if h not in everyone) for held in devices.values())
    want = needed * UNIT + min(room, max(0, most - needed * UNIT))  # free thousandths in all
    free = sum(1 for n in left.values() if n == 0)
    free_room = sum(UNIT - u for u in used.values())

    def enough() -> bool:
        return free >= needed and free_room >= want

    chosen: list[str] = []
    for c in dict.fromkeys(candidates):
        if enough():
            break
        chosen.append(c)
        for uuid, milli in held_by.get(c, ()):
            left[uuid] -= 1
            free += left[uuid] == 0
            free_room += milli
    kept = set(chosen)
    for c in reversed(chosen):  # let off, oldest first, any whose stop is not needed after all
        lost = sum(1 for uuid, _ in held_by.get(c, ()) if left[uuid] == 0)
        lost_room = sum(milli for _, milli in held_by.get(c, ()))
        if free - lost >= needed and free_room - lost_room >= want:
            kept.discard(c)
            free -= lost
            free_room -= lost_room
            for uuid, _ in held_by.get(c, ()):
                left[uuid] += 1
    return [c for c in chosen if c in kept]
