"""Where a share of a GPU goes (pure; the index is read, never changed).

A share that fits on one device goes to the device with the least room that
still fits (an untouched device only when no shared one fits; which one, the
policy says); a larger one, where the model allows splitting, is split as
evenly as its quantum allows over the fewest devices of one host, again
choosing least room. Shares are milli-shares (see :mod:`gpuspawner.core.sharing`).
"""

from __future__ import annotations

import bisect

from ..core.inventory import GPU
from ..core.sharing import UNIT, ModelSharing, SharingPolicy, split_evenly
from .index import DeviceIndex
from .model import ModelIndex, kth, total_room
from .records import EVEN_SPLIT, ONE_DEVICE, UNEVEN_SPLIT, Policy
from .rooms import first_of
from .whole import Fits, first_host

__all__ = ["choose_share"]

Picks = list[tuple[GPU, int]]  # (device, milli-shares on it)


def choose_share(
    index: DeviceIndex,
    sharing: SharingPolicy,
    policy: Policy,
    models: list[str],
    share: int,
    host: str | None,
    fits: Fits = None,
) -> tuple[str, str, Picks, str] | None:
    """The best (model, host, [(device, milli), ...], rule) for a share, or None.

    Fewest devices first; then least room on the devices chosen (best
    fit), an untouched device counting a full room; among untouched
    devices the policy picks the host. Ties: hostname, then model."""
    need = -(-share // UNIT)  # fewest devices it can span
    best = None  # (key, host, picks, model)
    for model in models:
        settings = sharing.for_model(model)
        if settings is None or need > 1 and not settings.split:
            continue
        found = _best_of_model(index, policy, index.models[model], settings, share, need, host, fits)
        if found is not None and (best is None or found[0] < best[0]):
            best = (*found, model)
    if best is None:
        uneven = _uneven(index, sharing, models, share, host, fits)
        if uneven is None:
            return None
        model, h, picks = uneven
        return model, h, sorted(picks), UNEVEN_SPLIT
    _, h, picks, model = best
    return model, h, picks, ONE_DEVICE if len(picks) == 1 else EVEN_SPLIT


def _uneven(
    index: DeviceIndex, sharing: SharingPolicy, models: list[str], share: int, host: str | None, fits: Fits
) -> tuple[str, str, Picks] | None:
    """Where no even split fits and the model allows ``uneven``: the host
    with the least room in all that takes the share (ties: hostname, then
    model), its freest devices first, each taking as much as it has room for
    (in whole quanta) until the share is placed. Only hosts with partly
    booked devices can need this (n untouched devices take n GPUs evenly)."""
    best = None  # ((room, host), model, picks)
    for model in models:
        settings = sharing.for_model(model)
        if settings is None or not settings.uneven or not settings.spans(share):
            continue
        mi = index.models[model]
        totals = index.totals(mi)
        start = bisect.bisect_left(totals, (share,))
        entries = [e for e in totals[start:] if e[1] == host] if host is not None else totals[start:]
        for total, h in entries:
            if best is not None and (total, h) >= best[0]:
                break
            if fits is not None and not fits(h):
                continue
            picks = _fill(mi, h, share, settings.quantum)
            if picks is not None:
                best = (total, h), model, picks
                break
    return None if best is None else (best[1], best[0][1], best[2])


def _fill(mi: ModelIndex, host: str, share: int, quantum: int) -> Picks | None:
    """The share over the host's freest devices (lowest index first among
    equals), each piece as much as the device has room for in whole quanta."""
    picks = []
    left = share
    for room, _, gpu in sorted(_devices(mi, host), key=lambda e: (-e[0], e[1])):
        piece = min(room - room % quantum, left)
        if piece > 0:
            picks.append((gpu, piece))
            left -= piece
            if not left:
                return picks
    return None


def _best_of_model(
    index: DeviceIndex,
    policy: Policy,
    mi: ModelIndex,
    sharing: ModelSharing,
    share: int,
    need: int,
    host: str | None,
    fits: Fits = None,
) -> tuple[tuple, str, Picks] | None:
    """The best placement of one model as (key, host, picks), or None; keys compare across models."""
    most = len(mi.buckets) - 1 if sharing.spans(share) else 1
    if host is not None:
        if host in mi.total and index.is_available(host) and (fits is None or fits(host)):
            return _on_host(policy, mi, sharing, share, need, most, host)
        return None
    if need == 1:
        # One device: the shared device with least room that fits, else an
        # untouched one where the policy would put a 1-GPU request.
        if fits is None:
            tightest = mi.rooms.first(share)
        else:
            tightest = next((e for e in mi.rooms.starting(share) if fits(e[1][0])), None)
        if tightest is not None:
            room, (h, _, uuid) = tightest
            return (1, room, 0, h), h, [(index.gpus[uuid], share)]
        untouched = first_host(policy, mi, 1, fits)
        if untouched is not None:
            n, h = untouched
            return (1, UNIT, policy.rank(n), h), h, [(mi.free[h][0], share)]
        if not sharing.spans(share):
            return None  # a share of at most 1 GPU stays on one device unless split_small
        need = 2
    if fits is not None:
        # A split with CPU and memory asked for (rare): each host that has them, in turn.
        hosts = [h for h in mi.total if index.is_available(h) and fits(h)]
        found = [f for h in hosts if (f := _on_host(policy, mi, sharing, share, need, most, h)) is not None]
        return min(found, key=lambda f: f[0], default=None)
    return _split(policy, mi, sharing, share, need, most)


def _on_host(
    policy: Policy, mi: ModelIndex, sharing: ModelSharing, share: int, need: int, most: int, host: str
) -> tuple[tuple, str, Picks] | None:
    """The share on this one host, as (key, host, picks), or None."""
    fit = _fit_on_host(mi, host, share, sharing.quantum, need, most)
    if fit is None:
        return None
    n, room, picks = fit
    # Only untouched devices: models are ranked as for a whole-GPU request.
    rank = policy.rank(len(mi.free[host])) if room == n * UNIT else 0
    return (n, room, rank, host), host, picks


def _split(
    policy: Policy, mi: ModelIndex, sharing: ModelSharing, share: int, need: int, most: int
) -> tuple[tuple, str, Picks] | None:
    """Several devices of one host, the fewest that take the share: the host
    with the partly booked device of least room that takes a piece (from
    ``mi.ranks``), else among hosts with n untouched devices the one the
    policy ranks first for a whole-GPU request. On the host chosen, each
    piece goes to the device with the least room that fits it."""
    block = mi.largest_block()
    scanned = mi.ranked if mi.scan else None  # a model on few hosts: their rooms, looked at directly
    if scanned is not None:
        if share > max(block * UNIT, max(map(total_room, scanned.values()), default=0)):
            return None  # no host has that much room in all
        most = min(most, max(block, max((f + len(r) for f, r in scanned.values()), default=0)))  # devices with room
    for n in range(need, most + 1):
        pieces = split_evenly(share, n, sharing.quantum)
        if pieces is None:
            if share > n * UNIT:
                continue  # pieces too big: try more devices
            return None  # pieces below the quantum: more devices cannot help
        if scanned is not None:
            tight = _tightest_of(scanned, n, pieces) if scanned else None
        elif mi.most_kth_room(n - 1, block) < pieces[-1]:
            tight = None  # no partly booked host has n devices with room for a piece (no search)
        else:
            tight = _tightest(mi, n, pieces)
        if tight is not None:  # beats this model's untouched devices: no need to look at them
            room, h = tight
            return (n, room, 0, h), h, _best_fit(mi, h, pieces)
        untouched = first_host(policy, mi, n) if n <= block else None
        if untouched is not None:
            free, h = untouched
            return (n, UNIT, policy.rank(free), h), h, _best_fit(mi, h, pieces)
    return None


def _tightest(mi: ModelIndex, n: int, pieces: tuple[int, ...]) -> tuple[int, str] | None:
    """(room, host): the partly booked device with the least room that still
    takes the smallest piece, on a host that takes all n pieces; ties:
    hostname. On a host with n devices that fit, the least room among them
    is the n-th largest or a smaller one, so ``ranks[k]`` for k ≥ n - 1 hold
    it: one bisection per k, at most (devices per host) of them."""
    small, large = pieces[-1], pieces[0]
    extra = pieces.count(large) if large != small else 0
    ranks = mi.ranks
    many = [ranks[k] for k in range(n - 1, len(mi.buckets) - 1) if k in ranks]  # ranks[k]: only while it has entries
    if not extra:  # equal pieces: k ≥ n - 1 devices with room for one are all it takes
        return first_of(many, small)
    best = None
    for entries in many:
        for room, h in entries.starting(small):
            if best is not None and (room, h) >= best:
                break
            # k ≥ n - 1 devices have room for a smaller piece; ``extra`` need room for a larger one
            if mi.kth_room(h, extra - 1) >= large:
                best = room, h
                break
    return best


def _tightest_of(
    ranked: dict[str, tuple[int, tuple[int, ...]]], n: int, pieces: tuple[int, ...]
) -> tuple[int, str] | None:
    """What :func:`_tightest` finds, from the hosts' rooms themselves (``ranked``: a few hosts)."""
    small, large = pieces[-1], pieces[0]
    extra = pieces.count(large) if large != small else 0
    best = None
    for h, entry in ranked.items():
        if kth(entry, n - 1) >= small and (not extra or kth(entry, extra - 1) >= large):
            room = min(r for r in entry[1] if r >= small) if entry[1][0] >= small else None
            if room is not None and (best is None or (room, h) < best):
                best = room, h
    return best


def _best_fit(mi: ModelIndex, host: str, pieces: tuple[int, ...]) -> Picks:
    placed = _place(_devices(mi, host), pieces)
    assert placed is not None, "the index said the host takes the pieces"
    return placed[1]


def _devices(mi: ModelIndex, host: str) -> list[tuple[int, int, GPU]]:
    """The host's devices with room, as (room, index, device), by room then index."""
    used = mi.used
    devices = sorted([(UNIT - used[g.uuid], g.index, g) for g in mi.partial.get(host, ()) if used[g.uuid] < UNIT])
    devices += [(UNIT, g.index, g) for g in mi.free[host]]  # untouched: the most room, already by index
    return devices


def _fit_on_host(
    mi: ModelIndex, host: str, share: int, quantum: int, first: int, last: int
) -> tuple[int, int, Picks] | None:
    """The fewest devices (from ``first`` to ``last``) of the host that take
    the share split as evenly as the quantum allows, each piece on the
    device with the least room that fits it: (devices, their room, picks)."""
    devices = _devices(mi, host)
    for n in range(first, min(last, len(devices)) + 1):
        pieces = split_evenly(share, n, quantum)
        if pieces is None:
            if share > n * UNIT:
                continue  # pieces too big: try more devices
            return None  # pieces below the quantum: more devices cannot help
        placed = _place(devices, pieces)
        if placed is not None:
            return n, placed[0], placed[1]
    return None


def _place(devices: list[tuple[int, int, GPU]], pieces: tuple[int, ...]) -> tuple[int, Picks] | None:
    """Each piece (larger first) on the device with the least room that takes
    it, a device taking one piece: (the room of those chosen, picks by device
    index), or None. ``devices``: as :func:`_devices` gives them."""
    chosen = []
    total = 0
    left = list(devices)
    for piece in pieces:
        i = bisect.bisect_left(left, (piece,))  # the first device with room for it (rooms come first)
        if i == len(left):
            return None  # no device left takes this piece
        room, index, gpu = left.pop(i)
        total += room
        chosen.append((index, gpu, piece))
    chosen.sort()  # by device index: unique on a host, so devices themselves are never compared
    return total, [(gpu, piece) for _, gpu, piece in chosen]
