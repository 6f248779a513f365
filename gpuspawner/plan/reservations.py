"""What reservations keep for their members, as capacity kept for groups over time
(pure: the standard library and the pure core): the scheduling rules of reservations,
beside the line's (:mod:`gpuspawner.plan.backfill`).

During a window, the GPUs its members do not hold are kept free for them: a
request of anyone else is granted only if as many untouched devices of the
model stay free (:func:`keep_free`); for a share total, as much free room (the
thousandths nobody holds, on untouched and shared devices alike). A holding
counts toward one reservation at most, though its user be a member of several
open ones (:func:`count_toward`). At a window's start, servers of users who are
members of no reservation of the model open then are stopped, newest first, until
what the open windows lack together is free (:func:`make_room`, :func:`to_stop`);
they are told ahead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from ..core.reservations import Reservation, Window
from ..core.sharing import UNIT, fmt

__all__ = [
    "Candidate",
    "Holder",
    "Keep",
    "Need",
    "count_toward",
    "keep_free",
    "make_room",
    "members_hold",
    "needs",
    "to_stop",
]


@dataclass(frozen=True)
class Keep:
    """What a request of someone else must leave free of a model: ``devices``
    untouched (reservations of whole GPUs) and, beyond theirs, ``room``
    thousandths nobody holds, on any device (share totals); and ``most``, the
    most thousandths of it the request may take (a quota's borrowing limit; None:
    no limit)."""

    devices: int = 0
    room: int = 0
    most: int | None = None

    def __add__(self, other: Keep) -> Keep:
        most = other.most if self.most is None else self.most if other.most is None else min(self.most, other.most)
        return Keep(self.devices + other.devices, self.room + other.room, most)

    def __bool__(self) -> bool:
        return bool(self.devices or self.room or self.most is not None)

    def met(self, untouched: int, room: int, taken: int = 0) -> bool:
        """Whether ``untouched`` devices and ``room`` free thousandths (theirs included) leave
        it, for a request that takes ``taken`` thousandths."""
        return (
            untouched >= self.devices
            and room >= self.devices * UNIT + self.room
            and (self.most is None or taken <= self.most)
        )


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
        of = of_model[h.model]
        mine = of if len(of) == 1 else [r for r in of if r.group in h.groups]
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


def members_hold(reservations: Iterable[Reservation], holders: Iterable[Holder], now: datetime) -> dict[int, float]:
    """Per reservation id, the GPUs its members hold (shares as fractions), each holding
    counted toward one of ``reservations`` at most (:func:`count_toward`)."""
    holders = list(holders)
    milli = {h.key: h.milli for h in holders}
    held: dict[int, float] = {}
    for key, rid in count_toward(reservations, holders, now).items():
        held[rid] = held.get(rid, 0.0) + milli[key] / UNIT
    return held


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


class Candidate(NamedTuple):
    """A server a window's start may stop: ``name`` (its service), its user's ``groups``
    now (None: JupyterHub could not say, and it is not stopped) and when its held-time
    limit ends it (``ends``; None: nothing does)."""

    name: str
    groups: Collection[str] | None
    ends: datetime | None


def make_room(
    near: Iterable[Reservation],
    now: datetime,
    ahead: timedelta,
    members_hold: Callable[[list[Reservation]], Mapping[int, float]],
    devices: Callable[[str], Mapping[str, Mapping[str, int]]],
    candidates: Callable[[str, Collection[str]], Sequence[Candidate]],
    waiting: Mapping[int, int] | None = None,
) -> dict[str, Need]:
    """The servers that must end for the windows of ``near`` that are open at ``now`` or
    open within ``ahead``: service name -> the need of the window that first requires it.

    Each moment a window opens is taken in turn, with what the windows of the model open
    then lack together (``members_hold`` of them: reservation id -> GPUs their members
    hold, each holding counted toward one at most), so no more are stopped than all of
    them need. Only a server of a user known to be a member of no reservation of the
    model open then, and whose held-time limit does not end it by then, is stopped;
    newest first (``candidates(model, devices held)``, newest first, removing ones left
    out), then any whose stop is not needed after all is let off (:func:`to_stop`).
    ``devices``: the model's devices, each with its holders' thousandths."""
    out: dict[str, Need] = {}
    by_model: dict[str, list[tuple[Reservation, Window]]] = {}
    for r in near:
        w = r.next_window(now)
        if w is not None and w.start <= now + ahead:
            by_model.setdefault(r.model, []).append((r, w))
    for model, windows in by_model.items():
        booked: Mapping[str, Mapping[str, int]] | None = None
        servers: Sequence[Candidate] = ()
        for t in sorted({max(w.start, now) for _, w in windows}):
            open_then = [r for r, w in windows if w.start <= t < w.end]
            lacking = [
                n
                for n in needs(open_then, now, members_hold(open_then), ahead, waiting)
                if n.keep and n.window.start <= t < n.window.end
            ]
            if not lacking:
                continue
            if booked is None:
                booked = devices(model)
                servers = candidates(model, {name for held in booked.values() for name in held})
            groups = {r.group for r in open_then}  # members of any of them are not stopped for them
            in_the_way = [
                c.name
                for c in servers
                if c.name not in out
                and c.groups is not None
                and groups.isdisjoint(c.groups)
                and (c.ends is None or c.ends > t)
            ]
            left = {uuid: {k: v for k, v in held.items() if k not in out} for uuid, held in booked.items()}
            first = min(lacking, key=lambda n: n.window.start)
            kept = sum((n.keep for n in lacking), Keep())
            for name in to_stop(kept.devices, left, in_the_way, kept.room):
                out[name] = first
    return out
