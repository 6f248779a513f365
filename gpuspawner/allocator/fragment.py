"""The fragmentation-aware policy, ``frag`` (pure; the index is read, never changed).

A host's *fragment*, for the mix of requests the hub sees, is the free GPU that those
requests could not use there, weighted by how often each comes (the measure of Weng et
al., ATC 2023): all of it for a request the host cannot take at all (too little CPU or
memory left, another model, no GPU asked), the devices with less room than the share
for a share, the partly booked devices for whole GPUs (all of it when too few are
untouched). To that it adds a tenth of the free GPU that the host's CPU or memory left
could not serve at the rate the mix asks for them (:data:`SHORT_WEIGHT`): the measure
above sees a host run short of CPU only once a request no longer fits there, this sees
it coming, so servers without GPUs and CPU-hungry ones go where CPU is plenty. (On a
host with GPUs of several models, each model's free GPU is set against all of the
host's CPU and memory: a little lenient there.) ``frag`` puts a request where the
fragment grows least, among the candidates ``pack`` would try first; ties go as
``pack`` goes. Without a mix it is ``pack``.

The score is looked at for a bounded number of candidates per model
(:data:`CANDIDATES` hosts, or shared devices), in ``pack``'s order, and hosts in the
same state are scored once, so the scoring costs the same on a thousand hosts as on
fifty (finding candidates with the CPU and memory asked for walks as many hosts as
pack's own search would, and more when few have them).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..core.numbers import finite
from ..core.sharing import UNIT, shown
from .index import DeviceIndex
from .links import Links
from .model import ModelIndex
from .resources import HostResources
from .whole import Fits

__all__ = [
    "CANDIDATES",
    "SHORT_WEIGHT",
    "Mix",
    "Placed",
    "Shape",
    "frag_cpu_only",
    "frag_share",
    "frag_whole",
    "fragment",
]

CANDIDATES = 6  # hosts (or shared devices) scored per model and kind, in pack's order
# How much a thousandth of free GPU that the host's CPU or memory cannot serve counts, beside
# one that no request of the mix can use. On the OpenB trace 0.1 places best: 0 leaves a third
# more GPU unallocated, 0.5 leaves the list heaviest in 8-GPU requests worse (docs/benchmarks.md).
SHORT_WEIGHT = 0.1


@dataclass(frozen=True)
class Shape:
    """One kind of request in the mix: ``count`` devices of ``milli`` thousandths each
    (a share: count 1 and milli below 1000; none: count 0), with its CPU and memory,
    the models it takes (None: any) and how often it comes."""

    count: int
    milli: int
    cpu_milli: int = 0
    memory_mib: int = 0
    models: frozenset[str] | None = None
    weight: float = 1.0


MIX_KEYS = {"gpus", "share", "cpu", "memory_mib", "models", "weight"}


@dataclass(frozen=True)
class Placed:
    """One server as placed, for :meth:`Mix.learned`: the model it got, its devices'
    thousandths, the CPU (thousandths) and memory (MiB) it reserved beside them and the
    models its request accepted (() any; the mix leaves them out, see there); None where
    not recorded. The ledger's records have these fields; a benchmark makes its own."""

    model: str
    milli: tuple[int, ...]
    cpu_milli: int | None = None
    memory_mib: int | None = None
    accepts: tuple[str, ...] | None = None


class Mix:
    """The requests a hub sees, as shapes with weights that sum to 1."""

    @classmethod
    def parse(cls, entries: object) -> Mix:
        """From the admin's list (``gpu_placement_mix``): each entry a dict with
        ``gpus`` (whole GPUs, 0 for none; default 1) or ``share`` (of one GPU, above
        0 and below 1), ``cpu`` (cores), ``memory_mib``, ``models`` (the models it
        takes; default any) and ``weight`` (how often it comes; default 1). Raises
        ValueError naming the entry and what is wrong with it."""
        if not isinstance(entries, (list, tuple)) or not entries:
            raise ValueError("gpu_placement_mix must be a non-empty list of request shapes")
        shapes = []
        for i, e in enumerate(entries):
            where = f"gpu_placement_mix[{i}]"
            if not isinstance(e, dict) or set(e) - MIX_KEYS:
                raise ValueError(f"{where} must be a dict with some of {', '.join(sorted(MIX_KEYS))}, got {shown(e)}")
            gpus, share = e.get("gpus", 1), e.get("share")
            cpu, mem, weight, models = e.get("cpu", 0), e.get("memory_mib", 0), e.get("weight", 1), e.get("models")
            if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= 64:
                raise ValueError(f"{where}: gpus must be a whole number from 0 to 64, got {shown(gpus)}")
            if share is not None and (finite(share) is None or not 0 < share < 1 or "gpus" in e):
                raise ValueError(f"{where}: share must be above 0 and below 1, without gpus, got {shown(share)}")
            if finite(cpu) is None or not 0 <= cpu <= 100_000 or finite(weight) is None or not 0 < weight <= 1e9:
                raise ValueError(
                    f"{where}: cpu must be 0 to 100000 cores and weight above 0, got {shown(cpu)}, {shown(weight)}"
                )
            if isinstance(mem, bool) or not isinstance(mem, int) or not 0 <= mem <= 2**40:
                raise ValueError(f"{where}: memory_mib must be a whole number of MiB, got {shown(mem)}")
            if models is not None and (
                not isinstance(models, (list, tuple)) or not models or not all(isinstance(m, str) for m in models)
            ):
                raise ValueError(f"{where}: models must be a non-empty list of model names, got {shown(models)}")
            milli = UNIT if share is None else max(1, round(share * UNIT))
            count = 1 if share is not None else gpus
            shapes.append(Shape(count, milli, round(cpu * 1000), mem, frozenset(models) if models else None, weight))
        return cls(shapes)

    @classmethod
    def learned(cls, placed: Iterable[Placed]) -> Mix | None:
        """From what servers held (the ledger records servers with GPUs only): one shape per
        kind, weighted by how many held it. A kind is the devices and thousandths held (a
        share split over devices counts as a share of its largest piece) and the CPU and
        memory reserved beside them (none where not recorded). None when nothing was held.

        Every kind takes any model, whichever models its requests accepted: with kinds that
        take one model, the fragment counts the free GPU of each model as lost to the kinds
        of the others, so frag fills the models that pinned requests need with requests that
        take any; on the OpenB lists with a quarter or half of the GPU requests pinned to one
        model that left more GPU unallocated than pack (CHANGELOG.md, "Performance history").
        A pinned request still goes only to its models: the allocator sees to that, not the
        mix."""
        counts: Counter[Shape] = Counter()
        for p in placed:
            if not p.milli:
                continue
            count, milli = (len(p.milli), UNIT) if all(m >= UNIT for m in p.milli) else (1, max(p.milli))
            counts[Shape(count, milli, p.cpu_milli or 0, p.memory_mib or 0)] += 1
        if not counts:
            return None
        return cls(Shape(s.count, s.milli, s.cpu_milli, s.memory_mib, s.models, n) for s, n in counts.items())

    def __init__(self, shapes: Iterable[Shape]):
        shapes = [s for s in shapes if s.weight > 0]
        total = sum(s.weight for s in shapes)
        if not shapes or not math.isfinite(total):
            raise ValueError("a mix needs at least one shape with a positive, finite weight")
        self.shapes = tuple(
            Shape(s.count, s.milli, s.cpu_milli, s.memory_mib, s.models, s.weight / total) for s in shapes
        )
        # A request without GPUs leaves all free GPU unused wherever it goes: the same for
        # every candidate, so only its weight is kept.
        self.no_gpu = sum(s.weight for s in self.shapes if s.count == 0)
        # The shapes with GPUs, as (weight, count, milli, cpu, memory, models): read per host scored.
        self.rows = tuple(
            (s.weight, s.count, s.milli, s.cpu_milli, s.memory_mib, s.models) for s in self.shapes if s.count
        )
        # CPU and memory the mix asks for per thousandth of GPU (0: it does not say).
        asked = sum(s.weight * s.count * s.milli for s in self.shapes)
        self.cpu_per_milli = sum(s.weight * s.cpu_milli for s in self.shapes) / asked if asked else 0.0
        self.mem_per_milli = sum(s.weight * s.memory_mib for s in self.shapes) / asked if asked else 0.0
        # (model, rooms, cpu, memory) -> fragment: hosts of one kind in one state are many
        self.known: dict[tuple, float] = {}


KNOWN_MOST = 50_000  # fragments remembered per mix (a few MB), then forgotten all at once


def fragment(mix: Mix, model: str, rooms: list[int], cpu: float, mem: float) -> float:
    """The host's fragment for ``mix`` (thousandths of a GPU): ``rooms`` are its free
    thousandths per device of ``model``, in ascending order; ``cpu`` and ``mem`` what it
    has left (math.inf: not known)."""
    key = (model, tuple(rooms), cpu, mem)
    found = mix.known.get(key)
    if found is None:
        if len(mix.known) >= KNOWN_MOST:
            mix.known.clear()
        found = mix.known[key] = _fragment(mix, model, rooms, cpu, mem)
    return found


def _fragment(mix: Mix, model: str, rooms: list[int], cpu: float, mem: float) -> float:
    if not rooms:
        return 0.0
    total = sum(rooms)
    if not total:
        return 0.0
    n = len(rooms)
    whole = n - bisect.bisect_left(rooms, UNIT)
    below = list(itertools.accumulate(rooms, initial=0))  # below[i]: the room of the i smallest
    frag = mix.no_gpu * total
    for weight, count, milli, s_cpu, s_mem, models in mix.rows:
        if s_cpu > cpu or s_mem > mem or (models is not None and model not in models):
            frag += weight * total
        elif milli < UNIT:  # a share: devices with less room are of no use to it
            i = bisect.bisect_left(rooms, milli)
            frag += weight * (total if i == n else below[i])
        else:
            frag += weight * (total if whole < count else total - whole * UNIT)
    short = 0.0  # free GPU without the CPU or memory to serve it
    if mix.cpu_per_milli and cpu != math.inf:
        short = total - cpu / mix.cpu_per_milli
    if mix.mem_per_milli and mem != math.inf:
        short = max(short, total - mem / mix.mem_per_milli)
    return frag + SHORT_WEIGHT * min(total, max(0.0, short))  # (a host over-booked by others: all of it)


class _Scorer:
    """How much one model's hosts' fragments grow with a booking; hosts in the same
    state (rooms, CPU and memory left) are scored once."""

    def __init__(self, mix: Mix, resources: HostResources, model: str, mi: ModelIndex, asked: tuple[int, int]):
        self.mix, self.resources, self.model, self.mi, self.asked = mix, resources, model, mi, asked
        self.seen: dict[tuple, float] = {}

    def growth(self, host: str, room: int, milli: int, count: int = 1) -> float:
        """``count`` devices of ``room`` free thousandths each get ``milli`` more booked."""
        mi = self.mi
        rooms = sorted(UNIT - mi.used[g.uuid] for g in mi.partial.get(host, ())) + [UNIT] * len(mi.free.get(host, ()))
        free = self.resources.free(host)
        cpu, mem = (math.inf, math.inf) if free is None else free
        key = (tuple(rooms), cpu, mem, room, milli, count)
        found = self.seen.get(key)
        if found is None:
            after = list(rooms)
            i = bisect.bisect_left(after, room)
            for j in range(i, i + count):
                after[j] -= milli
            after.sort()
            before = fragment(self.mix, self.model, rooms, cpu, mem)
            found = fragment(self.mix, self.model, after, cpu - self.asked[0], mem - self.asked[1]) - before
            self.seen[key] = found = round(found, 6)
        return found


def _whole_hosts(mi: ModelIndex, count: int, fits: Fits) -> Iterator[tuple[int, str]]:
    """(free count, host) for up to CANDIDATES hosts with ``count`` untouched devices, in pack's order."""
    found = 0
    for n in range(count, len(mi.buckets)):
        for h in mi.buckets[n]:
            if fits is None or fits(h):
                yield n, h
                found += 1
                if found == CANDIDATES:
                    return


class _Scores:
    """One decision's scorers, by model; what a booking costs the host's other models
    (its CPU and memory are theirs too) counts with it."""

    def __init__(self, index: DeviceIndex, mix: Mix, resources: HostResources, asked: tuple[int, int]):
        self.index, self.mix, self.resources, self.asked = index, mix, resources, asked
        self.scorers: dict[str, _Scorer] = {}

    def of(self, model: str) -> _Scorer:
        scorer = self.scorers.get(model)
        if scorer is None:
            scorer = self.scorers[model] = _Scorer(
                self.mix, self.resources, model, self.index.models[model], self.asked
            )
        return scorer

    def growth(self, host: str, model: str | None, room: int = UNIT, milli: int = 0, count: int = 0) -> float:
        """The host's fragment growth, over all its models, when ``count`` devices of
        ``model`` with ``room`` get ``milli`` more and the request's CPU and memory are taken."""
        total = 0.0
        for m in sorted({g.model for g in self.index.by_host.get(host, ())}):
            total += self.of(m).growth(host, room, milli, count) if m == model else self.of(m).growth(host, UNIT, 0, 0)
        return round(total, 6)


def frag_whole(
    index: DeviceIndex,
    mix: Mix,
    resources: HostResources,
    models: list[str],
    count: int,
    asked: tuple[int, int],
    fits: Fits,
    linked: Links | None = None,
) -> tuple[str, str] | None:
    """(model, host) for ``count`` whole devices where the fragment grows least (ties:
    with ``linked``, the best linked group; then as pack); with ``linked``, only on
    hosts that give a set linked as required."""
    scores = _Scores(index, mix, resources, asked)
    best = None  # (growth, free count, how badly linked, host, model)
    ranks = linked is not None and linked.ranks(count)
    for model in models:
        mi = index.models[model]
        usable = fits if linked is None else linked.fits(model, mi.free, count, fits)
        for n, h in _whole_hosts(mi, count, usable):
            links = linked.rank(model, h, mi.free[h], count) if linked is not None and ranks else (0, 0)
            entry = (scores.growth(h, model, UNIT, UNIT, count), n, (-links[0], -links[1]), h, model)
            if best is None or entry < best:
                best = entry
    return None if best is None else (best[4], best[3])


def frag_share(
    index: DeviceIndex,
    mix: Mix,
    resources: HostResources,
    models: list[str],
    share: int,
    asked: tuple[int, int],
    fits: Fits,
) -> tuple[str, str, str] | None:
    """(model, host, uuid) for a share of one device where the fragment grows least:
    among the shared devices with the least room that takes it, and the untouched
    devices of the hosts pack would give one GPU. Ties as pack: least room, then (for
    untouched devices) fewest free on the host, then host, model, device index."""
    scores = _Scores(index, mix, resources, asked)
    best = None  # (growth, room, free count or 0, host, model, index, uuid)
    for model in models:
        mi = index.models[model]
        shared = ((room, 0, h, i, uuid) for room, (h, i, uuid) in mi.rooms.starting(share) if fits is None or fits(h))
        untouched = ((UNIT, n, h, mi.free[h][0].index, mi.free[h][0].uuid) for n, h in _whole_hosts(mi, 1, fits))
        for room, n, h, i, uuid in itertools.chain(itertools.islice(shared, CANDIDATES), untouched):
            entry = (scores.growth(h, model, room, share, 1), room, n, h, model, i, uuid)
            if best is None or entry < best:
                best = entry
    return None if best is None else (best[4], best[3], best[6])


def frag_cpu_only(
    index: DeviceIndex, mix: Mix, resources: HostResources, hosts: Iterator[str], asked: tuple[int, int]
) -> str | None:
    """Of the first CANDIDATES ``hosts`` (in the order servers without GPUs go), the one
    whose fragment grows least from the CPU and memory a server without GPUs takes."""
    scores = _Scores(index, mix, resources, asked)
    best = None  # (growth, position, host)
    for k, h in enumerate(itertools.islice(hosts, CANDIDATES)):
        entry = (scores.growth(h, None), k, h)
        if best is None or entry < best:
            best = entry
    return None if best is None else best[2]
