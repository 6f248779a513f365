"""One serving of a line, in order: who may be booked now, and where nobody may.

The line is served first to last. A waiter that is not served now (nothing it
fits is free) gets a *planned host*: the host where it would fit first as
servers end (:meth:`~gpuspawner.allocator.allocator.Allocator.nearest_host`).
That host is kept for it: nobody behind it in line, and no new request, is
placed there until it is served. Anyone behind it may be served at once on the
other hosts (backfill): what they take is on hosts no earlier waiter's plan
needs, so none of their planned starts moves later. Every earlier waiter keeps
its host, not only the first (conservative backfill): a second large request is
not starved by small ones either. A waiter whose every possible host is kept for
those ahead waits behind them and keeps nothing more.

Where the holders' ends are bounded (held-time limits), the waiter's planned
start is known too (:func:`planned_start`), and a request that must itself end
before it may use the kept host as well (the EASY rule): what it takes there is
back by then.

Without backfill (``strict``) the first waiter that is not served stops the
serving: nobody behind it is tried, and a new request waits behind the line.

Each round is planned afresh from the bookings as they are then, so a plan
follows the cluster: a host that frees up sooner than the one kept becomes the
plan the next time the line is served.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

from ..core.requests import ALL, Request
from ..core.sharing import UNIT

__all__ = ["Round", "planned_start"]

Nearest = Callable[[Request, frozenset[str]], "str | None"]  # (request, hosts kept) -> its planned host
Start = tuple[float, "str | None"]  # (seconds from now, the holder whose end it waits for; None: none)
Starts = Callable[[Request, str], "Start | None"]  # (request, its planned host) -> when it starts there


class Round:
    """The hosts kept so far in one serving of a line, each for the waiter it is planned
    for, with when that waiter is planned to start there where the holders' ends are
    bounded (``starts``; None: never known)."""

    def __init__(self, nearest: Nearest, backfill: bool = True, starts: Starts | None = None):
        self.nearest = nearest
        self.backfill = backfill
        self.starts = starts
        self.kept: dict[str, Hashable] = {}  # host -> the waiter it is kept for
        self.planned: dict[Hashable, str | None] = {}  # waiter -> its planned host (None: behind others)
        self.start: dict[Hashable, Start | None] = {}  # waiter -> its planned start (None: not known)
        self._start_at: dict[str, float] = {}  # kept host -> its waiter's planned start, where known
        self.blocked = False  # strict, and someone was not served: nobody more is

    def avoid(self, lasts: float | None = None) -> frozenset[str] | None:
        """The hosts the next waiter (or a new request) may not be placed on; None:
        it may not be served at all (strict, or someone ahead keeps the whole line).
        ``lasts``: seconds within which it must end (its held-time limit; None: no
        bound): a host whose waiter is planned to start no sooner is not kept from it,
        as what it takes there is back by then."""
        if self.blocked:
            return None
        if lasts is None:
            return frozenset(self.kept)
        return frozenset(h for h in self.kept if self._start_at.get(h, -1.0) < lasts)

    def wait(self, who: Hashable, request: Request | None) -> str | None:
        """``who`` (its ``request``) is not served now: keep its planned host for it.
        Without backfill, or without a request to plan (a row a restarted hub has
        not resumed yet), nobody behind it is served."""
        if not self.backfill or request is None:
            self.blocked = True
            self.planned[who] = None
            return None
        host = self.nearest(request, frozenset(self.kept))
        self.planned[who] = host
        if host is not None:
            self.kept[host] = who
            when = self.starts(request, host) if self.starts is not None else None
            self.start[who] = when
            if when is not None:
                self._start_at[host] = when[0]
        return host


def planned_start(
    request: Request, devices: Mapping[str, Mapping[str, int]], ends_in: Callable[[str], float | None]
) -> tuple[float, str | None] | None:
    """When ``request`` would fit on a host as its holders end: (seconds from now,
    the holder whose end it waits for; None when it fits now), or None when that is
    not known (a holder it waits for has no end bound). ``devices``: the host's
    devices of the models it takes, each with its holders' thousandths (empty:
    untouched); ``ends_in``: seconds until a holder must end (its held-time limit),
    None when nothing bounds it. CPU and memory are not counted."""
    milli = request.milli
    if milli is not None and milli < UNIT:
        return _share_start(milli, devices, ends_in)
    # Whole GPUs: a device is free once all its holders have ended.
    frees: list[tuple[float, str | None]] = []
    for held in devices.values():
        if not held:
            frees.append((0.0, None))
            continue
        ends = [(ends_in(h), h) for h in held]
        if any(t is None for t, _ in ends):
            continue  # never known to free up
        frees.append(max((t, h) for t, h in ends if t is not None))
    n = len(devices) if request.count == ALL else -(-milli // UNIT) if milli is not None else int(request.count)
    if n < 1 or len(frees) < n:
        return None
    return sorted(frees, key=lambda f: f[0])[n - 1]


def _share_start(
    milli: int, devices: Mapping[str, Mapping[str, int]], ends_in: Callable[[str], float | None]
) -> tuple[float, str | None] | None:
    """As :func:`planned_start`, for a share of one device: the first device with room for it."""
    best: tuple[float, str | None] | None = None
    for held in devices.values():
        room = UNIT - sum(held.values())
        if room >= milli:
            return 0.0, None
        for t, h in sorted(((ends_in(h), h) for h in held), key=lambda e: (e[0] is None, e[0] or 0.0)):
            if t is None:
                break
            room += held[h]
            if room >= milli:
                if best is None or t < best[0]:
                    best = (t, h)
                break
    return best
