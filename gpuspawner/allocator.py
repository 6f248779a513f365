"""Who holds which GPU: the one owner of that answer, in pure Python.

Requests go in, an :class:`Allocation` or an :class:`AllocationRefused` with a
reason a user can act on comes out. Nothing here talks to Docker or JupyterHub,
so every decision is testable (and benchmarked) without I/O.

Rules:

* all devices of one request come from ONE host, and all are of one model;
* a device is held whole by at most one holder, or shared: the shares booked
  on it never sum above 1, and a device held whole is never shared;
* whole-GPU requests take only untouched devices (neither held nor shared);
* hosts that are not available (down, drained, paused) are never chosen;
* the policy picks the host; ties are broken by hostname, then by model name,
  and devices on a host are taken lowest index first, so a decision depends
  only on the state, never on dict order or timing.

Shares (``Request.share``, see :mod:`gpuspawner.sharing` and docs/sharing.md)
follow the admin's :class:`~gpuspawner.sharing.SharingPolicy`: a share that
fits on one device goes to the device with the least room that still fits (an
untouched device only when no shared one fits; which one, the policy says); a
larger one, where the model allows splitting, is split as evenly as its quantum
allows over the fewest devices of one host, again choosing least room. Shares
are exact integers of thousandths inside, so sums never drift.

For speed, untouched devices are indexed per model in buckets by how many a
host has free, so a decision scans at most (devices per host) buckets, not
every host; devices with shares and room left are kept sorted by room.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .inventory import GPU
from .sharing import OFF, UNIT, ModelSharing, SharingPolicy, fmt, fraction, split_evenly, to_milli

__all__ = [
    "ALL",
    "POLICIES",
    "Allocation",
    "AllocationRefused",
    "Allocator",
    "DeviceUse",
    "HostUse",
    "ModelSummary",
    "Request",
    "Sharer",
]

#: ``Request.count`` value asking for every device of a host (of the model, if given).
ALL = "all"


@dataclass(frozen=True)
class Request:
    model: str | None = None  # None: any model
    count: int | str = 1  # 1..N, or ALL; ignored when share is given
    host: str | None = None  # pin to this host
    owner: str = ""  # the user; per-owner limits count across their servers
    share: Any = None  # a share of a GPU (Fraction, Decimal, int or float: 0.25, 1.2); None: whole GPUs


@dataclass(frozen=True)
class Allocation:
    holder: str
    owner: str
    host: str
    devices: tuple[GPU, ...]
    # The share of each device in thousandths, aligned with ``devices``;
    # None when every device is held whole (also a share that came out as
    # whole devices, e.g. 2 split as 1 + 1).
    milli: tuple[int, ...] | None = None

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)

    @property
    def model(self) -> str:
        return ", ".join(sorted({d.model for d in self.devices}))

    @property
    def shared(self) -> bool:
        return self.milli is not None

    @property
    def shares(self) -> tuple[Fraction, ...]:
        """Per device, aligned with ``devices``: 1 when held whole."""
        if self.milli is None:
            return (Fraction(1),) * len(self.devices)
        return tuple(fraction(m) for m in self.milli)

    def booking(self) -> dict[GPU, int]:
        """Device -> milli-shares held (1000: whole), whatever the order."""
        return dict(zip(self.devices, self.milli or (UNIT,) * len(self.devices)))

    @property
    def total_milli(self) -> int:
        return len(self.devices) * UNIT if self.milli is None else sum(self.milli)


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
    free: int  # untouched (neither held nor shared) on available hosts
    largest_block: int  # most untouched on any single available host
    unavailable: int  # devices on hosts that are down, drained or paused
    # Sharing, for the form: whether users may ask for a share of this model,
    # which shares, and the most one device has free right now.
    shareable: bool = False
    quantum: Fraction | None = None  # shares are multiples of this
    shares: tuple[Fraction, ...] | None = None  # the only shares offered; None: any multiple of quantum
    split: bool = False  # may a share span several devices of one host
    largest_share: Fraction = Fraction(0)  # most room on one device of an available host (1: one is untouched)


@dataclass(frozen=True)
class Sharer:
    holder: str
    owner: str
    share: Fraction  # 1 when held whole


@dataclass(frozen=True)
class DeviceUse:
    """One inventory device in the allocation map."""

    uuid: str
    host: str
    index: int
    model: str
    memory_mib: int
    available: bool  # its host may be chosen now
    allocated: Fraction  # sum of its holders' shares: 0 free, 1 full (or held whole)
    whole: bool  # held whole by one holder
    holders: tuple[Sharer, ...]  # by holder name


@dataclass(frozen=True)
class HostUse:
    """Counts for one model on one host (the alloc map's rows, the metrics' labels)."""

    model: str
    host: str
    available: bool
    total: int  # devices
    free: int  # untouched
    whole: int  # held whole
    shared: int  # holding shares (also when full)
    allocated: Fraction  # shares booked, whole devices counting 1 each


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
    # Devices holding shares ("partial"): what is booked on each, by host, and
    # those with room left on available hosts sorted by (room, host, index).
    used: dict[str, int] = field(default_factory=dict)  # uuid -> milli booked
    partial: dict[str, list[GPU]] = field(default_factory=dict)  # host -> by index
    partial_room: dict[str, int] = field(default_factory=dict)  # host -> room left on its partial devices
    rooms: list[tuple[int, str, int, str]] = field(default_factory=list)
    # For updates one host at a time: how many hosts have n devices of this
    # model (n -> hosts), and how many devices have each memory size.
    sizes: dict[int, int] = field(default_factory=dict)
    memories: dict[int, int] = field(default_factory=dict)

    @property
    def biggest_host(self) -> int:  # most devices of this model on one host
        return len(self.buckets) - 1

    def largest_block(self) -> int:
        for n in range(len(self.buckets) - 1, 0, -1):
            if self.buckets[n]:
                return n
        return 0

    def largest_room(self) -> int:  # most milli-shares free on one device of an available host
        if self.free_available:
            return UNIT
        return self.rooms[-1][0] if self.rooms else 0


class Allocator:
    def __init__(self, gpus: Iterable[GPU] = (), policy: str = "pack", sharing: SharingPolicy | dict | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown allocation policy {policy!r}; choose one of: {', '.join(POLICIES)}")
        self.policy = POLICIES[policy]
        self.sharing = OFF
        self._lock = threading.RLock()
        self._gpus: dict[str, GPU] = {}
        self._available: set[str] | None = None  # None: every inventory host
        self._holders: dict[str, Allocation] = {}
        self._held: dict[str, str] = {}  # uuid -> holder, for devices held whole
        self._shares: dict[str, dict[str, int]] = {}  # uuid -> {holder: milli}, for shared devices
        self._owned: dict[str, int] = {}  # owner -> milli-shares held (whole = 1000), for O(1) limit checks
        self._index: dict[str, _ModelIndex] = {}  # by model name
        self._hosts: list[str] = []  # sorted
        self._by_host: dict[str, list[GPU]] = {}  # host -> its inventory devices, sorted
        self._versions: dict[str, int] = {}  # host -> changes to the holdings on it
        self.set_sharing(sharing)
        self.set_inventory(gpus)

    def set_sharing(self, sharing: SharingPolicy | dict | None) -> None:
        """Which models may be shared, and how (see :class:`SharingPolicy`);
        None: whole GPUs only. Holdings are kept; new requests follow it.
        Raises ValueError naming a bad entry."""
        policy = SharingPolicy.parse(sharing)
        with self._lock:
            self.sharing = policy

    # -- state changes from outside --------------------------------------

    def set_inventory(self, gpus: Iterable[GPU]) -> None:
        """Replace the inventory. Holdings are kept, also of devices that left it."""
        with self._lock:
            self._gpus = {g.uuid: g for g in gpus}
            self._reindex()

    def set_host_devices(self, host: str, gpus: Iterable[GPU]) -> bool:
        """Replace one host's devices (none: the host leaves the inventory),
        touching only that host's entries in the index. The state is the same
        as after :meth:`set_inventory` with the whole new inventory: holdings
        are kept, also of devices that left, and a device that comes back is
        still held. A UUID the inventory has on another host moves to this one.
        True when the host's devices changed. Raises ValueError for a device
        of another host."""
        new = sorted({g.uuid: g for g in gpus}.values())
        for gpu in new:
            if gpu.host != host:
                raise ValueError(f"{gpu.uuid} is on {gpu.host}, not on {host}")
        with self._lock:
            if new == self._by_host.get(host, []):
                return False
            touched: set[str] = set()
            uuids = {g.uuid for g in new}
            others = {self._gpus[u].host for u in uuids if u in self._gpus} - {host}
            for other in sorted(others):  # devices that moved here leave their old host first
                touched |= self._replace_host(other, [g for g in self._by_host[other] if g.uuid not in uuids])
            touched |= self._replace_host(host, new)
            self._finish_models(touched)
            return True

    def _replace_host(self, host: str, gpus: list[GPU]) -> set[str]:
        """Take the host's devices out of the index and put ``gpus`` (sorted) in;
        the models touched, for :meth:`_finish_models`."""
        old = self._by_host.pop(host, [])
        touched = self._unindex_host(host, old)
        for gpu in old:
            del self._gpus[gpu.uuid]
        if not gpus:
            del self._hosts[bisect.bisect_left(self._hosts, host)]
            return touched
        if not old:
            bisect.insort(self._hosts, host)
        self._by_host[host] = gpus
        for gpu in gpus:
            self._gpus[gpu.uuid] = gpu
        return touched | self._index_host(host, gpus)

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
            for gpu in mi.partial.get(host, ()):
                room = UNIT - mi.used[gpu.uuid]
                if room:
                    entry = (room, host, gpu.index, gpu.uuid)
                    if available:
                        bisect.insort(mi.rooms, entry)
                    else:
                        del mi.rooms[bisect.bisect_left(mi.rooms, entry)]

    def _reindex(self) -> None:
        self._index = {}
        self._by_host = {}
        for gpu in sorted(self._gpus.values()):
            devices = self._by_host.get(gpu.host)
            if devices is None:  # not setdefault: that would build a list per device
                devices = self._by_host[gpu.host] = []
            devices.append(gpu)
        for host, devices in self._by_host.items():  # by hostname: the buckets are filled in order
            self._index_host(host, devices)
        self._finish_models(set(self._index))
        self._hosts = list(self._by_host)

    def _index_host(self, host: str, gpus: list[GPU]) -> set[str]:
        """Put a host's devices (sorted, in ``_gpus``) into the index; the models touched."""
        available = self._is_available(host)
        by_model: dict[str, list[GPU]] = {}
        for gpu in gpus:
            devices = by_model.get(gpu.model)
            if devices is None:
                devices = by_model[gpu.model] = []
            devices.append(gpu)
        for model, devices in by_model.items():
            mi = self._index.get(model)
            if mi is None:
                mi = self._index[model] = _ModelIndex()
            n = len(devices)
            mi.total[host] = n
            mi.sizes[n] = mi.sizes.get(n, 0) + 1
            mi.devices += n
            free = []
            for gpu in devices:
                mi.memories[gpu.memory_mib] = mi.memories.get(gpu.memory_mib, 0) + 1
                sharers = self._shares.get(gpu.uuid)
                if sharers:
                    mi.used[gpu.uuid] = used = sum(sharers.values())
                    mi.partial.setdefault(host, []).append(gpu)
                    mi.partial_room[host] = mi.partial_room.get(host, 0) + UNIT - used
                    if used < UNIT and available:
                        bisect.insort(mi.rooms, (UNIT - used, host, gpu.index, gpu.uuid))
                elif gpu.uuid not in self._held:
                    free.append(gpu)
            mi.free[host] = free
            while len(mi.buckets) <= n:
                mi.buckets.append([])
            if available:
                bisect.insort(mi.buckets[len(free)], host)
                mi.free_available += len(free)
            else:
                mi.unavailable += n
        return set(by_model)

    def _unindex_host(self, host: str, gpus: list[GPU]) -> set[str]:
        """Take a host's devices (as indexed) out of the index; the models touched."""
        available = self._is_available(host)
        touched = {g.model for g in gpus}
        for model in touched:
            mi = self._index[model]
            n = mi.total.pop(host)
            mi.sizes[n] -= 1
            if not mi.sizes[n]:
                del mi.sizes[n]
            mi.devices -= n
            free = mi.free.pop(host)
            if available:
                bucket = mi.buckets[len(free)]
                del bucket[bisect.bisect_left(bucket, host)]
                mi.free_available -= len(free)
            else:
                mi.unavailable -= n
            for gpu in mi.partial.pop(host, ()):
                used = mi.used.pop(gpu.uuid)
                if used < UNIT and available:
                    del mi.rooms[bisect.bisect_left(mi.rooms, (UNIT - used, host, gpu.index, gpu.uuid))]
            mi.partial_room.pop(host, None)
        for gpu in gpus:
            memories = self._index[gpu.model].memories
            memories[gpu.memory_mib] -= 1
            if not memories[gpu.memory_mib]:
                del memories[gpu.memory_mib]
        return touched

    def _finish_models(self, models: set[str]) -> None:
        """What depends on every host of a model, for the models touched: the
        largest memory, the smallest and largest host (as many buckets as the
        largest has devices, plus one); a model without devices leaves."""
        for model in models:
            mi = self._index.get(model)
            if mi is None:
                continue
            if not mi.devices:
                del self._index[model]
                continue
            mi.memory_mib = max(mi.memories)
            mi.smallest_host = min(mi.sizes)
            del mi.buckets[max(mi.sizes) + 1 :]  # hosts that large left: those buckets are empty
        if list(self._index) != sorted(self._index):
            self._index = dict(sorted(self._index.items()))

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
            if request.share is not None:
                return self._allocate_share(holder, request, max_per_owner, policy)
            count = request.count
            if count != ALL and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
                raise AllocationRefused(f"GPU count must be a whole number ≥ 1 or {ALL!r}, got {count!r}", retry=False)
            if request.model is not None and request.model not in self._index:
                raise AllocationRefused(
                    f"Unknown GPU model {request.model!r}; choose one of: {', '.join(self._index)}",
                    retry=False,
                )
            room = None  # how many more whole devices the owner may hold
            if max_per_owner is not None:
                room = (max_per_owner * UNIT - self._owned.get(request.owner, 0)) // UNIT
                if count != ALL and count > max_per_owner:
                    raise AllocationRefused(
                        f"{count} GPUs requested, but the limit is {max_per_owner} per user", retry=False
                    )
            models = [request.model] if request.model is not None else list(self._index)
            over_room = room is not None and count != ALL and count > room
            pol = self.policy if policy is None else POLICIES[policy]
            found = None if over_room else self._choose(pol, models, count, request.host, room)
            if found is None:
                raise self._refusal(request, max_per_owner)
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
        """Book a holding in the holder and owner records; whole devices in
        ``_held`` (shares are booked device by device by ``_book_share``)."""
        self._holders[alloc.holder] = alloc
        self._versions[alloc.host] = self._versions.get(alloc.host, 0) + 1
        devices = alloc.devices
        if not devices:
            return
        if alloc.milli is None:  # the whole-GPU path, kept lean
            self._owned[alloc.owner] = self._owned.get(alloc.owner, 0) + len(devices) * UNIT
            for d in devices:
                self._held[d.uuid] = alloc.holder
        else:
            self._owned[alloc.owner] = self._owned.get(alloc.owner, 0) + sum(alloc.milli)

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
            self._versions[alloc.host] = self._versions.get(alloc.host, 0) + 1
            milli = alloc.milli
            left = self._owned.get(alloc.owner, 0) - (len(alloc.devices) * UNIT if milli is None else sum(milli))
            if left > 0:
                self._owned[alloc.owner] = left
            else:
                self._owned.pop(alloc.owner, None)
            if milli is not None:
                for d in alloc.devices:
                    self._unbook_share(d.uuid, holder)
                return alloc
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

    def adopt(
        self, holder: str, owner: str, host: str, uuids: Iterable[str], shares: Iterable[Any] | None = None
    ) -> tuple[Allocation, list[str]]:
        """Record a holding found in the cluster (e.g. after a hub restart).

        ``shares``, aligned with ``uuids``, is the share of each device (as the
        service's labels say); None: every device whole. Returns the allocation
        and the problems found: UUIDs the inventory does not know, or that
        another holder already has whole (a double booking), a device held
        whole that others share, a share that would book a device above 1.
        Such devices are left out of the allocation. A share that cannot be
        read, or shares that do not match the devices, book the devices whole:
        that may reserve too much, never too little."""
        with self._lock:
            uuids = list(uuids)
            pieces, problems = self._adopted_pieces(uuids, shares)
            devices: list[GPU] = []
            milli: list[int | None] = []
            for uuid, piece in zip(uuids, pieces):
                gpu = self._gpus.get(uuid)
                conflict = None if gpu is None else self._conflict(uuid, holder, piece)
                if gpu is not None and gpu in devices:
                    problems.append(f"{uuid} is listed twice")
                elif gpu is None:
                    problems.append(f"{uuid} is not in the inventory")
                elif conflict is not None:
                    problems.append(conflict)
                elif gpu.host != host:
                    problems.append(f"{uuid} is on {gpu.host}, not on {host}")
                else:
                    devices.append(gpu)
                    milli.append(piece)
            whole = all(m is None for m in milli) or all(m == UNIT for m in milli)
            shared = None if whole else tuple(milli)
            alloc = Allocation(holder=holder, owner=owner, host=host, devices=tuple(devices), milli=shared)
            old = self._holders.get(holder)
            if old is not None and old.booking() == alloc.booking():
                return old, problems
            self.release(holder)
            self._record(alloc)
            for gpu, piece in zip(devices, milli):
                mi = self._index[gpu.model]
                if shared is not None:
                    self._book_share(mi, gpu, holder, piece)
                    continue
                free = mi.free[gpu.host]  # out of the free lists, as allocate() would
                del free[bisect.bisect_left(free, gpu)]
                self._move(mi, gpu.host, len(free) + 1, len(free))
            return alloc, problems

    @staticmethod
    def _adopted_pieces(uuids: list[str], shares: Iterable[Any] | None) -> tuple[list[int | None], list[str]]:
        """Each device's share in milli (None: whole), and the problems found."""
        whole: list[int | None] = [None] * len(uuids)
        if shares is None:
            return whole, []
        shares = list(shares)
        if len(shares) != len(uuids):
            return whole, [f"{len(shares)} shares for {len(uuids)} devices; booked whole"]
        pieces: list[int | None] = []
        problems = []
        for uuid, share in zip(uuids, shares):
            try:
                piece = to_milli(share)
            except ValueError:
                piece = 0
            if not 0 < piece <= UNIT:
                problems.append(f"{uuid}: share {share!r} is not a share of one GPU; booked whole")
                piece = None
            pieces.append(piece)
        return (whole if problems else pieces), problems

    def _conflict(self, uuid: str, holder: str, piece: int | None) -> str | None:
        """Why ``holder`` may not hold ``piece`` (None: whole) of the device, or None."""
        whole = self._held.get(uuid)
        if whole is not None and whole != holder:
            return f"{uuid} is also held by {whole}" if piece is None else f"{uuid} is held whole by {whole}"
        others = {h: m for h, m in self._shares.get(uuid, {}).items() if h != holder}
        if not others:
            return None
        booked = ", ".join(f"{fmt(m)} by {h}" for h, m in sorted(others.items()))
        if piece is None:
            return f"{uuid} is shared ({booked}); it cannot also be held whole"
        if sum(others.values()) + piece > UNIT:
            return f"{uuid} would be booked to {fmt(sum(others.values()) + piece)} of 1 ({booked}, {fmt(piece)} here)"
        return None

    # -- shares --------------------------------------------------------------

    def _allocate_share(self, holder: str, request: Request, limit: int | None, policy: str | None) -> Allocation:
        try:
            share = to_milli(request.share, "gpu_share")
            self._check_model(request.model)
            models = self.sharing.accepting(share, request.model, list(self._index))
        except ValueError as exc:
            raise AllocationRefused(str(exc), retry=False) from None
        over_limit = limit is not None and self._owned.get(request.owner, 0) + share > limit * UNIT
        pol = self.policy if policy is None else POLICIES[policy]
        found = None if over_limit else self._choose_share(pol, models, share, request.host)
        if found is None:
            raise self._share_refusal(request, share, models, limit)
        model, host, picks = found
        mi = self._index[model]
        devices = tuple(g for g, _ in picks)
        if all(p == UNIT for _, p in picks):  # whole devices after all (e.g. 2 as 1 + 1)
            alloc = Allocation(holder=holder, owner=request.owner, host=host, devices=devices)
            free = mi.free[host]
            for g in devices:
                del free[bisect.bisect_left(free, g)]
            self._move(mi, host, len(free) + len(devices), len(free))
        else:
            alloc = Allocation(
                holder=holder, owner=request.owner, host=host, devices=devices, milli=tuple(p for _, p in picks)
            )
            for g, p in picks:
                self._book_share(mi, g, holder, p)
        self._record(alloc)
        return alloc

    def _choose_share(self, policy: Policy, models: list[str], share: int, host: str | None):
        """The best (model, host, [(device, milli), ...]) for a share, or None.

        Fewest devices first; then least room on the devices chosen (best
        fit), an untouched device counting a full room; among untouched
        devices the policy picks the host. Ties: hostname, then model."""
        need = -(-share // UNIT)  # fewest devices it can span
        best = None  # (key, model, host, picks)
        for model in models:
            mi = self._index[model]
            sharing = self.sharing.for_model(model)
            if need > 1 and not sharing.split:
                continue
            for key, h, picks in self._share_candidates(policy, mi, sharing, share, need, host):
                if best is None or key < best[0]:
                    best = (key, model, h, picks)
        if best is None:
            return None
        key, model, h, picks = best
        return model, h, sorted(picks)

    def _share_candidates(
        self, policy: Policy, mi: _ModelIndex, sharing: ModelSharing, share: int, need: int, host: str | None
    ) -> Iterator[tuple[tuple, str, list[tuple[GPU, int]]]]:
        """Candidates of one model as (key, host, picks); keys compare across models."""
        most = len(mi.buckets) - 1 if sharing.split else 1
        if host is not None:
            if host in mi.total and self._is_available(host):
                fit = self._fit_on_host(mi, host, share, sharing.quantum, need, most)
                if fit is not None:
                    n, room, picks = fit
                    # Only untouched devices: models are ranked as for a whole-GPU request.
                    rank = policy.rank(len(mi.free[host])) if room == n * UNIT else 0
                    yield (n, room, rank, host), host, picks
            return
        if need == 1:
            # One device: the shared device with least room that fits, else an
            # untouched one where the policy would put a 1-GPU request.
            i = bisect.bisect_left(mi.rooms, (share,))
            if i < len(mi.rooms):
                room, h, _, uuid = mi.rooms[i]
                yield (1, room, 0, h), h, [(self._gpus[uuid], share)]
                return
            for n, h in self._candidates(policy, mi, 1, None, None):
                yield (1, UNIT, policy.rank(n), h), h, [(mi.free[h][0], share)]
                return
            if not sharing.split:
                return
            need = 2
        # Several devices of one host: hosts with shared devices are scanned
        # (fragmented room is only there); among hosts with enough untouched
        # devices the policy picks, as for a whole-GPU request.
        pieces = split_evenly(share, need, sharing.quantum)
        for n, h in self._candidates(policy, mi, need, None, None) if pieces else ():
            yield (need, need * UNIT, policy.rank(n), h), h, list(zip(mi.free[h], pieces))
            break
        for h in sorted(mi.partial):
            if not self._is_available(h) or len(mi.free[h]) * UNIT + mi.partial_room[h] < share:
                continue
            fit = self._fit_on_host(mi, h, share, sharing.quantum, need, most)
            if fit is not None and fit[1] < fit[0] * UNIT:  # all untouched: the policy's pick above
                n, room, picks = fit
                yield (n, room, 0, h), h, picks
                if (n, room) == (need, share):
                    return  # a perfect fit on the fewest devices: no later host does better

    def _fit_on_host(
        self, mi: _ModelIndex, host: str, share: int, quantum: int, first: int, last: int
    ) -> tuple[int, int, list[tuple[GPU, int]]] | None:
        """The fewest devices (from ``first`` to ``last``) of the host that take
        the share split as evenly as the quantum allows, each piece on the
        device with the least room that fits it: (devices, their room, picks)."""
        used = mi.used
        devices = [(UNIT - used[g.uuid], g.index, g) for g in mi.partial.get(host, ()) if used[g.uuid] < UNIT]
        devices += [(UNIT, g.index, g) for g in mi.free[host]]
        devices.sort()  # by room, then index
        for n in range(first, min(last, len(devices)) + 1):
            pieces = split_evenly(share, n, quantum)
            if pieces is None:
                if share > n * UNIT:
                    continue  # pieces too big: try more devices
                return None  # pieces below the quantum: more devices cannot help
            picks = []
            total = 0
            left = list(devices)
            for piece in pieces:  # larger pieces first
                for i, entry in enumerate(left):  # noqa: B007 (i is the break index)
                    if entry[0] >= piece:
                        break
                else:
                    break  # no device left takes this piece
                del left[i]
                total += entry[0]
                picks.append((entry[2], piece))
            else:
                return n, total, picks
        return None

    def _book_share(self, mi: _ModelIndex, gpu: GPU, holder: str, piece: int) -> None:
        sharers = self._shares.get(gpu.uuid)
        if sharers is None:  # untouched until now: out of the free lists
            self._shares[gpu.uuid] = {holder: piece}
            free = mi.free[gpu.host]
            del free[bisect.bisect_left(free, gpu)]
            self._move(mi, gpu.host, len(free) + 1, len(free))
            bisect.insort(mi.partial.setdefault(gpu.host, []), gpu)
            mi.partial_room[gpu.host] = mi.partial_room.get(gpu.host, 0) + UNIT
            before = 0
        else:
            sharers[holder] = piece
            before = mi.used[gpu.uuid]
        mi.used[gpu.uuid] = before + piece
        mi.partial_room[gpu.host] -= piece
        self._set_room(mi, gpu, UNIT - before if before else 0, UNIT - before - piece)

    def _unbook_share(self, uuid: str, holder: str) -> None:
        sharers = self._shares.get(uuid)
        piece = sharers.pop(holder, None) if sharers is not None else None
        if piece is None:
            return
        if not sharers:
            del self._shares[uuid]
        gpu = self._gpus.get(uuid)
        if gpu is None:  # device left the inventory while shared
            return
        mi = self._index[gpu.model]
        before = mi.used[uuid]
        if sharers:
            mi.used[uuid] = before - piece
            mi.partial_room[gpu.host] += piece
            self._set_room(mi, gpu, UNIT - before, UNIT - before + piece)
            return
        del mi.used[uuid]  # untouched again: back to the free lists
        self._set_room(mi, gpu, UNIT - before, 0)
        partial = mi.partial[gpu.host]
        del partial[bisect.bisect_left(partial, gpu)]
        mi.partial_room[gpu.host] -= UNIT - before
        if not partial:
            del mi.partial[gpu.host]
            del mi.partial_room[gpu.host]
        free = mi.free[gpu.host]
        bisect.insort(free, gpu)
        self._move(mi, gpu.host, len(free) - 1, len(free))

    def _set_room(self, mi: _ModelIndex, gpu: GPU, old: int, new: int) -> None:
        """A shared device's room went from old to new (0: not in the room list)."""
        if old == new or not self._is_available(gpu.host):
            return
        if old:
            del mi.rooms[bisect.bisect_left(mi.rooms, (old, gpu.host, gpu.index, gpu.uuid))]
        if new:
            bisect.insort(mi.rooms, (new, gpu.host, gpu.index, gpu.uuid))

    # -- views ---------------------------------------------------------------

    def holdings(self) -> dict[str, Allocation]:
        with self._lock:
            return dict(self._holders)

    def holding(self, holder: str) -> Allocation | None:
        return self._holders.get(holder)

    def holder_of(self, uuid: str) -> str | None:
        """Who holds the device whole (None also when it is shared: see :meth:`sharers_of`)."""
        return self._held.get(uuid)

    def device(self, uuid: str) -> GPU | None:
        """The inventory's record of a device (its model and memory), or None."""
        return self._gpus.get(uuid)

    def sharers_of(self, uuid: str) -> dict[str, int]:
        """Who shares the device, with each one's share in thousandths."""
        with self._lock:
            return dict(sorted(self._shares.get(uuid, {}).items()))

    def held_by_owner(self, owner: str) -> int | Fraction:
        """What the owner holds, shares counted as such (0.5 + 1 = 1.5): an int
        when it is a whole number of GPUs, else a Fraction."""
        milli = self._owned.get(owner, 0)
        return milli // UNIT if milli % UNIT == 0 else fraction(milli)

    def summary(self) -> list[ModelSummary]:
        """Per model, by name: free and total counts, largest block on one host,
        and what the form needs to offer shares."""
        with self._lock:
            return [self._summary(model, mi) for model, mi in self._index.items()]

    def _summary(self, model: str, mi: _ModelIndex) -> ModelSummary:
        sharing = self.sharing.for_model(model)
        largest_block = mi.largest_block()
        if sharing is None:
            return ModelSummary(model, mi.memory_mib, mi.devices, mi.free_available, largest_block, mi.unavailable)
        room = mi.largest_room()
        largest_share = _ONE if room == UNIT else fraction(room) if room else _ZERO
        return ModelSummary(
            model=model,
            memory_mib=mi.memory_mib,
            total=mi.devices,
            free=mi.free_available,
            largest_block=largest_block,
            unavailable=mi.unavailable,
            shareable=True,
            quantum=fraction(sharing.quantum),
            shares=None if sharing.allowed is None else tuple(fraction(m) for m in sharing.allowed),
            split=sharing.split,
            largest_share=largest_share,
        )

    def device_map(self) -> list[DeviceUse]:
        """Every inventory device, by host and index, with who holds how much of it."""
        with self._lock:
            out = []
            for gpu in sorted(self._gpus.values()):
                whole = self._held.get(gpu.uuid)
                if whole is not None:
                    holders = (Sharer(whole, self._holders[whole].owner, _ONE),)
                    allocated = _ONE
                else:
                    sharers = self._shares.get(gpu.uuid, {})
                    holders = tuple(Sharer(h, self._holders[h].owner, fraction(m)) for h, m in sorted(sharers.items()))
                    allocated = fraction(sum(sharers.values()))
                out.append(
                    DeviceUse(
                        uuid=gpu.uuid,
                        host=gpu.host,
                        index=gpu.index,
                        model=gpu.model,
                        memory_mib=gpu.memory_mib,
                        available=self._is_available(gpu.host),
                        allocated=allocated,
                        whole=whole is not None,
                        holders=holders,
                    )
                )
            return out

    def usage(self) -> list[HostUse]:
        """Per model and host (sorted so): devices total, untouched, held whole,
        shared, and the shares booked (whole devices counting 1)."""
        with self._lock:
            rows: dict[tuple[str, str], list[int]] = {}
            for gpu in self._gpus.values():
                row = rows.setdefault((gpu.model, gpu.host), [0, 0, 0, 0, 0])
                row[0] += 1
                if gpu.uuid in self._held:
                    row[2] += 1
                    row[4] += UNIT
                elif gpu.uuid in self._shares:
                    row[3] += 1
                    row[4] += sum(self._shares[gpu.uuid].values())
                else:
                    row[1] += 1
            return [
                HostUse(
                    model=m,
                    host=h,
                    available=self._is_available(h),
                    total=t,
                    free=f,
                    whole=w,
                    shared=s,
                    allocated=fraction(a),
                )
                for (m, h), (t, f, w, s, a) in sorted(rows.items())
            ]

    def hosts(self) -> list[str]:
        return list(self._hosts)

    def version(self, host: str) -> int:
        """A number that changes whenever a holding on the host is booked,
        changed or given back (a view of who holds what there may be reused
        while it stays the same)."""
        return self._versions.get(host, 0)

    # -- refusals ------------------------------------------------------------

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self._index:
            raise ValueError(f"Unknown GPU model {model!r}; choose one of: {', '.join(self._index)}")

    def _refusal(self, request: Request, limit: int | None) -> AllocationRefused:
        """Why nothing fits, in words a user can act on. Requests that can never
        fit as asked (retry=False) are told apart from those that wait for capacity.
        ``limit``: the per-owner maximum."""
        summaries = {s.model: s for s in self.summary()}
        host, count = request.host, request.count
        held = self._owned.get(request.owner, 0)
        room = None if limit is None else (limit * UNIT - held) // UNIT  # whole devices the owner may add
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
            if count == ALL and limit is not None:
                least = min(self._index[m].total[host] for m in relevant if host in self._index[m].total)
                if least > room:
                    return self._over_limit(f"All {least} GPUs of {host} requested", least * UNIT, limit, held)
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
            return self._over_limit(f"{count} GPU(s) requested", count * UNIT, limit, held)
        if count == ALL and limit is not None:
            smallest = min(self._index[m].smallest_host for m in relevant)
            if smallest > room:
                return self._over_limit(f"{asked} requested (at least {smallest})", smallest * UNIT, limit, held)
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
            return AllocationRefused(
                f"{asked} requested ({what}), but every host has some in use right now", retry=True
            )
        block = max(summaries[m].largest_block for m in relevant)
        return AllocationRefused(
            f"{asked} requested, at most {block} free on any single host ({free} free in total)",
            retry=True,
        )

    def _share_refusal(self, request: Request, share: int, models: list[str], limit: int | None) -> AllocationRefused:
        """Why no device takes the share, the policy having accepted it: first
        what can never change (retry=False), then what may (retry=True)."""
        host = request.host
        need = -(-share // UNIT)  # fewest devices it can span
        asked = f"{fmt(share)} × {request.model or 'GPU'}"
        if host is not None:
            if host not in self._hosts:
                return AllocationRefused(
                    f"{host} is not a GPU host; choose one of: {', '.join(self._hosts)}", retry=False
                )
            has = max(self._index[m].total.get(host, 0) for m in models)
            if has < need:
                return AllocationRefused(f"{asked} requested on {host}, which has {has} of that model", retry=False)
        else:
            biggest = max(self._index[m].biggest_host for m in models)
            if need > biggest:
                return AllocationRefused(
                    f"{asked} requested, but no host has more than {biggest}"
                    f"{'' if request.model else ' of one model'} to split it over",
                    retry=False,
                )
        if limit is not None:
            held = self._owned.get(request.owner, 0)
            if held + share > limit * UNIT:
                return self._over_limit(f"{asked} requested", share, limit, held)
        if host is not None:
            if not self._is_available(host):
                return AllocationRefused(
                    f"{host} is not available right now (it is down, drained or paused)", retry=True
                )
            return AllocationRefused(f"{asked} requested on {host}, not enough free there right now", retry=True)
        room = max(self._index[m].largest_room() for m in models)
        split = any(self.sharing.for_model(m).split for m in models)
        where = "on one device or one host" if split else "on one device"
        return AllocationRefused(
            f"{asked} requested, but not that much is free {where} right now (at most {fmt(room)} on one device)",
            retry=True,
        )

    @staticmethod
    def _over_limit(asked: str, need: int, limit: int, held: int) -> AllocationRefused:
        """The request would exceed the per-owner limit: never, or not until the
        owner's other servers stop. ``need`` and ``held`` in milli-shares."""
        if need > limit * UNIT:
            return AllocationRefused(f"{asked}, but the limit is {limit} per user", retry=False)
        return AllocationRefused(
            f"{asked}, but the limit is {limit} per user and you already hold {fmt(held)} on other servers",
            retry=True,
        )


_ONE, _ZERO = Fraction(1), Fraction(0)
