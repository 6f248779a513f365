"""Where a request for whole GPUs goes: the (model, host) the policy ranks
first among those with enough untouched devices (pure; the index is read,
never changed)."""

from __future__ import annotations

from typing import cast

from .index import DeviceIndex
from .model import ModelIndex
from .records import ALL, Policy

__all__ = ["best_host", "choose", "first_host"]


def choose(
    index: DeviceIndex, policy: Policy, models: list[str], count: int | str, host: str | None, room: int | None
) -> tuple[str, str] | None:
    """The best (model, host) for the request, or None. Ties: hostname, then
    model. ``room``: how many more devices the owner may hold (None: no limit)."""
    best: tuple[int, str, str] | None = None  # (rank, host, model)
    for model in models:
        found = best_host(index, policy, index.models[model], count, host, room)
        if found is not None:
            key = (policy.rank(found[0]), found[1], model)
            if best is None or key < best:
                best = key
    return None if best is None else (best[2], best[1])


def best_host(
    index: DeviceIndex, policy: Policy, mi: ModelIndex, count: int | str, host: str | None, room: int | None
) -> tuple[int, str] | None:
    """(free count, host): the one of this model's hosts that takes the request best, or None."""
    if host is not None:
        if host in mi.free and index.is_available(host):
            n = len(mi.free[host])
            fits = n == mi.total[host] and (room is None or n <= room) if count == ALL else n >= cast(int, count)
            if fits and n > 0:
                return n, host
        return None
    if count == ALL:
        # Rare request: a plain scan of the hosts whose devices are all free.
        whole = [
            (policy.rank(n), h, n)
            for h, n in mi.total.items()
            if index.is_available(h) and len(mi.free[h]) == n and (room is None or n <= room)
        ]
        if not whole:
            return None
        _, h, n = min(whole)
        return n, h
    return first_host(policy, mi, cast(int, count))


def first_host(policy: Policy, mi: ModelIndex, count: int) -> tuple[int, str] | None:
    """(free count, host): of the available hosts with at least ``count``
    untouched devices, the one the policy ranks first (ties: hostname), or None."""
    buckets = mi.buckets
    for n in policy.sizes(count, len(buckets) - 1):
        bucket = buckets[n]
        if bucket:
            return n, bucket[0]
    return None
