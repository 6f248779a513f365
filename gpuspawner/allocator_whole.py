"""Where a request for whole GPUs goes: the (model, host) the policy ranks
first among those with enough untouched devices (pure; the index is read,
never changed)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

from .allocator_index import DeviceIndex
from .allocator_model import ModelIndex
from .allocator_types import ALL, Policy

__all__ = ["candidates", "choose"]


def choose(
    index: DeviceIndex, policy: Policy, models: list[str], count: int | str, host: str | None, room: int | None
) -> tuple[str, str] | None:
    """The best (model, host) for the request, or None. Ties: hostname, then
    model. ``room``: how many more devices the owner may hold (None: no limit)."""
    best: tuple[int, str, str] | None = None  # (rank, host, model)
    for model in models:
        for n, h in candidates(index, policy, index.models[model], count, host, room):
            key = (policy.rank(n), h, model)
            if best is None or key < best:
                best = key
            break  # candidates come best first within a model
    return None if best is None else (best[2], best[1])


def candidates(
    index: DeviceIndex, policy: Policy, mi: ModelIndex, count: int | str, host: str | None, room: int | None
) -> Iterator[tuple[int, str]]:
    """(free count, host) of one model's hosts that take the request, best first."""
    if host is not None:
        if host in mi.free and index.is_available(host):
            n = len(mi.free[host])
            fits = n == mi.total[host] and (room is None or n <= room) if count == ALL else n >= cast(int, count)
            if fits and n > 0:
                yield n, host
        return
    if count == ALL:
        # Rare request: a plain scan of the hosts whose devices are all free.
        whole = sorted(
            (policy.rank(n), h)
            for h, n in mi.total.items()
            if index.is_available(h) and len(mi.free[h]) == n and (room is None or n <= room)
        )
        for _, h in whole:
            yield mi.total[h], h
        return
    top = len(mi.buckets) - 1
    for n in policy.sizes(cast(int, count), top):
        bucket = mi.buckets[n]
        if bucket:
            yield n, bucket[0]
