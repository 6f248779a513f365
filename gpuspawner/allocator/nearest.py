"""Where a request that does not fit now would fit first (pure; the index is read,
never changed): the host whose start the line plans for a waiter, and keeps for
it while others are served around it (:mod:`gpuspawner.plan`).

Without the holders' end times, the best guess is the host that lacks least: the
most untouched devices of a model the request takes (up to as many as it asks),
for a share the most room on one device; among equals, one whose CPU and memory
are free for it now, then pack's order (the fewest free devices that are still
enough), then the hostname. Only hosts that could ever take it count: enough
devices of the model, CPU and memory that the host has in all, available.

Where the admin requires a link class for the request's model and count
(:mod:`~gpuspawner.allocator.links`), the same rule holds as for placement: only
hosts with a set of their GPUs that meets it could ever take it, and what a host lacks
is the fewest GPUs that must free up before one such set is all free (every host of
the model is looked at, in that case, not only the buckets' first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Set

from ..core.inventory import GPU
from ..core.sharing import UNIT
from .index import DeviceIndex
from .links import Links
from .model import ModelIndex
from .records import ALL, Request
from .resources import HostResources

__all__ = ["Walks", "nearest_host"]


def nearest_host(
    index: DeviceIndex,
    resources: HostResources,
    request: Request,
    models: Iterable[str],
    exclude: Set[str],
    links: Links | None = None,
) -> str | None:
    """The host the request is planned on, of those not in ``exclude`` (kept for
    requests ahead of it), or None when no such host could ever take it. ``links``:
    the link classes required, and the hosts' links."""
    could = _could(index, resources, request, exclude)
    walks = (
        _levels(index, m, mi, request, could, links)
        for m in sorted(set(models))
        if (mi := index.models.get(m)) is not None
    )
    return _best(resources, request, walks, exclude)


class Walks:
    """:func:`nearest_host` for the waiters of one plan, asked in line order while the
    hosts excluded only grow (each waiter's planned host is kept from those behind it)
    and nothing else changes: the walk of each model and kind of request is made once
    and resumed, its hosts that became excluded dropped as met, so a line of 200 does
    not walk again past the hosts kept for those ahead for each waiter. The answers
    are those of :func:`nearest_host` (property-tested)."""

    def __init__(self, index: DeviceIndex, resources: HostResources, links: Links | None = None):
        self.index, self.resources, self.links = index, resources, links
        self._walks: dict[tuple, _Walk] = {}

    def nearest(self, request: Request, models: Iterable[str], exclude: Set[str]) -> str | None:
        """As :func:`nearest_host`; ``exclude`` holds every host excluded at an earlier call."""
        kind = (request.count, request.milli, request.cpu_milli, request.memory_mib, request.host)
        walks = []
        for model in sorted(set(models)):
            mi = self.index.models.get(model)
            if mi is None:
                continue
            walk = self._walks.get((model, kind))
            if walk is None:
                could = _could(self.index, self.resources, request, frozenset())
                walk = self._walks[(model, kind)] = _Walk(_levels(self.index, model, mi, request, could, self.links))
            walks.append(walk.among(exclude))
        return _best(self.resources, request, walks, exclude)


class _Walk:
    """One model's walk for one kind of request: what it yielded so far, less the
    hosts found excluded, then the rest of it."""

    def __init__(self, levels: Iterator[tuple[float, str]]):
        self.levels = levels
        self.seen: list[tuple[float, str]] = []

    def among(self, exclude: Set[str]) -> Iterator[tuple[float, str]]:
        self.seen = [e for e in self.seen if e[1] not in exclude]  # (excluded hosts stay so)
        yield from self.seen
        for entry in self.levels:
            self.seen.append(entry)
            yield entry


def _could(index: DeviceIndex, resources: HostResources, request: Request, exclude: Set[str]) -> Callable[[str], bool]:
    """Whether a host could ever take ``request`` (and is not in ``exclude``)."""
    cpu, mem = request.cpu_milli, request.memory_mib

    def could(host: str) -> bool:
        if host in exclude or not index.is_available(host) or request.host is not None and host != request.host:
            return False
        has = resources.capacity(host)
        return has is None or cpu <= has[0] and mem <= has[1]

    return could


def _best(
    resources: HostResources, request: Request, walks: Iterable[Iterator[tuple[float, str]]], exclude: Set[str]
) -> str | None:
    """The best host of each model's walk (least missing first), then of them all."""
    cpu, mem = request.cpu_milli, request.memory_mib
    best: tuple | None = None
    for walk in walks:
        for key, host in walk:
            if host in exclude:
                continue
            # Lower is better: less missing; then free CPU now; then the walk's own order.
            ranked = (key, not resources.fits(host, cpu, mem))
            if best is None or ranked < best[0]:
                best = (ranked, host)
            if not ranked[1]:
                break  # the walk goes from least missing on: nothing later in it beats this
    return None if best is None else best[1]


def _levels(
    index: DeviceIndex, model: str, mi: ModelIndex, request: Request, could: Callable[[str], bool], links: Links | None
) -> Iterator[tuple[float, str]]:
    """(fraction of the request missing on the host, host) for the hosts that could
    take the request, least missing first (ties in pack's order)."""
    milli = request.milli
    if milli is not None and milli < UNIT:
        yield from _share_levels(mi, milli, could)
        return
    if request.count == ALL:
        # Rare: every device of a host; the host whose devices are most nearly all free.
        if links is not None:
            could = _linked_could(index, model, mi, could, links)
        ranked = sorted((1 - len(mi.free[h]) / n, h) for h, n in mi.total.items() if n and could(h))
        yield from ranked
        return
    n = -(-milli // UNIT) if milli is not None else int(request.count)
    if milli is None and links is not None and links.need(model, n) is not None:
        yield from _linked_levels(index, model, mi, n, could, links)
        return
    buckets = mi.buckets
    for b in range(min(n, len(buckets) - 1), len(buckets)):  # enough untouched: pack's order
        for h in buckets[b]:
            if b >= n and could(h):
                yield 0.0, h
    for b in range(min(n, len(buckets)) - 1, -1, -1):  # fewer: the most first
        for h in buckets[b]:
            if mi.total[h] >= n and could(h):
                yield (n - b) / n, h


def _share_levels(mi: ModelIndex, milli: int, could: Callable[[str], bool]) -> Iterator[tuple[float, str]]:
    """As :func:`_levels`, for a share of one device: the room on a host's roomiest device."""
    buckets = mi.buckets
    for b in range(1, len(buckets)):  # an untouched device takes it
        for h in buckets[b]:
            if could(h):
                yield 0.0, h
    rooms = mi.rooms
    for room in reversed(rooms.values):  # shared devices, the most room first
        for host, _, _ in rooms.by_room[room]:
            if could(host):
                yield max(0.0, (milli - room) / milli), host
    for h in buckets[0]:  # every device held (whole, or shared to the full)
        if could(h):
            yield 1.0, h


def _linked_levels(
    index: DeviceIndex, model: str, mi: ModelIndex, n: int, could: Callable[[str], bool], links: Links
) -> Iterator[tuple[float, str]]:
    """As :func:`_levels`, for ``n`` GPUs that must be linked as required: what a host
    lacks is the fewest of its GPUs that must free up before such a set is all free."""
    ranked = []
    for h, total in mi.total.items():
        if total >= n and could(h):
            free = mi.free[h]
            missing = links.missing(model, h, _devices(index, model, h), free, n)
            if missing is not None:  # (pack's order among equals: fewest free when it fits, else most)
                ranked.append((missing / n, len(free) if not missing else -len(free), h))
    for key, _, h in sorted(ranked):
        yield key, h


def _linked_could(
    index: DeviceIndex, model: str, mi: ModelIndex, could: Callable[[str], bool], links: Links
) -> Callable[[str], bool]:
    """``could``, for all of a host's GPUs: only where they are linked as required for that many."""

    def linked(h: str) -> bool:
        devices = _devices(index, model, h)
        return could(h) and links.missing(model, h, devices, mi.free[h], len(devices)) is not None

    return linked


def _devices(index: DeviceIndex, model: str, host: str) -> list[GPU]:
    return [g for g in index.by_host.get(host, ()) if g.model == model]
