"""Why a request gets nothing: a reason code for the program, a sentence a
user can act on (pure).

Each :class:`Refusal` says whether the same request may succeed later (the
capacity is not there now: HTTP 409, :data:`NOT_NOW`) or never can as asked (HTTP 400). The
checks go from what can never change to what may, so a request that can never
fit is never told to wait.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from ..core.sharing import UNIT, SharingPolicy, fmt, fmt_list
from .index import DeviceIndex
from .links import Links
from .model import ModelIndex, total_room
from .records import ALL, Request
from .summary import ModelSummary

__all__ = [
    "NOT_NOW",
    "AllocationRefused",
    "Refusal",
    "held_for_line",
    "share_refusal",
    "short_of_resources",
    "whole_refusal",
]

# The status of a request refused for now (none free, the line goes first, its wait in
# line timed out or an admin ended it): 409 Conflict, as it conflicts with the GPUs' state
# now and the user may wait in line or choose otherwise. Not 503: that says the hub is
# failing, and JupyterHub's request log writes every 5xx at ERROR (a 4xx at WARNING).
NOT_NOW = 409


class Refusal(enum.Enum):
    """Why a request was refused."""

    BAD_COUNT = "bad_count"  # not a whole number ≥ 1 nor "all"
    BAD_SHARE = "bad_share"  # not a share the hub's sharing policy offers
    UNKNOWN_MODEL = "unknown_model"
    UNKNOWN_HOST = "unknown_host"
    HOST_TOO_SMALL = "host_too_small"  # the host has fewer devices of the model
    NO_HOST_BIG_ENOUGH = "no_host_big_enough"  # no host has that many devices of one model
    OVER_LIMIT = "over_limit"  # more than the per-user limit
    LIMIT_REACHED = "limit_reached"  # within the limit once the owner's other servers stop
    HOST_UNAVAILABLE = "host_unavailable"  # down, drained or paused
    NONE_FREE = "none_free"
    HOST_BUSY = "host_busy"  # not enough free on the host asked for
    NOT_ON_ONE_HOST = "not_on_one_host"  # enough free in all, not together where it must be
    NO_DEVICE_ROOM = "no_device_room"  # a share for one device: enough free in all, no device has that much
    TOTAL_FREE_BELOW = "total_free_below"  # less free in all than the share asks
    NO_EVEN_SPLIT = "no_even_split"  # a host has that much free in all, but no even split of it fits
    SHARES_UNENFORCED = "shares_unenforced"  # room only on nodes that lack what enforces shares
    RESOURCES_SHORT = "resources_short"  # GPUs free, but not the CPU or memory asked for beside them
    RESERVED = "reserved"  # free, but kept for the members of a reservation's open window
    HELD_FOR_LINE = "held_for_line"  # free, but only on hosts kept for requests ahead in line
    NOT_LINKED_NOW = "not_linked_now"  # no set linked as the admin requires is free now; one may be later
    NEVER_LINKED = "never_linked"  # no host's GPUs have a set linked as the admin requires

    @property
    def retry(self) -> bool:
        """Whether the same request may succeed later, as asked."""
        return self in _MAY_SUCCEED_LATER


_MAY_SUCCEED_LATER = {
    Refusal.LIMIT_REACHED,
    Refusal.HOST_UNAVAILABLE,
    Refusal.NONE_FREE,
    Refusal.HOST_BUSY,
    Refusal.NOT_ON_ONE_HOST,
    Refusal.NO_DEVICE_ROOM,
    Refusal.TOTAL_FREE_BELOW,
    Refusal.NO_EVEN_SPLIT,
    Refusal.SHARES_UNENFORCED,
    Refusal.RESOURCES_SHORT,
    Refusal.RESERVED,
    Refusal.HELD_FOR_LINE,
    Refusal.NOT_LINKED_NOW,
}


class AllocationRefused(Exception):
    """No allocation: ``reason`` for the program, ``message`` for people."""

    def __init__(self, message: str, reason: Refusal):
        super().__init__(message)
        self.message = message
        self.reason = reason

    @property
    def retry(self) -> bool:
        """Whether the same request may succeed later."""
        return self.reason.retry

    @property
    def status(self) -> int:
        return NOT_NOW if self.retry else 400


def unknown_model(model: str, models: Mapping[str, object]) -> AllocationRefused:
    return AllocationRefused(f"Unknown GPU model {model!r}; choose one of: {', '.join(models)}", Refusal.UNKNOWN_MODEL)


def held_for_line(offered: str, host: str) -> AllocationRefused:
    """What fits is only on a host kept for requests ahead in line (``Request.avoid``)."""
    return AllocationRefused(
        f"{offered} on {host}, but that host is kept for requests ahead of this one in line", Refusal.HELD_FOR_LINE
    )


def short_of_resources(offered: str, host: str, lacks: str) -> AllocationRefused:
    """GPUs that would fit, on a node without the CPU or memory asked for beside them."""
    return AllocationRefused(
        f"{offered} on {host}, but only {lacks} left there; try again later, or ask for less CPU or memory",
        Refusal.RESOURCES_SHORT,
    )


def _unknown_host(host: str, index: DeviceIndex) -> AllocationRefused:
    return AllocationRefused(f"{host} is not a GPU host; choose one of: {', '.join(index.hosts)}", Refusal.UNKNOWN_HOST)


def _host_unavailable(host: str) -> AllocationRefused:
    return AllocationRefused(
        f"{host} is not available right now (it is down, drained or paused)", Refusal.HOST_UNAVAILABLE
    )


def _host_too_small(asked: str, host: str, has: int) -> AllocationRefused:
    return AllocationRefused(f"{asked} requested on {host}, which has {has} of that model", Refusal.HOST_TOO_SMALL)


def over_limit(asked: str, need: int, limit: int, held: int) -> AllocationRefused:
    """The request would exceed the per-owner limit: never, or not until the
    owner's other servers stop. ``need`` and ``held`` in milli-shares."""
    if need > limit * UNIT:
        return AllocationRefused(f"{asked}, but the limit is {limit} per user", Refusal.OVER_LIMIT)
    return AllocationRefused(
        f"{asked}, but the limit is {limit} per user and you already hold {fmt(held)} on other servers",
        Refusal.LIMIT_REACHED,
    )


def whole_refusal(
    index: DeviceIndex,
    summaries: Mapping[str, ModelSummary],
    request: Request,
    limit: int | None,
    held: int,
    links: Links | None = None,
) -> AllocationRefused:
    """Why no host takes a request for whole GPUs. ``limit``: the per-owner
    maximum; ``held``: what the owner holds, in milli-shares; ``links``: the link
    classes required (a request that no host's links could ever meet is told so
    before one that may wait)."""
    relevant = [request.model] if request.model else list(summaries)
    asked = "All GPUs of one host" if request.count == ALL else f"{request.count} × {request.model or 'GPU'}"
    refused = _whole_host_refusal(index, request, relevant, asked, limit, held) if request.host is not None else None
    refused = refused or _whole_size_refusal(index, request, relevant, asked, limit, held)
    if refused is not None and not refused.retry:
        return refused
    linked = None if links is None else _link_refusal(index, links, request, relevant)
    if linked is not None and (refused is None or not linked.retry):
        return linked
    return refused or _whole_capacity_refusal(index, summaries, request, relevant, asked)


def _whole_host_refusal(
    index: DeviceIndex, request: Request, relevant: list[str], asked: str, limit: int | None, held: int
) -> AllocationRefused | None:
    host, count = request.host, request.count
    assert host is not None
    if host not in index.hosts:
        return _unknown_host(host, index)
    has = max((index.models[m].total.get(host, 0) for m in relevant), default=0)
    if has == 0 or (count != ALL and int(count) > has):
        return _host_too_small(asked, host, has)
    if count == ALL and limit is not None:
        least = min(index.models[m].total[host] for m in relevant if host in index.models[m].total)
        if least > (limit * UNIT - held) // UNIT:
            return over_limit(f"All {least} GPUs of {host} requested", least * UNIT, limit, held)
    if not index.is_available(host):
        return _host_unavailable(host)
    return None


def _whole_size_refusal(
    index: DeviceIndex, request: Request, relevant: list[str], asked: str, limit: int | None, held: int
) -> AllocationRefused | None:
    count = request.count
    biggest_host = max(index.models[m].biggest_host for m in relevant)
    if count != ALL and int(count) > biggest_host:
        return AllocationRefused(
            f"{asked} requested, but no host has more than {biggest_host}{'' if request.model else ' of one model'}",
            Refusal.NO_HOST_BIG_ENOUGH,
        )
    if limit is None:
        return None
    room = (limit * UNIT - held) // UNIT  # whole devices the owner may add
    if count != ALL and int(count) > room:
        return over_limit(f"{count} GPU(s) requested", int(count) * UNIT, limit, held)
    if count == ALL:
        smallest = min(index.models[m].smallest_host for m in relevant)
        if smallest > room:
            return over_limit(f"{asked} requested (at least {smallest})", smallest * UNIT, limit, held)
    return None


def _whole_capacity_refusal(
    index: DeviceIndex, summaries: Mapping[str, ModelSummary], request: Request, relevant: list[str], asked: str
) -> AllocationRefused:
    what = request.model or "GPU"
    free = sum(summaries[m].free for m in relevant)
    if free == 0:
        total = sum(summaries[m].total for m in relevant)
        others = [f"{s.model}: {s.free} free" for s in summaries.values() if s.free and s.model != request.model]
        tail = "; ".join(others) if others else "no other GPU model is free either"
        return AllocationRefused(f"No {what} is free right now (0 of {total} free); {tail}", Refusal.NONE_FREE)
    if request.host is not None:
        there = sum(len(index.models[m].free.get(request.host, ())) for m in relevant)
        return AllocationRefused(f"{asked} requested on {request.host}, {there} free there", Refusal.HOST_BUSY)
    if request.count == ALL:
        return AllocationRefused(
            f"{asked} requested ({what}), but every host has some in use right now", Refusal.NOT_ON_ONE_HOST
        )
    block = max(summaries[m].largest_block for m in relevant)
    return AllocationRefused(
        f"{asked} requested, at most {block} free on any single host ({free} free in total)", Refusal.NOT_ON_ONE_HOST
    )


def share_refusal(
    index: DeviceIndex,
    sharing: SharingPolicy,
    request: Request,
    share: int,
    models: list[str],
    limit: int | None,
    held: int,
) -> AllocationRefused:
    """Why no device takes the share, the policy having accepted it for ``models``."""
    host = request.host
    need = -(-share // UNIT)  # fewest devices it can span
    asked = f"{fmt(share)} × {request.model or 'GPU'}"
    if host is not None:
        if host not in index.hosts:
            return _unknown_host(host, index)
        has = max(index.models[m].total.get(host, 0) for m in models)
        if has < need:
            return _host_too_small(asked, host, has)
    else:
        biggest = max(index.models[m].biggest_host for m in models)
        if need > biggest:
            return AllocationRefused(
                f"{asked} requested, but no host has more than {biggest}"
                f"{'' if request.model else ' of one model'} to split it over",
                Refusal.NO_HOST_BIG_ENOUGH,
            )
    if limit is not None and held + share > limit * UNIT:
        return over_limit(f"{asked} requested", share, limit, held)
    if host is not None:
        if not index.is_available(host):
            return _host_unavailable(host)
        return AllocationRefused(f"{asked} requested on {host}, not enough free there right now", Refusal.HOST_BUSY)
    return _share_capacity_refusal(index, sharing, share, models, asked)


def _share_capacity_refusal(
    index: DeviceIndex, sharing: SharingPolicy, share: int, models: list[str], asked: str
) -> AllocationRefused:
    """Why no host takes the share now, with what would fit: no device has
    the room (or not that much is free in all), no host has that much free in
    all, or one has but no even split of it fits."""
    room = max(index.models[m].largest_room() for m in models)
    at_most = f"at most {fmt(room)} on one device"
    split = [m for m in models if (s := sharing.for_model(m)) is not None and s.spans(share)]
    if not split:
        free = _free_up_to([index.models[m] for m in models], share)
        if free < share:
            return AllocationRefused(
                f"{asked} requested, but only {fmt(free)} is free in all right now ({at_most})",
                Refusal.TOTAL_FREE_BELOW,
            )
        return AllocationRefused(
            f"{asked} requested, but not that much is free on one device right now ({at_most})",
            Refusal.NO_DEVICE_ROOM,
        )
    # The host with the most free in all: one with partly booked devices (untouched ones always split evenly).
    tops = [(_most_room(index.models[m]), m) for m in split if index.models[m].ranked]
    (total, host), model = max(tops) if tops else ((0, ""), "")
    if total < share:
        return AllocationRefused(
            f"{asked} requested, but not that much is free on one device or one host right now ({at_most})",
            Refusal.NOT_ON_ONE_HOST,
        )
    free, rooms = index.models[model].ranked[host]
    hint = "" if getattr(sharing.for_model(model), "uneven", False) else f"; uneven splits are not enabled for {model}"
    return AllocationRefused(
        f"{asked} requested, but no even split fits right now: {host} has {fmt(total)} free in all, on devices "
        f"with {fmt_list((UNIT,) * free + rooms, ', ')} free ({at_most}){hint}",
        Refusal.NO_EVEN_SPLIT,
    )


def _most_room(mi: ModelIndex) -> tuple[int, str]:
    """(room in all, host) of the host with the most, of those with partly booked devices."""
    if mi.totals:
        return mi.totals[-1]
    return max((total_room(ranked), h) for h, ranked in mi.ranked.items())  # not kept: a refusal may scan


def _free_up_to(mis: list[ModelIndex], cap: int) -> int:
    """Milli-shares free on the available hosts' devices of the models:
    exact below ``cap``, else some count of at least ``cap`` (the walk over
    every partly booked host stops there; a refusal in a busy cluster is common)."""
    free = sum(mi.free_available for mi in mis) * UNIT
    for mi in mis:
        for _, rooms in mi.ranked.values():
            if free >= cap:
                return free
            free += sum(rooms)
    return free


def _link_refusal(index: DeviceIndex, links: Links, request: Request, relevant: list[str]) -> AllocationRefused | None:
    """Why no host gives the request a set linked as the admin requires: never, when no
    host's GPUs have one (that could take it: the one asked for, when pinned); for now,
    naming the host with the most free and how its best set is linked. None when a
    relevant model takes the request without a class required (another reason holds)."""

    def hosts(mi: ModelIndex) -> list[str]:
        return [request.host] if request.host is not None else list(mi.total)

    needs = []  # (model, count, class): each relevant model's, for the count it would get
    for model in relevant:
        mi = index.models[model]
        counts = [int(request.count)] if request.count != ALL else [mi.total[h] for h in hosts(mi) if h in mi.total]
        for n in counts:  # (every GPU of a host: the class for that many)
            need = links.need(model, n)
            if need is None:
                return None
            needs.append((model, n, need))
    if not needs:
        return None
    model, n, need = needs[0]
    what = f"{n} × {model} are given only as {need.words}"
    if all(_never(index, links, m, hosts(index.models[m]), k) for m, k, _ in needs):
        return AllocationRefused(f"{what}, and no host has {n} so linked", Refusal.NEVER_LINKED)
    return AllocationRefused(
        f"{what}, and no host has {n} such free now ({_most_free(index, links, request, model, n)})",
        Refusal.NOT_LINKED_NOW,
    )


def _most_free(index: DeviceIndex, links: Links, request: Request, model: str, n: int) -> str:
    """What the host asked for (else the one with the most free) has free, and how the
    best set of ``n`` there is linked: "gpu-7 has 2 free, across CPUs"."""
    mi = index.models[model]
    block = mi.largest_block()
    if request.host is None and block < n:
        return f"at most {block} free on one host" if block else f"no {model} is free"
    host = request.host if request.host is not None else mi.buckets[block][0]
    free = mi.free.get(host, [])
    topology = links.topologies.get(host)
    best = links.best(host, free, n) if topology is not None else None  # as if no class were required
    worst = None if best is None or topology is None else topology.worst(g.uuid for g in best)
    if len(free) < n or worst is None:
        return f"{host} has {len(free)} free" + ("" if len(free) < n else ", links not known")
    return f"{host} has {len(free)} free, {worst.words}"


def _never(index: DeviceIndex, links: Links, model: str, hosts: list[str], n: int) -> bool:
    """Whether none of ``hosts`` has ``n`` GPUs of ``model`` linked as required, all free or
    not. A host with enough of them whose links are not known yet (its agent has not said,
    or does not say yet) may have such a set: not never."""
    for h in hosts:
        devices = [g for g in index.by_host.get(h, ()) if g.model == model]
        if len(devices) >= n and h not in links.topologies:
            return False
        if links.missing(model, h, devices, devices, n) is not None:
            return False
    return True
