"""Where a request that does not fit now would fit first (pure; the index is read,
never changed): the host whose start the line plans for a waiter, and keeps for
it while others are served around it (:mod:`gpuspawner.plan`).

Without the holders' end times, the best guess is the host that lacks least: the
most untouched devices of a model the request takes (up to as many as it asks),
for a share the most room on one device; among equals, one whose CPU and memory
are free for it now, then pack's order (the fewest free devices that are still
enough), then the hostname. Only hosts that could ever take it count: enough
devices of the model, CPU and memory that the host has in all, available.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from ..core.sharing import UNIT
from .index import DeviceIndex
from .model import ModelIndex
from .records import ALL, Request
from .resources import HostResources

__all__ = ["nearest_host"]


def nearest_host(
    index: DeviceIndex, resources: HostResources, request: Request, models: Iterable[str], exclude: frozenset[str]
) -> str | None:
    """The host the request is planned on, of those not in ``exclude`` (kept for
    requests ahead of it), or None when no such host could ever take it."""
    cpu, mem = request.cpu_milli, request.memory_mib

    def could(host: str) -> bool:
        if host in exclude or not index.is_available(host) or request.host is not None and host != request.host:
            return False
        has = resources.capacity(host)
        return has is None or cpu <= has[0] and mem <= has[1]

    best: tuple | None = None
    for model in sorted(set(models)):
        mi = index.models.get(model)
        if mi is None:
            continue
        for key, host in _levels(mi, request, could):
            # Lower is better: less missing; then free CPU now; then the walk's own order.
            ranked = (key, not resources.fits(host, cpu, mem))
            if best is None or ranked < best[0]:
                best = (ranked, host)
            if not ranked[1]:
                break  # the walk goes from least missing on: nothing later in it beats this
    return None if best is None else best[1]


def _levels(mi: ModelIndex, request: Request, could: Callable[[str], bool]) -> Iterator[tuple[float, str]]:
    """(fraction of the request missing on the host, host) for the hosts that could
    take the request, least missing first (ties in pack's order)."""
    milli = request.milli
    if milli is not None and milli < UNIT:
        yield from _share_levels(mi, milli, could)
        return
    if request.count == ALL:
        # Rare: every device of a host; the host whose devices are most nearly all free.
        ranked = sorted((1 - len(mi.free[h]) / n, h) for h, n in mi.total.items() if n and could(h))
        yield from ranked
        return
    n = -(-milli // UNIT) if milli is not None else int(request.count)
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
