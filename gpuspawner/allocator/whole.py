"""Where a request for whole GPUs goes: the (model, host) the policy ranks
first among those with enough untouched devices (pure; the index is read,
never changed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from .index import DeviceIndex
from .links import Links
from .model import ModelIndex
from .records import ALL, Policy

__all__ = ["Fits", "best_host", "choose", "first_host"]

Fits = Callable[[str], bool] | None  # whether a host has the CPU and memory asked for (None: any does)
LINKED_CANDIDATES = 8  # hosts the policy ranks alike whose links are looked at, at most


def choose(
    index: DeviceIndex,
    policy: Policy,
    models: list[str],
    count: int | str,
    host: str | None,
    room: int | None,
    fits: Fits = None,
    linked: Links | None = None,
) -> tuple[str, str] | None:
    """The best (model, host) for the request, or None. Ties: hostname, then
    model. ``room``: how many more devices the owner may hold (None: no limit);
    ``linked``: only hosts that give a set linked as required, and among a model's
    hosts the policy ranks alike, the best linked goes first."""
    best: tuple[int, str, str] | None = None  # (rank, host, model)
    for model in models:
        found = best_host(index, policy, index.models[model], count, host, room, fits, linked, model)
        if found is not None:
            key = (policy.rank(found[0]), found[1], model)
            if best is None or key < best:
                best = key
    return None if best is None else (best[2], best[1])


def best_host(
    index: DeviceIndex,
    policy: Policy,
    mi: ModelIndex,
    count: int | str,
    host: str | None,
    room: int | None,
    fits: Fits = None,
    linked: Links | None = None,
    model: str = "",
) -> tuple[int, str] | None:
    """(free count, host): the one of ``model``'s hosts (``mi``) that takes the request best, or None."""
    if host is not None:
        if host in mi.free and index.is_available(host) and (fits is None or fits(host)):
            free = mi.free[host]
            n = len(free)
            enough = n == mi.total[host] and (room is None or n <= room) if count == ALL else n >= cast(int, count)
            if enough and n > 0 and (linked is None or linked.ok(model, host, free, n if count == ALL else int(count))):
                return n, host
        return None
    if count == ALL:
        # Rare request: a plain scan of the hosts whose devices are all free.
        whole = [
            (policy.rank(n), h, n)
            for h, n in mi.total.items()
            if index.is_available(h) and len(mi.free[h]) == n and (room is None or n <= room)
            if (fits is None or fits(h)) and (linked is None or linked.ok(model, h, mi.free[h], n))
        ]
        if not whole:
            return None
        _, h, n = min(whole)
        return n, h
    return first_host(policy, mi, cast(int, count), fits, linked, model)


def first_host(
    policy: Policy, mi: ModelIndex, count: int, fits: Fits = None, linked: Links | None = None, model: str = ""
) -> tuple[int, str] | None:
    """(free count, host): of the available hosts with at least ``count``
    untouched devices (and the CPU and memory asked for, and with ``linked`` a set
    linked as required), the one the policy ranks first (ties: with ``linked``, the
    best linked group of the first :data:`LINKED_CANDIDATES`; then hostname), or None."""
    buckets = mi.buckets
    ranks = linked is not None and linked.ranks(count)
    usable = fits if linked is None else linked.fits(model, mi.free, count, fits)
    for n in policy.sizes(count, len(buckets) - 1):
        alike = _fitting(buckets[n], usable, LINKED_CANDIDATES if ranks else 1)
        if alike:
            if linked is None or not ranks or len(alike) == 1:
                return n, alike[0]
            return n, max(alike, key=lambda h: linked.rank(model, h, mi.free[h], count))  # (max: the first of equals)
    return None


def _fitting(hosts: list[str], fits: Fits, most: int) -> list[str]:
    """The first ``most`` of ``hosts`` with the CPU and memory asked for."""
    out = []
    for h in hosts:
        if fits is None or fits(h):
            out.append(h)
            if len(out) == most:
                break
    return out
