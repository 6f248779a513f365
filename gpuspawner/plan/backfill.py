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
plan the next time the line is served. Where the planned starts are known, a
waiter keeps the host of the last round's plan unless another host starts it
sooner: "lacks least" alone could move it to a host that starts it later (a
server ending elsewhere changes which host lacks least), and its planned start
would then move later.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Set
from typing import Any

from ..allocator.resources import Room
from ..core.requests import ALL, Request
from ..core.sharing import UNIT

__all__ = ["Round", "devices_needed", "planned_start"]

Nearest = Callable[[Request, Set[str]], "str | None"]  # (request, hosts kept) -> its planned host
Start = tuple[float, "str | None"]  # (seconds from now, the holder whose end it waits for; None: none)
Starts = Callable[[Request, str], "Start | None"]  # (request, its planned host) -> when it starts there


class Round:
    """The hosts kept so far in one serving of a line, each for the waiter it is planned
    for, with when that waiter is planned to start there where the holders' ends are
    bounded (``starts``, worked out when first asked: :meth:`start_of`)."""

    def __init__(
        self,
        nearest: Nearest,
        backfill: bool = True,
        starts: Starts | None = None,
        before: Mapping[Any, str | None] | None = None,
        could: Callable[[Request, str], bool] | None = None,
    ):
        self.nearest = nearest
        self.backfill = backfill
        self.starts = starts
        self.before = before or {}  # waiter -> its planned host in the last round (see wait)
        self.could = could  # (request, host) -> whether the host could ever take it
        self.kept: dict[str, Hashable] = {}  # host -> the waiter it is kept for
        self.planned: dict[Hashable, str | None] = {}  # waiter -> its planned host (None: behind others)
        self._asked: dict[Hashable, Request] = {}  # waiter with a planned host -> its request
        self._start: dict[Hashable, Start | None] = {}  # waiter -> its planned start, once worked out
        self.blocked = False  # strict, and someone was not served: nobody more is
        self.kept_out: set[Hashable] = set()  # waiters whose every possible host is kept for those ahead

    def avoid(self, lasts: float | None = None) -> frozenset[str] | None:
        """The hosts the next waiter (or a new request) may not be placed on; None:
        it may not be served at all (strict, or someone ahead keeps the whole line).
        ``lasts``: seconds within which it must end (its held-time limit; None: no
        bound): a host whose waiter is planned to start no sooner is not kept from it,
        as what it takes there is back by then."""
        if self.blocked:
            return None
        if lasts is None or self.starts is None:
            return frozenset(self.kept)
        return frozenset(h for h, who in self.kept.items() if (s := self.start_of(who)) is None or s[0] < lasts)

    def start_of(self, who: Hashable) -> Start | None:
        """When ``who`` is planned to start on its host (None: not known, or no host)."""
        if who not in self._start:
            request, host = self._asked.get(who), self.planned.get(who)
            ok = self.starts is not None and request is not None and host is not None
            self._start[who] = self.starts(request, host) if ok else None  # type: ignore[misc,arg-type]
        return self._start[who]

    def wait(self, who: Hashable, request: Request | None) -> str | None:
        """``who`` (its ``request``) is not served now: keep its planned host for it.
        Without backfill, or without a request to plan (a row a restarted hub has
        not resumed yet), nobody behind it is served."""
        if not self.backfill or request is None:
            self.blocked = True
            self.planned[who] = None
            return None
        host = self.nearest(request, self.kept.keys())  # (only grows: Allocator.planner walks on)
        if host is not None:
            host = self._kept_sooner(who, request, host)
        self.planned[who] = host
        if host is not None:
            self.kept[host] = who
            self._asked[who] = request
        else:
            self.kept_out.add(who)
        return host

    def _kept_sooner(self, who: Hashable, request: Request, host: str) -> str:
        """``host`` (the one that lacks least), or the host ``who`` was planned on in the
        last round where its start there is known and no later: nothing else could have
        been placed there to delay it (it was kept), so its planned start never moves later."""
        last = self.before.get(who)
        if self.starts is None or self.could is None or last is None or last == host or last in self.kept:
            return host
        if not self.could(request, last):
            return host  # (drained, gone, or no longer enough for it)
        then = self.starts(request, last)
        if then is None:
            return host  # (it no longer fits there, or its start is not known)
        now = self.starts(request, host)
        if now is not None and now[0] < then[0]:
            self._start[who] = now
            return host
        self._start[who] = then
        return last

    def request_of(self, who: Hashable) -> Request | None:
        """What ``who`` asked for, where it has a planned host."""
        return self._asked.get(who)


def planned_start(
    request: Request,
    devices: Mapping[str, Mapping[str, int]],
    ends_in: Callable[[str], float | None],
    room: Room | None = None,
) -> tuple[float, str | None] | None:
    """When ``request`` would fit on a host as its holders end: (seconds from now,
    the holder whose end it waits for; None when it fits now), or None when that is
    not known (a holder it waits for has no end bound). ``devices``: the host's
    devices of the models it takes, each with its holders' thousandths (empty:
    untouched); ``ends_in``: seconds until a holder must end (its held-time limit),
    None when nothing bounds it; ``room``: the host's CPU and memory free now and
    what each holder there reserves (None: not counted). It starts once both its
    GPUs and its CPU and memory are free."""
    gpus = _gpu_start(request, devices, ends_in)
    if gpus is None or room is None:
        return gpus
    cpu = _room_start(request.cpu_milli, request.memory_mib, room, ends_in)
    if cpu is None:
        return None
    return max(gpus, cpu, key=lambda s: s[0])


def _room_start(cpu: int, mem: int, room: Room, ends_in: Callable[[str], float | None]) -> Start | None:
    """When ``cpu`` and ``mem`` are free on a host with ``room``, as its holders end."""
    free, held = room
    if free is None:
        return 0.0, None  # not limited
    have_cpu, have_mem = free
    if cpu <= have_cpu and mem <= have_mem:
        return 0.0, None
    for t, h in sorted(((ends_in(h), h) for h in held), key=lambda e: (e[0] is None, e[0] or 0.0)):
        if t is None:
            return None  # what it waits for has no end bound
        have_cpu, have_mem = have_cpu + held[h][0], have_mem + held[h][1]
        if cpu <= have_cpu and mem <= have_mem:
            return t, h
    return None  # others' servers hold the rest: not known to free up


def _gpu_start(
    request: Request, devices: Mapping[str, Mapping[str, int]], ends_in: Callable[[str], float | None]
) -> Start | None:
    """When the GPUs of ``request`` are free on a host (see :func:`planned_start`)."""
    milli = request.milli
    if milli is not None and milli < UNIT:
        return _share_start(milli, devices, ends_in)
    # Whole GPUs: a device is free once all its holders have ended.
    frees: list[tuple[float, str | None]] = []
    for held in devices.values():
        last: tuple[float, str | None] = (0.0, None)
        for h in held:
            t = ends_in(h)
            if t is None:
                break  # never known to free up
            if last[1] is None or t > last[0]:
                last = (t, h)
        else:
            frees.append(last)
    n = devices_needed(request, devices)
    if n < 1 or len(frees) < n:
        return None
    return sorted(frees, key=lambda f: f[0])[n - 1]


def devices_needed(request: Request, devices: Mapping[str, object]) -> int:
    """How many of a host's ``devices`` a request for whole GPUs takes: all of them for
    ``ALL``, a share of more than one GPU rounded up, else its count."""
    milli = request.milli
    return len(devices) if request.count == ALL else -(-milli // UNIT) if milli is not None else int(request.count)


def _share_start(
    milli: int, devices: Mapping[str, Mapping[str, int]], ends_in: Callable[[str], float | None]
) -> tuple[float, str | None] | None:
    """As :func:`_gpu_start`, for a share of one device: the first device with room for it."""
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


class StartsCache:
    """Planned starts kept between servings of a line, per host while its bookings stay
    the same (``version``: the allocator's count of changes on a host) and for at most
    ``ttl`` seconds (the holders' limits can change): most of a thousand hosts do not
    change between two servings, and working a start out reads every device of its host.
    ``clock``: monotonic seconds; a start is kept as the moment it falls at."""

    def __init__(
        self,
        compute: Starts,
        version: Callable[[str], int],
        clock: Callable[[], float],
        ttl: float = 60.0,
        size: int = 10_000,
    ):
        self.compute, self.version, self.clock, self.ttl, self.size = compute, version, clock, ttl, size
        self._kept: dict[tuple, tuple[float, tuple[float, str | None] | None]] = {}

    def starts(self, since: float) -> Starts:
        """A plan's ``starts``, in seconds from ``since`` (when the plan was made)."""

        def start(request: Request, host: str) -> Start | None:
            now = self.clock()
            key = (
                host,
                self.version(host),
                request.count,
                request.milli,
                request.cpu_milli,
                request.memory_mib,
                request.model,
                request.models,
            )
            found = self._kept.get(key)
            if found is None or now - found[0] > self.ttl:
                if len(self._kept) >= self.size:
                    self._kept.clear()
                got = self.compute(request, host)
                found = self._kept[key] = (now, None if got is None else (now + got[0], got[1]))
            at = found[1]
            return None if at is None else (at[0] - since, at[1])

        return start
