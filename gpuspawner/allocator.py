"""Who holds which GPU: the one owner of that answer, in pure Python.

Requests go in, an :class:`Allocation` or an :class:`AllocationRefused` with a
reason a user can act on comes out. Nothing here talks to Docker or JupyterHub,
so every decision is testable (and benchmarked) without I/O.

Rules:

* all devices of one request come from ONE host, and all are of one model;
* a device is held by at most one holder;
* hosts that are not available (down, drained, paused) are never chosen;
* the policy picks the host; ties are broken by hostname, then by model name,
  and devices on a host are taken lowest index first, so a decision depends
  only on the state, never on dict order or timing.

For speed, free devices are indexed per model in buckets by how many a host
has free, so a decision scans at most (devices per host) buckets, not every host.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from .inventory import GPU

__all__ = [
    "ALL",
    "POLICIES",
    "Allocation",
    "AllocationRefused",
    "Allocator",
    "ModelSummary",
    "Request",
]

#: ``Request.count`` value asking for every device of a host (of the model, if given).
ALL = "all"


@dataclass(frozen=True)
class Request:
    model: str | None = None  # None: any model
    count: int | str = 1  # 1..N, or ALL
    host: str | None = None  # pin to this host
    owner: str = ""  # the user; per-owner limits count across their servers


@dataclass(frozen=True)
class Allocation:
    holder: str
    owner: str
    host: str
    devices: tuple[GPU, ...]

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)

    @property
    def model(self) -> str:
        return ", ".join(sorted({d.model for d in self.devices}))


class AllocationRefused(Exception):
    """No allocation. ``retry`` says whether the same request may succeed later
    (capacity: HTTP 503) or never can as asked (HTTP 400)."""

    def __init__(self, message: str, *, retry: bool):
        super().__init__(message)
        self.message = message
        self.retry = retry

    @property
    def status(self) -> int:
        return 503 if self.retry else 400


@dataclass(frozen=True)
class Policy:
    """How to pick a host: the order in which to try 'hosts with n free'
    buckets, and the key that ranks candidates of different models."""

    name: str
    sizes: Callable[[int, int], Iterable[int]]  # (count, largest bucket) -> bucket sizes to try
    rank: Callable[[int], int]  # free count -> sort key (lower wins)


POLICIES: dict[str, Policy] = {
    # The host with the least free room that still fits: keeps whole hosts free
    # for large requests.
    "pack": Policy("pack", lambda count, top: range(count, top + 1), lambda n: n),
    # The host with the most free room: spreads load (and heat) across hosts.
    "spread": Policy("spread", lambda count, top: range(top, count - 1, -1), lambda n: -n),
}


@dataclass(frozen=True)
class ModelSummary:
    model: str
    memory_mib: int
    total: int  # devices in the inventory
    free: int  # free on available hosts
    largest_block: int  # most free on any single available host
    unavailable: int  # devices on hosts that are down, drained or paused


@dataclass
class _ModelIndex:
    """Per model: each host's free devices, hosts bucketed by free count (only
    available hosts), and the counts a summary needs, all kept up to date."""

    free: dict[str, list[GPU]] = field(default_factory=dict)  # host -> free, by index
    total: dict[str, int] = field(default_factory=dict)  # host -> devices
    buckets: list[list[str]] = field(default_factory=lambda: [[]])  # n -> sorted hosts
    memory_mib: int = 0
    devices: int = 0
    smallest_host: int = 0  # fewest devices of this model on one host
    free_available: int = 0  # free devices on available hosts
    unavailable: int = 0  # devices on unavailable hosts

    @property
    def biggest_host(self) -> int:  # most devices of this model on one host
        return len(self.buckets) - 1

    def largest_block(self) -> int:
        for n in range(len(self.buckets) - 1, 0, -1):
            if self.buckets[n]:
                return n
        return 0


class Allocator:
    def __init__(self, gpus: Iterable[GPU] = (), policy: str = "pack"):
        if policy not in POLICIES:
            raise ValueError(
                f"unknown allocation policy {policy!r}; choose one of: {', '.join(POLICIES)}"
            )
        self.policy = POLICIES[policy]
        self._lock = threading.RLock()
        self._gpus: dict[str, GPU] = {}
        self._available: set[str] | None = None  # None: every inventory host
        self._holders: dict[str, Allocation] = {}
        self._held: dict[str, str] = {}  # uuid -> holder
        self._owned: dict[str, int] = {}  # owner -> devices held, kept for O(1) limit checks
        self._index: dict[str, _ModelIndex] = {}  # by model name
        self._hosts: list[str] = []  # sorted
        self.set_inventory(gpus)

    # -- state changes from outside --------------------------------------

    def set_inventory(self, gpus: Iterable[GPU]) -> None:
        """Replace the inventory. Holdings are kept, also of devices that left it."""
        with self._lock:
            self._gpus = {g.uuid: g for g in gpus}
            self._reindex()

    def set_available_hosts(self, hosts: Iterable[str] | None) -> None:
        """Only these hosts may be chosen (None: all). Only the hosts whose
        availability changed are touched."""
        new = None if hosts is None else set(hosts)
        with self._lock:
            if new == self._available:
                return
            before = {h: self._is_available(h) for h in self._hosts}
            self._available = new
            for host, was in before.items():
                if self._is_available(host) != was:
                    self._set_host_available(host, not was)

    def _set_host_available(self, host: str, available: bool) -> None:
        sign = 1 if available else -1
        for mi in self._index.values():
            if host not in mi.total:
                continue
            n = len(mi.free[host])
            if available:
                bisect.insort(mi.buckets[n], host)
            else:
                bucket = mi.buckets[n]
                del bucket[bisect.bisect_left(bucket, host)]
            mi.free_available += sign * n
            mi.unavailable -= sign * mi.total[host]

    def _reindex(self) -> None:
        index: dict[str, _ModelIndex] = {}
        for gpu in sorted(self._gpus.values()):
            mi = index.setdefault(gpu.model, _ModelIndex())
            mi.total[gpu.host] = mi.total.get(gpu.host, 0) + 1
            mi.memory_mib = max(mi.memory_mib, gpu.memory_mib)
            mi.devices += 1
            free = mi.free.setdefault(gpu.host, [])
            if gpu.uuid not in self._held:
                free.append(gpu)
        for mi in index.values():
            mi.buckets = [[] for _ in range(max(mi.total.values()) + 1)]
            mi.smallest_host = min(mi.total.values())
            for host in sorted(mi.free):
                if self._is_available(host):
                    mi.buckets[len(mi.free[host])].append(host)
                    mi.free_available += len(mi.free[host])
                else:
                    mi.unavailable += mi.total[host]
        self._index = dict(sorted(index.items()))
        self._hosts = sorted({g.host for g in self._gpus.values()})

    def _is_available(self, host: str) -> bool:
        return self._available is None or host in self._available

    # -- decisions ---------------------------------------------------------

    def allocate(
        self, holder: str, request: Request, max_per_owner: int | None = None, policy: str | None = None
    ) -> Allocation:
        """Reserve devices for ``holder`` or raise :class:`AllocationRefused`.
        ``policy`` overrides the allocator's own for this request."""
        with self._lock:
            if holder in self._holders:
                raise ValueError(f"{holder} already holds an allocation; release it first")
            count = request.count
            if count != ALL and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
                raise AllocationRefused(f"GPU count must be a whole number ≥ 1 or {ALL!r}, got {count!r}", retry=False)
            if request.model is not None and request.model not in self._index:
                raise AllocationRefused(
                    f"Unknown GPU model {request.model!r}; choose one of: {', '.join(self._index)}",
                    retry=False,
                )
            room = None  # how many more the owner may hold
            if max_per_owner is not None:
                held = self.held_by_owner(request.owner)
                room = max_per_owner - held
                if count != ALL and count > max_per_owner:
                    raise AllocationRefused(
                        f"{count} GPUs requested, but the limit is {max_per_owner} per user", retry=False
                    )
            models = [request.model] if request.model is not None else list(self._index)
            over_room = room is not None and count != ALL and count > room
            pol = self.policy if policy is None else POLICIES[policy]
            found = None if over_room else self._choose(pol, models, count, request.host, room)
            if found is None:
                raise self._refusal(request, max_per_owner, room)
            model, host = found
            mi = self._index[model]
            free = mi.free[host]
            n_before = len(free)
            take = n_before if count == ALL else count
            devices = tuple(free[:take])
            del free[:take]
            self._move(mi, host, n_before, len(free))
            alloc = Allocation(holder=holder, owner=request.owner, host=host, devices=devices)
            self._record(alloc)
            return alloc

    def _choose(self, policy: Policy, models: list[str], count: int | str, host: str | None, room: int | None):
        """The best (model, host) for the request, or None. Ties: hostname, then model."""
        rank = policy.rank
        best = None  # (rank, host, model)
        for model in models:
            mi = self._index[model]
            for n, h in self._candidates(policy, mi, count, host, room):
                key = (rank(n), h, model)
                if best is None or key < best:
                    best = key
                break  # candidates come best first within a model
        return None if best is None else (best[2], best[1])

    def _candidates(
        self, policy: Policy, mi: _ModelIndex, count: int | str, host: str | None, room: int | None
    ) -> Iterator[tuple[int, str]]:
        if host is not None:
            if host in mi.free and self._is_available(host):
                n = len(mi.free[host])
                fits = n == mi.total[host] and (room is None or n <= room) if count == ALL else n >= count
                if fits and n > 0:
                    yield n, host
            return
        if count == ALL:
            # Rare request: a plain scan of the hosts whose devices are all free.
            whole = sorted(
                (policy.rank(n), h)
                for h, n in mi.total.items()
                if self._is_available(h) and len(mi.free[h]) == n and (room is None or n <= room)
            )
            for _, h in whole:
                yield mi.total[h], h
            return
        top = len(mi.buckets) - 1
        for n in policy.sizes(count, top):
            bucket = mi.buckets[n]
            if bucket:
                yield n, bucket[0]

    def _record(self, alloc: Allocation) -> None:
        self._holders[alloc.holder] = alloc
        if alloc.devices:
            self._owned[alloc.owner] = self._owned.get(alloc.owner, 0) + len(alloc.devices)
        for d in alloc.devices:
            self._held[d.uuid] = alloc.holder

    def _move(self, mi: _ModelIndex, host: str, old: int, new: int) -> None:
        """The host's free count of this model went from old to new."""
        if old == new or not self._is_available(host):
            return
        mi.free_available += new - old
        bucket = mi.buckets[old]
        del bucket[bisect.bisect_left(bucket, host)]
        bisect.insort(mi.buckets[new], host)

    def release(self, holder: str) -> Allocation | None:
        """Give back what ``holder`` holds. Idempotent: None when it holds nothing."""
        with self._lock:
            alloc = self._holders.pop(holder, None)
            if alloc is None:
                return None
            left = self._owned.get(alloc.owner, 0) - len(alloc.devices)
            if left > 0:
                self._owned[alloc.owner] = left
            else:
                self._owned.pop(alloc.owner, None)
            for d in alloc.devices:
                if self._held.get(d.uuid) != holder:
                    continue
                del self._held[d.uuid]
                current = self._gpus.get(d.uuid)
                if current is None:  # device left the inventory while held
                    continue
                mi = self._index[current.model]
                free = mi.free[current.host]
                bisect.insort(free, current)
                self._move(mi, current.host, len(free) - 1, len(free))
            return alloc

    def adopt(self, holder: str, owner: str, host: str, uuids: Iterable[str]) -> tuple[Allocation, list[str]]:
        """Record a holding found in the cluster (e.g. after a hub restart).

        Returns the allocation and the problems found: UUIDs the inventory does
        not know, or that another holder already has (a double booking)."""
        with self._lock:
            problems = []
            devices = []
            for uuid in uuids:
                gpu = self._gpus.get(uuid)
                other = self._held.get(uuid)
                if gpu is not None and gpu in devices:
                    problems.append(f"{uuid} is listed twice")
                elif gpu is None:
                    problems.append(f"{uuid} is not in the inventory")
                elif other is not None and other != holder:
                    problems.append(f"{uuid} is also held by {other}")
                elif gpu.host != host:
                    problems.append(f"{uuid} is on {gpu.host}, not on {host}")
                else:
                    devices.append(gpu)
            old = self._holders.get(holder)
            if old is not None and set(old.devices) == set(devices):
                return old, problems
            self.release(holder)
            alloc = Allocation(holder=holder, owner=owner, host=host, devices=tuple(devices))
            self._record(alloc)
            for gpu in devices:  # out of the free lists, as allocate() would
                mi = self._index[gpu.model]
                free = mi.free[gpu.host]
                del free[bisect.bisect_left(free, gpu)]
                self._move(mi, gpu.host, len(free) + 1, len(free))
            return alloc, problems

    # -- views ---------------------------------------------------------------

    def holdings(self) -> dict[str, Allocation]:
        with self._lock:
            return dict(self._holders)

    def holding(self, holder: str) -> Allocation | None:
        return self._holders.get(holder)

    def holder_of(self, uuid: str) -> str | None:
        return self._held.get(uuid)

    def held_by_owner(self, owner: str) -> int:
        return self._owned.get(owner, 0)

    def summary(self) -> list[ModelSummary]:
        """Per model, by name: free and total counts, largest block on one host."""
        with self._lock:
            return [
                ModelSummary(
                    model=model,
                    memory_mib=mi.memory_mib,
                    total=mi.devices,
                    free=mi.free_available,
                    largest_block=mi.largest_block(),
                    unavailable=mi.unavailable,
                )
                for model, mi in self._index.items()
            ]

    def hosts(self) -> list[str]:
        return list(self._hosts)

    # -- refusals ------------------------------------------------------------

    def _refusal(self, request: Request, limit: int | None, room: int | None) -> AllocationRefused:
        """Why nothing fits, in words a user can act on. Requests that can never
        fit as asked (retry=False) are told apart from those that wait for capacity.
        ``limit``: the per-owner maximum; ``room``: what of it the owner has left."""
        summaries = {s.model: s for s in self.summary()}
        host, count = request.host, request.count
        what = request.model or "GPU"
        asked = "All GPUs of one host" if count == ALL else f"{count} × {what}"
        relevant = [request.model] if request.model else list(summaries)
        if host is not None:
            if host not in self._hosts:
                return AllocationRefused(
                    f"{host} is not a GPU host; choose one of: {', '.join(self._hosts)}", retry=False
                )
            has = max((self._index[m].total.get(host, 0) for m in relevant), default=0)
            if has == 0 or (count != ALL and count > has):
                return AllocationRefused(f"{asked} requested on {host}, which has {has} of that model", retry=False)
            if count == ALL and limit is not None and has > room:
                return self._over_limit(f"All {has} GPUs of {host} requested", has, limit, room)
            if not self._is_available(host):
                return AllocationRefused(
                    f"{host} is not available right now (it is down, drained or paused)", retry=True
                )
        biggest_host = max(self._index[m].biggest_host for m in relevant)
        if count != ALL and count > biggest_host:
            return AllocationRefused(
                f"{asked} requested, but no host has more than {biggest_host}"
                f"{'' if request.model else ' of one model'}",
                retry=False,
            )
        if count != ALL and limit is not None and count > room:
            return self._over_limit(f"{count} GPU(s) requested", count, limit, room)
        if count == ALL and limit is not None:
            smallest = min(self._index[m].smallest_host for m in relevant)
            if smallest > room:
                return self._over_limit(f"{asked} requested (at least {smallest})", smallest, limit, room)
        free = sum(summaries[m].free for m in relevant)
        total = sum(summaries[m].total for m in relevant)
        if free == 0:
            others = [f"{s.model}: {s.free} free" for s in summaries.values() if s.free and s.model != request.model]
            tail = "; ".join(others) if others else "no other GPU model is free either"
            return AllocationRefused(f"No {what} is free right now (0 of {total} free); {tail}", retry=True)
        if host is not None:
            there = sum(len(self._index[m].free.get(host, ())) for m in relevant)
            return AllocationRefused(f"{asked} requested on {host}, {there} free there", retry=True)
        if count == ALL:
            return AllocationRefused(f"{asked} requested ({what}), but every host has some in use right now", retry=True)
        block = max(summaries[m].largest_block for m in relevant)
        return AllocationRefused(
            f"{asked} requested, at most {block} free on any single host ({free} free in total)",
            retry=True,
        )

    @staticmethod
    def _over_limit(asked: str, need: int, limit: int, room: int) -> AllocationRefused:
        """A whole host's GPUs would exceed the per-owner limit: never, or not
        until the owner's other servers stop."""
        if need > limit:
            return AllocationRefused(f"{asked}, but the limit is {limit} per user", retry=False)
        return AllocationRefused(
            f"{asked}, but the limit is {limit} per user and you already hold {limit - room} on other servers",
            retry=True,
        )
