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

Shares (``Request.milli``, see docs/sharing.md) follow the admin's
:class:`~gpuspawner.core.sharing.SharingPolicy`; they are exact integers of
thousandths inside, so sums never drift.

This module keeps the bookings (who holds what) and makes every change to
them. The parts it uses: the types (:mod:`~gpuspawner.allocator.records`), the
index of free devices and room (:mod:`~gpuspawner.allocator.index`), where
whole GPUs and shares go (:mod:`~gpuspawner.allocator.whole`,
:mod:`~gpuspawner.allocator.shares`), the summary per model
(:mod:`~gpuspawner.allocator.summary`), refusals
(:mod:`~gpuspawner.allocator.refusals`) and what an adopt may book
(:mod:`~gpuspawner.allocator.adopt`).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Set
from dataclasses import replace
from typing import Any

from ..core.inventory import GPU
from ..core.link_classes import LinkRequired
from ..core.sharing import OFF, UNIT, SharingPolicy, fmt
from ..core.topology import Link, Topology
from .adopt import AdoptProblem, AdoptReason, adopted_pieces, conflict
from .fragment import Mix, frag_cpu_only, frag_share, frag_whole
from .index import DeviceIndex
from .links import Links, LinkState
from .nearest import Walks, nearest_host
from .records import ALL, ONE_DEVICE, POLICIES, Allocation, Policy, Request, accepted
from .refusals import (
    AllocationRefused,
    Refusal,
    held_for_line,
    over_limit,
    share_refusal,
    short_of_resources,
    unknown_model,
    whole_refusal,
)
from .resources import HostResources, Room, checked_amount
from .shares import Picks, choose_share
from .summary import ModelSummary, fitting, summarize
from .whole import Fits, choose

__all__ = [
    "ALL",
    "POLICIES",
    "AdoptProblem",
    "AdoptReason",
    "Allocation",
    "AllocationRefused",
    "Allocator",
    "ModelSummary",
    "Refusal",
    "Request",
]


class Allocator:
    def __init__(self, gpus: Iterable[GPU] = (), policy: str = "pack", sharing: SharingPolicy | dict | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown allocation policy {policy!r}; choose one of: {', '.join(POLICIES)}")
        self.policy = POLICIES[policy]
        self.sharing = OFF
        self._lock = threading.RLock()
        self._holders: dict[str, Allocation] = {}
        self._held: dict[str, str] = {}  # uuid -> holder, for devices held whole
        self._shares: dict[str, dict[str, int]] = {}  # uuid -> {holder: milli}, for shared devices
        self._owned: dict[str, int] = {}  # owner -> milli-shares held (whole = 1000), for O(1) limit checks
        self._versions: dict[str, int] = {}  # host -> changes to the holdings on it
        self._changes = 0  # changes of anything a placement reads (a plan's walks are kept while it stays)
        self._index = DeviceIndex(self._held, self._shares)
        # (milli, model or None) -> the models that take such a share; emptied when the policy or inventory changes
        self._accepting: dict[tuple[int, str | None], list[str]] = {}
        self._unenforced: dict[str, str] = {}  # host -> why no share is placed there
        self._links = LinkState()  # how each host's GPUs are linked, where known, and what the admin requires
        self.resources = HostResources(self._holders)  # each host's CPU and memory, where known
        self._gpuless: list[str] | None = None  # known hosts without GPUs, by name (servers without GPUs)
        self.mix: Mix | None = None  # the requests the hub sees, for the frag policy
        self.set_sharing(sharing)
        self.set_inventory(gpus)

    def set_sharing(self, sharing: SharingPolicy | dict | None) -> None:
        """Which models may be shared, and how (see :class:`SharingPolicy`);
        None: whole GPUs only. Holdings are kept; new requests follow it.
        Raises ValueError naming a bad entry."""
        policy = SharingPolicy.parse(sharing)
        with self._lock:
            self._changes += 1
            self.sharing = policy
            self._accepting.clear()
            self._index.set_keep_totals(policy.uneven)

    # -- state changes from outside --------------------------------------

    def set_inventory(self, gpus: Iterable[GPU]) -> None:
        """Replace the inventory. Holdings are kept, also of devices that left it."""
        with self._lock:
            self._changes += 1
            self._accepting.clear()
            self._gpuless = None
            self._index.set_inventory(gpus)

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
            self._changes += 1
            self._accepting.clear()
            self._gpuless = None
            return self._index.set_host_devices(host, new)

    def set_available_hosts(self, hosts: Iterable[str] | None) -> None:
        """Only these hosts may be chosen (None: all). Only the hosts whose
        availability changed are touched."""
        with self._lock:
            self._changes += 1
            self._index.set_available_hosts(None if hosts is None else set(hosts))

    def set_host_resources(self, host: str, cpu_milli: int | None, memory_mib: int | None) -> None:
        """The CPU (thousandths) and memory (MiB) ``host`` has; None: not known (the
        host is then chosen by its GPUs alone). A host without GPUs may be given too:
        servers without GPUs (``Request(count=0)``) go there first. Raises ValueError."""
        with self._lock:
            self._changes += 1
            self.resources.set_host(host, cpu_milli, memory_mib)
            self._gpuless = None

    def set_host_reserved(self, host: str, by_service: Mapping[str, tuple[int, int]]) -> None:
        """What the services running on ``host`` reserve there (service name -> CPU
        thousandths, memory MiB), as the swarm says; those the allocator holds are
        counted by their holdings instead."""
        with self._lock:
            self._changes += 1
            self.resources.set_running(host, by_service)

    def set_host_topology(self, host: str, topology: Topology | None) -> None:
        """How ``host``'s GPUs are linked (None: not known): a request for several GPUs
        there gets the best linked of its free ones (:mod:`~gpuspawner.allocator.links`)."""
        with self._lock:
            if self._links.set_topology(host, topology):
                self._changes += 1  # the line's plans read it too

    def topology(self, host: str) -> Topology | None:
        return self._links.topologies.get(host)

    def set_link_required(self, required: LinkRequired) -> None:
        """How well linked a request for several GPUs of a model must get them
        (``gpu_link_required``): only a set that meets it is given, and the line plans
        only on hosts that have one."""
        with self._lock:
            self._changes += 1
            self._links.required = required

    def set_mix(self, mix: Mix | None) -> None:
        """The requests the hub sees (the frag policy places each where the free GPU
        they could not use grows least); None: frag places as pack does."""
        with self._lock:
            self.mix = mix

    def set_unenforced(self, host: str, why: str | None) -> None:
        """No share is placed on ``host`` while ``why`` (what enforces shares is missing
        there) is set; whole GPUs are placed there as before. None: shares again."""
        with self._lock:
            self._changes += 1
            if why is None:
                self._unenforced.pop(host, None)
            else:
                self._unenforced[host] = why

    # -- decisions ---------------------------------------------------------

    def allocate(
        self, holder: str, request: Request, max_per_owner: int | None = None, policy: str | None = None
    ) -> Allocation:
        """Reserve devices for ``holder`` or raise :class:`AllocationRefused`.
        ``policy`` overrides the allocator's own for this request."""
        with self._lock:
            if holder in self._holders:
                raise ValueError(f"{holder} already holds an allocation; release it first")
            try:
                checked_amount(request.cpu_milli, "cpu_milli")
                checked_amount(request.memory_mib, "memory_mib")
            except ValueError as exc:
                raise AllocationRefused(str(exc), Refusal.BAD_COUNT) from None
            if request.milli is not None:
                return self._allocate_share(holder, request, max_per_owner, policy)
            count = request.count
            if count == 0 and not isinstance(count, bool):
                return self._allocate_cpu_only(holder, request, policy)
            if count != ALL and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
                raise AllocationRefused(
                    f"GPU count must be a whole number ≥ 1 or {ALL!r}, got {count!r}", Refusal.BAD_COUNT
                )
            index = self._index
            wanted = self._wanted(request)
            held = self._owned.get(request.owner, 0)
            room = None  # how many more whole devices the owner may hold
            if max_per_owner is not None:
                room = (max_per_owner * UNIT - held) // UNIT
                if count != ALL and int(count) > max_per_owner:
                    raise over_limit(f"{count} GPUs requested", int(count) * UNIT, max_per_owner, 0)
            models = wanted if wanted is not None else list(index.models)
            over_room = room is not None and count != ALL and int(count) > room
            pol = self.policy if policy is None else POLICIES[policy]
            fits = self._fits(request)
            links = self._links.decision()
            found = None if over_room else self._place_whole(request, pol, models, room, fits, links)
            if found is None:
                if not over_room and request.avoid:
                    kept = choose(
                        index, pol, models, count, request.host, room, self._fits(request, avoid=False), links
                    )
                    if kept is not None:
                        raise held_for_line(f"{len(index.models[kept[0]].free[kept[1]])} {kept[0]} free", kept[1])
                if not over_room and fits is not None:
                    elsewhere = choose(index, pol, models, count, request.host, room, None, links)
                    if elsewhere is not None:
                        raise self._short(
                            request,
                            elsewhere[1],
                            f"{len(index.models[elsewhere[0]].free[elsewhere[1]])} {elsewhere[0]} free",
                        )
                if request.models is not None:
                    raise self._any_of_refusal(
                        request, lambda r: whole_refusal(index, self._summaries(), r, max_per_owner, held, links)
                    )
                raise whole_refusal(index, self._summaries(), request, max_per_owner, held, links)
            model, host = found
            mi = index.models[model]
            devices = self._group(links, model, host, count)
            index.take_free(mi, host, devices)
            alloc = self._made(holder, request, host, devices)
            self._record(alloc)
            return alloc

    def _place_whole(
        self, request: Request, pol: Policy, models: list[str], room: int | None, fits: Fits, links: Links
    ) -> tuple[str, str] | None:
        """The (model, host) a request for whole GPUs gets, or None (nothing taken)."""
        count = request.count
        if pol.name == "frag" and self.mix is not None and count != ALL and request.host is None:
            asked = (request.cpu_milli, request.memory_mib)
            return frag_whole(self._index, self.mix, self.resources, models, int(count), asked, fits, links)
        return choose(self._index, pol, models, count, request.host, room, fits, links)

    def _group(self, links: Links, model: str, host: str, count: int | str) -> tuple[GPU, ...]:
        """The GPUs a request placed on ``host`` gets there: the set its decision chose
        (worked out once, while the hosts were ranked)."""
        free = self._index.models[model].free[host]
        group = links.group(model, host, free, len(free) if count == ALL else int(count))
        assert group is not None  # (the host was chosen for having one)
        return group

    def link_offers(
        self, model: str, cpu_milli: int = 0, memory_mib: int = 0, policy: str | None = None
    ) -> dict[int, tuple[str, Link | None]]:
        """For each count from 2 to the most free GPUs of ``model`` on one available
        host: the host a request for that many would get now (from nobody in line,
        asking for ``cpu_milli`` and ``memory_mib``, under ``policy`` as :meth:`allocate`
        takes it: the spawner's own, so that the form names the host a spawn gets) and the link of
        the farthest pair of the set it would get there (None: that host's links are
        not known). A count no host can give now (a link class required) is left out.
        Nothing is taken: each count is decided as :meth:`allocate` decides it, by the
        same code. Cost: a decision per count, each weighing the sets of up to 8 hosts
        the policy ranks alike; on 1,000 hosts of 4 and 8 GPUs (the topology
        benchmark's cluster, idle or 60 % held) about 1 ms per model, up to 8 ms where
        the sets were not chosen before (they are remembered by how their GPUs are linked)."""
        with self._lock:
            mi = self._index.models.get(model)
            if mi is None:
                return {}
            offers: dict[int, tuple[str, Link | None]] = {}
            links = self._links.decision()
            pol = self.policy if policy is None else POLICIES[policy]
            for n in range(2, mi.largest_block() + 1):
                request = Request(model=model, count=n, cpu_milli=cpu_milli, memory_mib=memory_mib)
                found = self._place_whole(request, pol, [model], None, self._fits(request), links)
                if found is None:
                    continue
                host = found[1]
                topology = self._links.topologies.get(host)
                group = self._group(links, model, host, n)
                offers[n] = (host, None if topology is None else topology.worst(g.uuid for g in group))
            return offers

    def nearest_host(self, request: Request, exclude: Set[str] = frozenset()) -> str | None:
        """The host where ``request`` would fit first as devices free up, of those not
        in ``exclude`` (see :mod:`~gpuspawner.allocator.nearest`); None: none could take it."""
        with self._lock:
            try:
                wanted = self._wanted(request)
            except AllocationRefused:
                return None
            models = wanted or self._index.models
            return nearest_host(self._index, self.resources, request, models, exclude, self._links.decision())

    def could_take(self, request: Request, host: str) -> bool:
        """Whether ``host`` could ever take ``request``, as :meth:`nearest_host` counts it
        (available, enough devices of a model it takes, CPU and memory, links)."""
        return self.nearest_host(request, frozenset(self.hosts()) - {host}) == host

    def planner(self) -> Callable[[Request, Set[str]], str | None]:
        """:meth:`nearest_host` for one plan of a line, asked waiter after waiter with the
        hosts excluded only growing: the walks are kept between calls while nothing
        changes here (:class:`~gpuspawner.allocator.nearest.Walks`), made anew when
        anything does."""
        walks: Walks | None = None
        made_at = -1

        def nearest(request: Request, exclude: Set[str]) -> str | None:
            nonlocal walks, made_at
            with self._lock:
                try:
                    wanted = self._wanted(request)
                except AllocationRefused:
                    return None
                if walks is None or made_at != self._changes:
                    walks, made_at = Walks(self._index, self.resources, self._links.decision()), self._changes
                return walks.nearest(request, wanted or self._index.models, exclude)

        return nearest

    def _wanted(self, request: Request) -> list[str] | None:
        """The models the request accepts (None: any); raises for one not in the inventory."""
        if request.models is not None:
            if not request.models:
                raise AllocationRefused("name at least one GPU model", Refusal.UNKNOWN_MODEL)
            for model in request.models:
                if model not in self._index.models:
                    raise unknown_model(model, self._index.models)
            return sorted(set(request.models))
        if request.model is not None:
            if request.model not in self._index.models:
                raise unknown_model(request.model, self._index.models)
            return [request.model]
        return None

    def _any_of_refusal(self, request: Request, refusal: Callable[[Request], AllocationRefused]) -> AllocationRefused:
        """Why a request for any of several models got nothing: each model's own
        refusal. When none could ever be met, that (not to be retried); when all
        wait for the owner's other servers, that; else none is free right now."""
        each = []
        for model in sorted(set(request.models or ())):
            try:
                each.append(refusal(replace(request, model=model, models=None)))
            except AllocationRefused as exc:  # e.g. a share the model does not offer
                each.append(exc)
        waiting = [r for r in each if r.retry]
        if not waiting:
            return AllocationRefused("; ".join(r.message for r in each), each[0].reason)
        if all(r.reason is Refusal.LIMIT_REACHED for r in waiting):
            return waiting[0]
        return AllocationRefused(
            f"None of {', '.join(sorted(set(request.models or ())))} is free for this request right now: "
            + "; ".join(r.message for r in waiting),
            Refusal.NONE_FREE,
        )

    def _fits(self, request: Request, avoid: bool = True) -> Fits:
        """Whether a host may take the request: not one kept for those ahead in line
        (``request.avoid``, unless ``avoid`` is False), with the CPU and memory asked
        for free (None: any host may)."""
        cpu, mem = request.cpu_milli, request.memory_mib
        kept = request.avoid if avoid else frozenset()
        fits = self.resources.fits
        if not cpu and not mem:
            return (lambda host: host not in kept) if kept else None
        if kept:
            return lambda host: host not in kept and fits(host, cpu, mem)
        return lambda host: fits(host, cpu, mem)

    def _short(self, request: Request, host: str, offered: str) -> AllocationRefused:
        return short_of_resources(offered, host, self.resources.short(host, request.cpu_milli, request.memory_mib))

    @staticmethod
    def _made(holder: str, request: Request, host: str, devices: tuple[GPU, ...], **shares: Any) -> Allocation:
        return Allocation(
            holder=holder,
            owner=request.owner,
            host=host,
            devices=devices,
            cpu_milli=request.cpu_milli,
            memory_mib=request.memory_mib,
            accepts=accepted(request),
            **shares,
        )

    def _allocate_cpu_only(self, holder: str, request: Request, policy: str | None) -> Allocation:
        """A server without GPUs, where it takes least from GPU requests: of the
        available hosts whose CPU and memory are known and fit (``request.host``
        only, when pinned; of ``request.hosts``, when given; none in ``request.avoid``), those without GPUs first, then those with the fewest
        untouched GPUs of one model (a host with several models counts by each);
        ties by name. Hosts come from the index's buckets, so a busy cluster is not
        scanned host by host."""
        index, resources = self._index, self.resources
        cpu, mem = request.cpu_milli, request.memory_mib
        kept = request.avoid  # hosts planned for GPU waiters: its CPU would delay their start

        def fits(host: str, avoid: bool = True) -> bool:
            if (
                avoid
                and host in kept
                or request.host is not None
                and host != request.host
                or request.hosts is not None
                and host not in request.hosts
            ):
                return False
            free = resources.free(host)  # None: not known, so not chosen
            return free is not None and cpu <= free[0] and mem <= free[1]

        if self._gpuless is None:  # remade when the inventory or the known hosts change
            self._gpuless = [h for h in resources.known() if h not in index.by_host]
        gpuless, mis = self._gpuless, list(index.models.values())

        def in_order() -> Iterator[str]:
            yield from (h for h in gpuless if index.is_available(h) and fits(h))
            for n in range(max((len(mi.buckets) for mi in mis), default=0)):
                # Each bucket is sorted by name: the hosts that fit, merged lazily (on a
                # busy cluster most do not, and are passed over before the merge).
                yield from heapq.merge(*((h for h in mi.buckets[n] if fits(h)) for mi in mis if n < len(mi.buckets)))

        pol = self.policy if policy is None else POLICIES[policy]
        if pol.name == "frag" and self.mix is not None:
            host = frag_cpu_only(index, self.mix, resources, in_order(), (cpu, mem))
        else:
            host = next(in_order(), None)
        if host is None and kept:
            held = next((h for h in resources.known() if h in kept and index.is_available(h) and fits(h, False)), None)
            if held is not None:
                raise held_for_line("CPU and memory free", held)
        if host is None:
            known = bool(resources.known())
            raise AllocationRefused(
                "No node has the CPU and memory this server asks for free right now"
                if known
                else "No node's CPU and memory are known, so a server without GPUs cannot be placed",
                Refusal.NONE_FREE if known else Refusal.UNKNOWN_HOST,
            )
        alloc = self._made(holder, request, host, ())
        self._record(alloc)
        return alloc

    def _allocate_share(self, holder: str, request: Request, limit: int | None, policy: str | None) -> Allocation:
        index = self._index
        share = request.milli
        if type(share) is not int:  # parsed at the edges (options, labels); a caller's slip, said plainly
            raise AllocationRefused(f"a share must be whole thousandths of a GPU, got {share!r}", Refusal.BAD_SHARE)
        if request.models is not None:
            wanted = self._wanted(request) or []
            models = [m for m in self._models_accepting(share, None) if m in wanted]
        else:
            known = self._accepting.get((share, request.model))
            models = known if known is not None else self._models_accepting(share, request.model)
        held = self._owned.get(request.owner, 0)
        over = limit is not None and held + share > limit * UNIT
        pol = self.policy if policy is None else POLICIES[policy]
        fits = self._fits(request)
        if over:
            found = None
        else:
            found = None
            if pol.name == "frag" and self.mix is not None and share < UNIT and request.host is None:
                found = self._frag_share(self.mix, models, share, request, fits)
            if found is None:  # (also a share no one device takes, which the model may split)
                found = choose_share(index, self.sharing, pol, models, share, request.host, fits)
        if found is None:
            if not over and request.avoid:
                kept = choose_share(
                    index, self.sharing, pol, models, share, request.host, self._fits(request, avoid=False)
                )
                if kept is not None:
                    raise held_for_line(f"Room for {fmt(share)} of a {kept[0]}", kept[1])
            if not over and fits is not None:
                elsewhere = choose_share(index, self.sharing, pol, models, share, request.host)
                if elsewhere is not None:
                    raise self._short(request, elsewhere[1], f"Room for {fmt(share)} of a {elsewhere[0]}")
            if request.models is not None:
                raise self._any_of_refusal(
                    request,
                    lambda r: share_refusal(
                        index, self.sharing, r, share, self._models_accepting(share, r.model), limit, held
                    ),
                )
            raise share_refusal(index, self.sharing, request, share, models, limit, held)
        if found[1] in self._unenforced:
            found = self._share_elsewhere(models, share, pol, found, request.host is not None, fits)
        model, host, picks, rule = found
        mi = index.models[model]
        devices, milli = zip(*picks)
        if min(milli) == UNIT:  # whole devices after all (e.g. 2 as 1 + 1)
            alloc = self._made(holder, request, host, devices)
            index.take_free(mi, host, devices)
        else:
            alloc = self._made(holder, request, host, devices, milli=milli, rule=rule)
            if len(picks) == 1:  # one device: its room moves in the host's ranks
                self._book_share(picks[0][0], holder, picks[0][1])
            else:
                for g, p in picks:
                    self._shares.setdefault(g.uuid, {})[holder] = p
                index.add_shares(mi, host, picks)  # one host: its free lists and split ranks once
        self._record(alloc)
        return alloc

    def _frag_share(self, mix: Mix, models: list[str], share: int, request: Request, fits: Fits) -> tuple | None:
        """The frag policy's device for a share of one device (None: none takes it)."""
        asked = (request.cpu_milli, request.memory_mib)
        found = frag_share(self._index, mix, self.resources, models, share, asked, fits)
        if found is None:
            return None
        model, host, uuid = found
        return model, host, [(self._index.gpus[uuid], share)], ONE_DEVICE

    def _share_elsewhere(
        self, models: list[str], share: int, pol: Policy, found: tuple, pinned: bool, fits: Fits
    ) -> tuple[str, str, Picks, str]:
        """A placement of the share on a host that enforces shares (the first by name
        that has room; rare: only when the best one does not), or the refusal."""
        model, host = found[0], found[1]
        hosts = set() if pinned else {h for m in models for h in self._index.models[m].total}
        for h in sorted(hosts - set(self._unenforced)):
            if self._index.is_available(h):
                there = choose_share(self._index, self.sharing, pol, models, share, h, fits)
                if there is not None:
                    return there
        raise AllocationRefused(
            f"No {model} has room for {fmt(share)} of a GPU on a node that enforces shares: "
            f"{host} has, but {self._unenforced[host]}. Try again later, or ask for a whole GPU.",
            Refusal.SHARES_UNENFORCED,
        )

    def _models_accepting(self, share: int, model: str | None) -> list[str]:
        """The models that take the share (remembered: few shares are asked for), or a refusal."""
        models = self._index.models
        if model is not None and model not in models:
            raise unknown_model(model, models)
        try:
            ok = self.sharing.accepting(share, model, models)
        except ValueError as exc:
            raise AllocationRefused(str(exc), Refusal.BAD_SHARE) from None
        if len(self._accepting) < 1024:  # bounded: any multiple of the quantum may be asked for
            self._accepting[(share, model)] = ok
        return ok

    def _record(self, alloc: Allocation) -> None:
        """Book a holding in the holder and owner records; whole devices in
        ``_held`` (shares are booked device by device by ``_book_share``)."""
        self._holders[alloc.holder] = alloc
        self._versions[alloc.host] = self._versions.get(alloc.host, 0) + 1
        self._changes += 1
        self.resources.book(alloc.host, alloc.holder, alloc.cpu_milli, alloc.memory_mib)
        if not alloc.devices:
            return
        self._owned[alloc.owner] = self._owned.get(alloc.owner, 0) + alloc.total_milli
        if not alloc.shared:
            for d in alloc.devices:
                self._held[d.uuid] = alloc.holder

    def _book_share(self, gpu: GPU, holder: str, piece: int) -> None:
        self._shares.setdefault(gpu.uuid, {})[holder] = piece
        self._index.add_share(self._index.models[gpu.model], gpu, piece)

    def release(self, holder: str) -> Allocation | None:
        """Give back what ``holder`` holds. Idempotent: None when it holds nothing."""
        with self._lock:
            alloc = self._holders.pop(holder, None)
            if alloc is None:
                return None
            self._versions[alloc.host] = self._versions.get(alloc.host, 0) + 1
            self._changes += 1
            self.resources.book(alloc.host, alloc.holder, alloc.cpu_milli, alloc.memory_mib, sign=-1)
            self.resources.forget(holder)
            left = self._owned.get(alloc.owner, 0) - alloc.total_milli
            if left > 0:
                self._owned[alloc.owner] = left
            else:
                self._owned.pop(alloc.owner, None)
            if not alloc.shared:
                for d in alloc.devices:
                    if self._held.get(d.uuid) == holder:
                        del self._held[d.uuid]
                        self._index.put_free(d)
                return alloc
            if len(alloc.devices) == 1:  # one device: its room moves in the host's ranks
                self._unbook_share(alloc.devices[0].uuid, holder, rank=True)
                return alloc
            for d in alloc.devices:
                self._unbook_share(d.uuid, holder)
            ranked = set()  # each host's split ranks once, not per device (a device may have moved or changed model)
            for d in alloc.devices:
                gpu = self._index.gpus.get(d.uuid)
                if gpu is not None and (gpu.host, gpu.model) not in ranked:
                    ranked.add((gpu.host, gpu.model))
                    self._index.rank(d.uuid)
            return alloc

    def _unbook_share(self, uuid: str, holder: str, rank: bool = False) -> None:
        sharers = self._shares.get(uuid)
        piece = sharers.pop(holder, None) if sharers is not None else None
        if piece is None:
            return
        if not sharers:
            del self._shares[uuid]
        self._index.remove_share(uuid, piece, rank)

    def adopt(
        self,
        holder: str,
        owner: str,
        host: str,
        uuids: Iterable[str],
        milli: Iterable[int] | None = None,
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> tuple[Allocation, list[AdoptProblem]]:
        """Record a holding found in the cluster (e.g. after a hub restart).

        ``milli``, aligned with ``uuids``, is the share of each device in
        thousandths (as the service's labels say); None: every device whole. Returns the allocation
        and the problems found: UUIDs the inventory does not know, or that
        another holder already has whole (a double booking), a device held
        whole that others share, a share that would book a device above 1.
        Such devices are left out of the allocation. A share that cannot be
        read, or shares that do not match the devices, book the devices whole:
        that may reserve too much, never too little. ``cpu_milli`` and
        ``memory_mib``: what the service reserves on its host besides GPUs."""
        with self._lock:
            uuids = list(uuids)
            pieces, problems = adopted_pieces(uuids, milli)
            devices: list[GPU] = []
            taken: list[int | None] = []
            for uuid, piece in zip(uuids, pieces):
                problem = self._adopt_problem(uuid, holder, host, piece, devices)
                if problem is not None:
                    problems.append(problem)
                else:
                    devices.append(self._index.gpus[uuid])
                    taken.append(piece)
            milli = tuple(m or UNIT for m in taken)
            alloc = Allocation(
                holder=holder,
                owner=owner,
                host=host,
                devices=tuple(devices),
                milli=milli,
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
            )
            old = self._holders.get(holder)
            if old is not None and (old.booking(), old.cpu_milli, old.memory_mib) == (
                alloc.booking(),
                cpu_milli,
                memory_mib,
            ):
                return old, problems
            self.release(holder)
            self._record(alloc)
            if alloc.shared:
                for gpu, piece in zip(devices, milli):
                    self._book_share(gpu, holder, piece)
            else:
                for gpu in devices:  # out of the free lists, as allocate() would
                    self._index.take_free(self._index.models[gpu.model], gpu.host, [gpu])
            return alloc, problems

    def _adopt_problem(
        self, uuid: str, holder: str, host: str, piece: int | None, taken: list[GPU]
    ) -> AdoptProblem | None:
        """Why the device may not be adopted for ``holder`` (``taken``: those adopted so far), or None."""
        gpu = self._index.gpus.get(uuid)
        if gpu is not None and gpu in taken:
            return AdoptProblem(AdoptReason.LISTED_TWICE, f"{uuid} is listed twice")
        if gpu is None:
            return AdoptProblem(AdoptReason.NOT_IN_INVENTORY, f"{uuid} is not in the inventory")
        found = conflict(uuid, holder, piece, self._held.get(uuid), self._shares.get(uuid, {}))
        if found is not None:
            return found
        if gpu.host != host:
            return AdoptProblem(AdoptReason.ON_ANOTHER_HOST, f"{uuid} is on {gpu.host}, not on {host}")
        return None

    # -- views ---------------------------------------------------------------

    def holdings(self) -> dict[str, Allocation]:
        with self._lock:
            return dict(self._holders)

    def holding(self, holder: str) -> Allocation | None:
        return self._holders.get(holder)

    def booked_on(self, uuid: str) -> dict[str, int]:
        """Who holds the device, by holder name, with each one's share in
        thousandths (1000: held whole); empty when nobody does."""
        whole = self._held.get(uuid)
        if whole is not None:
            return {whole: UNIT}
        with self._lock:
            return dict(sorted(self._shares.get(uuid, {}).items()))

    def untouched(self, model: str) -> int:
        """Devices of ``model`` nobody holds any share of, on available hosts."""
        mi = self._index.models.get(model)
        return 0 if mi is None else mi.free_available

    def room(self, model: str) -> int:
        """The thousandths of ``model`` nobody holds, on available hosts: untouched
        devices and what shared ones have left."""
        with self._lock:
            mi = self._index.models.get(model)
            return 0 if mi is None else mi.free_available * UNIT + sum(self._shared_rooms(model))

    def largest_shared_room(self, model: str) -> int:
        """The most room (thousandths) on one shared device of ``model``, on available
        hosts: the largest share that would leave every untouched device as it is."""
        with self._lock:
            return max(self._shared_rooms(model), default=0)

    def _shared_rooms(self, model: str) -> Iterator[int]:
        index = self._index
        for uuid, held in self._shares.items():
            g = index.gpus.get(uuid)
            if g is not None and g.model == model and index.is_available(g.host):
                yield UNIT - sum(held.values())

    def model_devices(self, model: str) -> dict[str, dict[str, int]]:
        """The devices of ``model`` on available hosts, each with who holds it (as
        :meth:`booked_on`; empty: untouched)."""
        with self._lock:
            index = self._index
            return {
                g.uuid: self.booked_on(g.uuid)
                for g in index.gpus.values()
                if g.model == model and index.is_available(g.host)
            }

    def host_devices(self, host: str, models: Collection[str] | None = None) -> dict[str, dict[str, int]]:
        """The devices on ``host`` (of ``models``, when given), each with who holds it (as
        :meth:`booked_on`; empty: untouched)."""
        with self._lock:
            held, shares = self._held, self._shares
            return {
                g.uuid: {held[g.uuid]: UNIT} if g.uuid in held else dict(shares.get(g.uuid, {}))
                for g in self._index.by_host.get(host, ())
                if models is None or g.model in models
            }

    def host_room(self, host: str) -> Room:
        """``host``'s CPU and memory free now (None: not known, not limited) and what
        each of the allocator's holders there reserves: what frees up as they end."""
        with self._lock:
            return self.resources.free(host), self.resources.held_by(host)

    def device(self, uuid: str) -> GPU | None:
        """The inventory's record of a device (its model and memory), or None."""
        return self._index.gpus.get(uuid)

    def milli_held_by(self, owner: str) -> int:
        """What the owner holds in thousandths, shares counted as such (0.5 + 1: 1500)."""
        return self._owned.get(owner, 0)

    def summary(self, cpu_milli: int = 0, memory_mib: int = 0) -> list[ModelSummary]:
        """Per model, by name: free and total counts, largest block on one host,
        and what the form needs to offer shares; with ``cpu_milli`` or ``memory_mib``,
        counting only the hosts that have that much free too."""
        with self._lock:
            summaries = list(self._summaries().values())
            if not cpu_milli and not memory_mib:
                return summaries
            index = self._index
            fits = {h for h in index.hosts if index.is_available(h) and self.resources.fits(h, cpu_milli, memory_mib)}
            return [fitting(s, index.models[s.model], fits) for s in summaries]

    def _summaries(self) -> dict[str, ModelSummary]:
        return {model: summarize(model, mi, self.sharing) for model, mi in self._index.models.items()}

    def hosts(self) -> list[str]:
        return list(self._index.hosts)

    def version(self, host: str) -> int:
        """A number that changes whenever a holding on the host is booked,
        changed or given back (a view of who holds what there may be reused
        while it stays the same)."""
        return self._versions.get(host, 0)
