"""Quotas: GPUs guaranteed to a group, lent while idle and taken back with notice
(pure: the standard library and the pure core), beside the reservations' rules
(:mod:`gpuspawner.plan.reservations`) and the line's (:mod:`gpuspawner.plan.backfill`).

A quota guarantees a JupyterHub group a number of GPUs of one model (or a share
total) at any time. Its members' holdings, oldest first, count within it until it
is full; what its members hold beyond it, and what users of no quota of the model
hold, is *borrowed* (:func:`marks`). While a group leaves its quota idle, anyone
may use it, up to the quota's lending limit; a group may go beyond its own quota
only up to its borrowing limit (:func:`keep`). When a member of a group below its
quota waits for a request within it and nothing free fits, borrowed holdings are
taken back, only as many as needed: those that serve it soonest (a notice already
running is nearer its end than a new one), then the fewest GPU-hours lost, on the host
where that is best (:func:`reclaim`, :func:`plan_reclaims`). A holding within
its group's quota is never taken back for another's.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ..core.quotas import NOTICE, Quota
from ..core.sharing import UNIT
from .reservations import Holder, Keep

__all__ = [
    "NOTICE",
    "Ask",
    "Borrowed",
    "Mark",
    "Quota",
    "Waiter",
    "draws_on",
    "in_turn",
    "keep",
    "marks",
    "plan_reclaims",
    "reclaim",
    "used",
]

BRUTE_MAX = 8  # borrowed holdings on one host above which the best set is found greedily


class Mark(NamedTuple):
    """How a holding (or a request) stands: the quota ``group`` it draws on (None: its
    user is in no group with a quota of its model) and whether it is ``within`` that
    quota (False: borrowed)."""

    group: str | None
    within: bool


def _by_model(quotas: Iterable[Quota]) -> dict[str, dict[str, Quota]]:
    out: dict[str, dict[str, Quota]] = {}
    for q in quotas:
        out.setdefault(q.model, {})[q.group] = q
    return out


def draws_on(quotas: Mapping[str, Quota], used: Mapping[str, int], groups: Collection[str], milli: int) -> Mark:
    """Which of ``quotas`` (group -> quota, of one model) a holding or request of
    ``milli`` thousandths by a user in ``groups`` draws on, with the groups' use so far
    (``used``: group -> thousandths). Within a quota when it fits what the group has
    left; among several, the one with the most left (so the group with least left keeps
    it for its other members), then the first by name. Beyond them all: borrowed, drawn
    on the one with the most left."""
    mine = sorted(g for g in groups if g in quotas)
    if not mine:
        return Mark(None, False)
    left = {g: quotas[g].milli - used.get(g, 0) for g in mine}
    fits = [g for g in mine if left[g] >= milli]
    pick = min(fits or mine, key=lambda g: (-left[g], g))
    return Mark(pick, bool(fits))


def marks(quotas: Iterable[Quota], holders: Iterable[Holder]) -> dict[str, Mark]:
    """Each holding of a model that has quotas (``holders``, oldest first), marked: its
    group's holdings count within its quota, oldest first, until one does not fit; that
    one and every later one of the group are borrowed (a group below its quota borrows
    nothing). Holdings of models without quotas are left out."""
    of_model = _by_model(quotas)
    use: dict[tuple[str, str], int] = {}
    out: dict[str, Mark] = {}
    for h in holders:
        mine = of_model.get(h.model)
        if mine is None:
            continue
        so_far = {g: use.get((g, h.model), 0) for g in mine}
        mark = draws_on(mine, so_far, h.groups, h.milli)
        if mark.group is not None:  # (one that does not fit leaves its group over: later ones are borrowed too)
            use[(mark.group, h.model)] = so_far[mark.group] + h.milli
        out[h.key] = mark
    return out


def used(quotas: Iterable[Quota], holders: Iterable[Holder], found: Mapping[str, Mark]) -> dict[tuple[str, str], int]:
    """(group, model) -> the thousandths its members hold drawing on its quota (within
    and beyond), from ``marks``' answer ``found``."""
    out = {(q.group, q.model): 0 for q in quotas}
    for h in holders:
        m = found.get(h.key)
        if m is not None and m.group is not None:
            out[(m.group, h.model)] += h.milli
    return out


def keep(
    quotas: Iterable[Quota],
    use: Mapping[tuple[str, str], int],
    waiting: Mapping[tuple[str, str], int],
    groups: Collection[str],
    asks: Mapping[str, int] | None = None,
    borrows_idle: bool = True,
) -> dict[str, Keep]:
    """Per model, what a request of a user in ``groups`` must leave free for the quotas
    of others (``use``: (group, model) -> thousandths held drawing on it; ``waiting``:
    (group, model) -> thousandths their members wait for within it, ahead of this
    request: for a waiter within its own quota, those before it in line; for any other,
    all): of each other group's idle quota, the part it does not lend or what its
    members wait for, whichever is more. (Two waiters within their quotas that kept a
    free GPU from each other would both wait: the one ahead takes it, and borrowed GPUs
    are taken back for the other.) With ``asks`` (model -> thousandths the request
    takes), a request beyond every quota of the user's is also held to the borrowing
    limit of the quota it draws on (:attr:`Keep.most`); one whose size is not known (0:
    all of a host's GPUs), to the most its quotas' limits allow. A request beyond its quota (or
    of unknown size) that may not be taken back (``borrows_idle`` False: its user's class
    is not preemptible) must leave all of others' idle quota free: what it borrowed would
    be kept from them for good."""
    out: dict[str, Keep] = {}
    for model, mine in _by_model(quotas).items():
        k = Keep()
        so_far = {g: use.get((g, model), 0) for g in mine}
        ask = (asks or {}).get(model)
        mark = draws_on(mine, so_far, groups, ask) if ask else Mark(None, False)  # (0: size not known)
        lends = borrows_idle or mark.within
        for g, q in mine.items():
            if g in groups:
                continue
            idle = max(0, q.milli - so_far[g])
            lent = 0 if not lends else q.milli if q.lend is None else min(q.lend, q.milli)
            kept = max(idle - lent, min(idle, waiting.get((g, model), 0)))
            if kept:
                k = k + (Keep(-(-kept // UNIT)) if q.whole else Keep(0, kept))
        q = mine.get(mark.group) if mark.group is not None else None
        if q is not None and not mark.within and q.borrow is not None:
            k = k + Keep(most=max(0, q.milli + q.borrow - so_far[q.group]))
        elif ask == 0:  # all of a host: at most what the most generous of the user's quotas allows
            limits = [mine[g] for g in groups if g in mine]
            if limits and all(q.borrow is not None for q in limits):
                k = k + Keep(most=max(max(0, q.milli + (q.borrow or 0) - so_far[q.group]) for q in limits))
        if k:
            out[model] = k
    return out


class Ask(NamedTuple):
    """What a waiter asks of a model: ``count`` whole GPUs on one host, or a share of
    ``milli`` thousandths of one device (count 0)."""

    count: int = 0
    milli: int = 0


class Borrowed(NamedTuple):
    """A borrowed holding that may be taken back: its ``key``, the GPU-hours its stop
    would lose (``cost``: GPUs held times hours held), the seconds until it may be
    stopped (``ready``: its notice, or what is left of it once its user was told) and its
    user's priority class's ``rank`` (lower ranks are taken back first)."""

    key: str
    cost: float
    ready: float = 0.0
    rank: int = 0


Weight = tuple[float, float, int]  # (ready, cost, rank) of one holding


def _rank(gone: Iterable[str], weight: Mapping[str, Weight]) -> tuple[float, int, float, int]:
    """How a set of holdings to stop ranks (lower first): the waiter served soonest (the
    latest of their notices), then the lowest priority class taken, then the fewest
    GPU-hours lost, then the fewest stopped."""
    gone = list(gone)
    return (
        round(max((weight[k][0] for k in gone), default=0.0), 6),
        max((weight[k][2] for k in gone), default=-(10**9)),
        round(sum(weight[k][1] for k in gone), 9),
        len(gone),
    )


def _fits(
    ask: Ask, devices: Mapping[str, Mapping[str, int]], gone: Collection[str], spare: int | None = None
) -> list[str] | None:
    """The devices of one host ``ask`` would take once ``gone`` are stopped (None: it does
    not fit), using at most ``spare`` of the devices nobody holds now (None: any): what
    it must leave untouched for others (reservations' windows, quotas not lent) it may
    not take, only what the stops free."""
    untouched = [u for u, held in devices.items() if not held]
    freed = [u for u, held in devices.items() if held and all(k in gone for k in held)]
    allowed = len(untouched) if spare is None else max(0, min(spare, len(untouched)))
    if ask.count:
        usable = freed + untouched[:allowed]  # what the stops free first
        return usable[: ask.count] if len(usable) >= ask.count else None
    best = None
    for u, held in devices.items():
        if not held and allowed == 0:
            continue
        room = UNIT - sum(m for k, m in held.items() if k not in gone)
        # The fullest that has room, as pack places a share; an untouched device last.
        if room >= ask.milli and (best is None or (not held, room) < best[0]):
            best = ((not held, room), u)
    return None if best is None else [best[1]]


def reclaim(
    ask: Ask,
    hosts: Mapping[str, Mapping[str, Mapping[str, int]]],
    borrowed: Iterable[Borrowed],
    spare: int | None = None,
) -> tuple[str, list[str], list[str]] | None:
    """Where ``ask`` is served soonest by taking back ``borrowed`` holdings, and of those
    the fewest GPU-hours: (host, the keys to stop, the devices it would take), among
    ``hosts`` (host -> device -> {holder: thousandths}; empty: free), using at most
    ``spare`` of the devices nobody holds (None: any). Only a set none of whose members
    can be left out; ranked by :func:`_rank`, then by host and keys (so a plan keeps the
    holdings already told: theirs are the nearest stops). None: no host can serve it
    even with every borrowed holding there stopped. Exact up to BRUTE_MAX borrowed
    holdings on a host, soonest and cheapest first beyond; a host that could do no
    better than the best found is not searched."""
    weight = {b.key: (b.ready, b.cost, b.rank) for b in borrowed}
    best: tuple[tuple, str, list[str], list[str]] | None = None
    for host in sorted(hosts):
        devices = hosts[host]
        mine = sorted(
            {k for held in devices.values() for k in held if k in weight},
            key=lambda k: (weight[k][0], weight[k][2], weight[k][1], k),
        )
        if best is not None and mine and best[0][:4] <= _least(mine, weight):
            if _fits(ask, devices, (), spare) is None:
                continue  # (stopping anything here ranks no better than what was found)
        found = _cheapest(ask, devices, mine, weight, spare)
        if found is None:
            continue
        gone, taken = found
        rank = (*_rank(gone, weight), host, sorted(gone))
        if best is None or rank < best[0]:
            best = (rank, host, sorted(gone), taken)
        if not gone:
            break  # nothing to stop: no host can do better
    return None if best is None else (best[1], best[2], best[3])


def _least(mine: Sequence[str], weight: Mapping[str, Weight]) -> tuple[float, int, float, int]:
    """The best rank any non-empty set of ``mine`` could have."""
    return (
        round(min(weight[k][0] for k in mine), 6),
        min(weight[k][2] for k in mine),
        round(min(weight[k][1] for k in mine), 9),
        1,
    )


def _cheapest(
    ask: Ask,
    devices: Mapping[str, Mapping[str, int]],
    mine: Sequence[str],
    weight: Mapping[str, Weight],
    spare: int | None = None,
) -> tuple[list[str], list[str]] | None:
    taken = _fits(ask, devices, (), spare)
    if taken is not None:
        return [], taken
    if _fits(ask, devices, mine, spare) is None:
        return None
    if len(mine) <= BRUTE_MAX:
        best = None
        for n in range(1, len(mine) + 1):
            for gone in itertools.combinations(mine, n):
                rank = (*_rank(gone, weight), sorted(gone))
                if (best is None or rank < best[0]) and (taken := _fits(ask, devices, gone, spare)) is not None:
                    best = (rank, list(gone), taken)
        assert best is not None
        return best[1], best[2]
    gone = []
    for k in mine:  # soonest and cheapest first until it fits, then let off the dearest not needed after all
        gone.append(k)
        if _fits(ask, devices, gone, spare) is not None:
            break
    for k in sorted(gone, key=lambda k: (-weight[k][0], -weight[k][2], -weight[k][1], k)):
        if _fits(ask, devices, [g for g in gone if g != k], spare) is not None:
            gone.remove(k)
    taken = _fits(ask, devices, gone, spare)
    assert taken is not None
    return gone, taken


class Waiter(NamedTuple):
    """A request that waits within its group's quota: ``key`` (its server), the ``group``
    whose quota it draws on, what it asks, the ``hosts`` it may go to (None: any), and how
    many devices nobody holds it must leave so (``kept``: for reservations' open windows
    and quotas not lent)."""

    key: str
    group: str
    ask: Ask
    hosts: frozenset[str] | None = None
    kept: int = 0


def in_turn(waiters: Sequence[Waiter], promised: Mapping[str, Any]) -> list[Waiter]:
    """The order in which ``waiters`` (within their quotas, in the line's order) are
    served and planned for: those for whom borrowed servers were taken back first
    (``promised``: their keys, each with when the first notice for it was given), the
    earliest promise first, so that a waiter is served when its notice ends though
    another ahead in line came within its quota since; then the rest, in line order."""
    return sorted(waiters, key=lambda w: (w.key not in promised, promised.get(w.key) or 0))


def plan_reclaims(
    waiters: Sequence[Waiter],
    hosts: Mapping[str, Mapping[str, Mapping[str, int]]],
    borrowed: Iterable[Borrowed],
) -> dict[str, Waiter]:
    """For ``waiters`` (within their quotas, in the line's order), the borrowed holdings
    to take back (key -> the waiter it is taken back for). Each waiter in turn: served
    where it fits as things would then be, else by :func:`reclaim`; the devices it would
    take are counted as taken for those after it. A waiter nothing can serve takes
    nothing back. Each uses only its own hosts and, of the devices nobody holds, those
    beyond what it must leave (:attr:`Waiter.kept`)."""
    hosts = {h: {u: dict(held) for u, held in devices.items()} for h, devices in hosts.items()}
    left = {b.key: b for b in borrowed}
    out: dict[str, Waiter] = {}
    for w in waiters:
        untouched = sum(1 for devices in hosts.values() for held in devices.values() if not held)
        allowed = hosts if w.hosts is None else {h: d for h, d in hosts.items() if h in w.hosts}
        found = reclaim(w.ask, allowed, left.values(), untouched - w.kept)
        if found is None:
            continue
        host, gone, taken = found
        for k in gone:
            out[k] = w
            del left[k]
        devices = hosts[host]
        for held in devices.values():
            for k in gone:
                held.pop(k, None)
        for u in taken:  # the waiter's, as if served
            devices[u][f"\0{w.key}"] = UNIT if w.ask.count else w.ask.milli
    return out
