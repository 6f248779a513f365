"""The GPU cluster as the hub sees it: which devices exist, how healthy they
are, which nodes may get servers, and the admin views made from them.

It holds the nodes' last known status and the GPUs as the inventory sources
describe them (a static file, node agents' reports, an NVML probe in the hub
itself), and feeds the allocator the devices it may offer. Who holds which
device is :mod:`gpuspawner.holdings`' concern; it tells the views here.

Only healthy devices on nodes that report in time are given to the
allocator; the others stay known here, with the reason, for admins.

A UUID belongs to one host at a time: the one the static inventory lists it
for, or else the one whose accepted report named it first. A report that
names a UUID another host has is refused as a whole (see :meth:`GPUCluster.receive`),
unless that host's claim rests only on its agent and its agent is late: then
the device moves to the reporting host.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from . import views
from .allocator import Allocation, Allocator
from .inventory import GPU
from .labels import ServerLabels
from .reports import Conflict, NodeReport, UUIDConflict, device_problems, gpus_of, parse_report, report_uuids
from .sharing import UNIT, fraction
from .swarm import Node, Swarm
from .views import HoldersOf, HostCache, Maker

__all__ = ["GPUCluster", "DeviceState", "SOURCES", "InventorySettings"]

#: Where GPUs can come from. ``static``: the admin's file; ``agent``: reports
#: posted by gpuspawner-agent on each node; ``local``: NVML in the hub's own
#: process (a single-host setup).
SOURCES = ("static", "agent", "local")
HOSTS_PER_STEP = 100  # the admin views check this many hosts, then let the event loop run other work
NODES_MAX_AGE = 1.0  # seconds a node list is good for


@dataclass(frozen=True)
class InventorySettings:
    static: tuple[GPU, ...] = ()
    sources: tuple[str, ...] = ("static",)
    aliases: tuple[tuple[str, str], ...] = ()  # NVML name -> what users see
    stale_intervals: float = 3.0  # a node's agent is late after this many of its intervals
    max_temperature_c: float = 90.0
    local_host: str = ""  # the node the hub's own NVML probe speaks for
    local_interval: float = 15.0


@dataclass
class DeviceState:
    """One device as the sources describe it, healthy or not."""

    gpu: GPU
    source: str  # "static" | "agent" | "local"
    problems: list[str] = field(default_factory=list)
    temperature_c: float | None = None
    utilization_gpu: int | None = None
    memory_used_mib: int | None = None
    processes: int | None = None

    @property
    def healthy(self) -> bool:
        return not self.problems


class GPUCluster:
    _shared: dict[str, GPUCluster] = {}

    @classmethod
    def shared(cls, key: object, settings: Callable[[], InventorySettings]) -> GPUCluster:
        """The one instance for this configuration in this process (spawners
        that differ in policy still share one allocator); ``settings`` is
        called (and the static inventory read) the first time only."""
        k = json.dumps(key, sort_keys=True, default=str)
        if k not in cls._shared:
            cls._shared[k] = cls(settings())
        return cls._shared[k]

    def __init__(self, settings: InventorySettings | Iterable[GPU] = ()):
        if not isinstance(settings, InventorySettings):
            settings = InventorySettings(static=tuple(settings))
        self.settings = settings
        self.aliases: Mapping[str, str] = dict(settings.aliases)
        self.allocator = Allocator()
        self.nodes: dict[str, Node] = {}
        self.ports: dict[str, int] = {}  # holder -> port, for host networking
        self.reports: dict[str, tuple[NodeReport, float]] = {}  # host -> (report, when received)
        self._states: dict[str, dict[str, DeviceState]] = {}  # host -> uuid -> every known device
        self._offered_by_host: dict[str, tuple[GPU, ...]] = {}  # host -> its healthy devices
        self.stale: dict[str, str] = {}  # host -> why its devices are not offered
        self._last_uuid: dict[tuple[str, int], str] = {}  # a lost GPU may no longer say its UUID
        # Who has each UUID, kept as reports come in (never rebuilt from all hosts).
        self._listed: dict[str, str] = {}  # uuid -> host, from the static inventory (when it is a source)
        self._owner: dict[str, str] = {}  # uuid -> host: listed for it, or named by its accepted report
        self._claims: dict[str, frozenset[str]] = {}  # host -> the UUIDs its accepted report named, less those moved
        self.conflicts: dict[str, dict[str, Conflict]] = {}  # refused host -> uuid -> who has it; replaced, not changed
        # Holdings found in the swarm on devices not offered yet, by service name.
        self.pending: dict[str, ServerLabels] = {}
        self._offered = False  # the allocator has had a first inventory
        # What the admin views are made from, per host (see "views for admins").
        self._readings: dict[str, int] = {}  # host -> reports taken (its device states were replaced)
        self._health: dict[str, tuple] = {}  # host -> its devices and whether each is healthy
        self._health_changes: dict[str, int] = {}  # host -> changes of the above
        self._unhealthy: dict[str, dict[str, int]] = {}  # host -> model -> unhealthy devices, where any
        self._holder_changes: dict[str, int] = {}  # host -> holders_changed(host) calls
        self._holders_epoch = 0  # holders_changed() calls, and changes of holders_of
        self._holders_source: HoldersOf | None = None  # what made the holders kept below
        self._holders_kept: dict[str, tuple[Hashable, dict[str, list[dict]]]] = {}  # host -> (key, uuid -> holders)
        self._views: dict[str, HostCache] = {}  # kind -> each host's part of that view
        self._schedulable: set[str] | None = None
        self._next_port: int | None = None
        self._nodes_read = False
        self._nodes_at = 0.0  # when the node list was last read
        self._local_due = 0.0
        self._lock = asyncio.Lock()
        if "static" in settings.sources:
            for gpu in settings.static:
                self._listed[gpu.uuid] = self._owner[gpu.uuid] = gpu.host
        self.apply()

    # -- inventory sources -------------------------------------------------------

    @property
    def static_hosts(self) -> set[str]:
        return {g.host for g in self.settings.static} if "static" in self.settings.sources else set()

    def receive(self, report: NodeReport, now: float | None = None) -> None:
        """Take a node's report. A host in the static inventory keeps its
        listed devices; its report then only says how healthy they are.
        Only this host is recomputed; the allocator is touched only when the
        set of devices it may offer changed.

        Raises :class:`UUIDConflict` (nothing of the report is taken: the host
        keeps its previous report) when the report names a UUID (of a GPU or a
        MIG device) that another host has: listed for it in the static
        inventory, or named by its accepted report while its agent is not
        late. A device whose old host's agent is late, or whose old host's
        report no longer names it, moves to the reporting host. The refusal is
        kept in :attr:`conflicts` until the host's next accepted report, or
        until the other host no longer has the UUID."""
        now = time.monotonic() if now is None else now
        host = report.hostname
        uuids = report_uuids(report)
        before = self._claims.get(host, frozenset())
        moved: dict[str, str] = {}  # uuid -> the host it is taken from
        if uuids != before:  # the same UUIDs as last time are this host's already
            refused = []
            for uuid in uuids - before:
                owner = self._owner.get(uuid, host)
                if owner == host:
                    continue
                if uuid not in self._listed and self._agent_late(owner, now):
                    moved[uuid] = owner
                else:
                    refused.append((uuid, owner))
            if refused:
                raise self._refuse(host, refused)
            self._claim(host, before, uuids, moved)
        if host in self.conflicts:
            del self.conflicts[host]
        self.reports[host] = (report, now)
        losers = [other for other in sorted(set(moved.values())) if self._set_host(other)]
        changed = self._set_host(host)
        back = host in self.stale and self._check_stale(now)
        if changed or losers or back:
            self._offer(losers + ([host] if changed else []))

    def _agent_late(self, host: str, now: float) -> bool:
        got = self.reports.get(host)
        if got is None:
            return False
        report, received = got
        return now - received > self.settings.stale_intervals * report.interval

    def _refuse(self, host: str, refused: list[tuple[str, str]]) -> UUIDConflict:
        """Remember why the host's report is refused (replacing what its last refusal said)."""
        wall = time.time()
        old = self.conflicts.get(host, {})
        records = {}
        for uuid, owner in sorted(refused):
            prev = old.get(uuid)
            since = prev.since if prev is not None and prev.owner == owner else wall
            records[uuid] = Conflict(host, uuid, owner, uuid in self._listed, since, wall)
        self.conflicts[host] = records
        return UUIDConflict(tuple(records.values()))

    def _claim(self, host: str, before: frozenset[str], uuids: frozenset[str], moved: Mapping[str, str]) -> None:
        """The index after the host's report naming ``uuids`` (``before``: its last one's) is accepted."""
        for uuid, owner in moved.items():
            self._claims[owner] = self._claims[owner] - {uuid}
        for uuid in before - uuids:
            if self._owner.get(uuid) == host and uuid not in self._listed:
                del self._owner[uuid]
        for uuid in uuids - before:
            self._owner[uuid] = host
        self._claims[host] = uuids
        if self.conflicts:  # a refusal whose UUID the other host no longer has is settled
            for refused, records in list(self.conflicts.items()):
                kept = {u: c for u, c in records.items() if self._owner.get(u) == c.owner}
                if not kept:
                    del self.conflicts[refused]
                elif len(kept) != len(records):
                    self.conflicts[refused] = kept

    @property
    def uuid_conflicts(self) -> list[Conflict]:
        """The refusals still standing, by host and UUID."""
        return [c for host in sorted(self.conflicts) for _, c in sorted(self.conflicts[host].items())]

    def apply(self, now: float | None = None) -> None:
        """Recompute every host (at start) or only which nodes are late."""
        now = time.monotonic() if now is None else now
        if not self._offered:
            for host in {g.host for g in self.settings.static} | set(self.reports):
                self._set_host(host)
            self._offer()
        elif self._check_stale(now):
            self._update_availability()

    @property
    def devices(self) -> dict[str, DeviceState]:
        return {uuid: state for states in self._states.values() for uuid, state in states.items()}

    def _set_host(self, host: str) -> bool:
        """Recompute one host's devices; True when what it may offer changed."""
        states = self._host_states(host)
        offered = tuple(sorted(s.gpu for s in states.values() if s.healthy))
        # Replaced, never changed in place: the admin views may read a host's
        # states from a thread while the next report comes in.
        self._states[host] = states
        self._readings[host] = self._readings.get(host, 0) + 1
        health = tuple((s.gpu, s.healthy) for s in states.values())
        if health != self._health.get(host):
            self._health[host] = health
            self._health_changes[host] = self._health_changes.get(host, 0) + 1
            unhealthy: dict[str, int] = {}
            for s in states.values():
                if not s.healthy:
                    unhealthy[s.gpu.model] = unhealthy.get(s.gpu.model, 0) + 1
            if unhealthy:
                self._unhealthy[host] = unhealthy
            else:
                self._unhealthy.pop(host, None)
        if offered == self._offered_by_host.get(host, ()):
            return False
        self._offered_by_host[host] = offered
        return True

    def _offer(self, hosts: Iterable[str] = ()) -> None:
        """Give the allocator what these hosts may offer now, one host at a time
        (the first time: every host's, in one build)."""
        if self._offered:
            for host in hosts:
                self.allocator.set_host_devices(host, self._offered_by_host.get(host, ()))
        else:
            self.allocator.set_inventory(
                g for host in sorted(self._offered_by_host) for g in self._offered_by_host[host]
            )
            self._offered = True
        self._adopt_pending()
        self._update_availability()

    def _check_stale(self, now: float) -> bool:
        """A node whose agent is late keeps its devices in the inventory, but
        its host is made unavailable: the form says they exist but cannot be
        had now. True when the set of late nodes changed."""
        stale = {}
        for host, (report, received) in self.reports.items():
            late = now - received
            if host not in self.static_hosts and late > self.settings.stale_intervals * report.interval:
                stale[host] = f"no report from its agent for {late:.0f} s"
        changed = stale.keys() != self.stale.keys()
        self.stale = stale
        return changed

    def _aliased(self, gpu: GPU) -> GPU:
        model = self.aliases.get(gpu.model)
        return gpu if model is None else GPU(gpu.host, gpu.index, gpu.uuid, model, gpu.memory_mib)

    def _host_states(self, host: str) -> dict[str, DeviceState]:
        settings = self.settings
        states: dict[str, DeviceState] = {}
        listed = host in self.static_hosts  # then the static inventory decides which devices it has
        if listed:
            for gpu in settings.static:
                if gpu.host == host:
                    states[gpu.uuid] = DeviceState(self._aliased(gpu), "static")
        if host not in self.reports:
            return states
        report = self.reports[host][0]
        source = "local" if host == settings.local_host and "local" in settings.sources else "agent"
        max_temp = settings.max_temperature_c
        owner = self._owner
        for gpu, dev in gpus_of(report, self.aliases):
            if owner.get(gpu.uuid, host) != host:
                continue  # moved to another host while this one's agent was late
            state = states.get(gpu.uuid)
            if state is None:
                if listed:
                    continue
                state = states[gpu.uuid] = DeviceState(gpu, source)
            state.problems.extend(device_problems(dev.lost, dev.ecc_uncorrected, dev.temperature_c, max_temp))
            state.temperature_c, state.utilization_gpu = dev.temperature_c, dev.utilization_gpu
            state.memory_used_mib, state.processes = dev.memory_used_mib, dev.processes
        before = self._states.get(host, {})
        for dev in report.devices:
            if dev.uuid is not None:
                self._last_uuid[(host, dev.index)] = dev.uuid
                continue
            # Lost before NVML named it: the GPU last seen at that index stays known, marked.
            uuid = self._last_uuid.get((host, dev.index), "")
            if owner.get(uuid, host) != host:
                continue
            state = states.get(uuid)
            if state is None and not listed and uuid in before:
                state = states[uuid] = DeviceState(before[uuid].gpu, source)
            if state is not None:
                state.problems.extend(device_problems(dev.lost, None, None, max_temp) or ["NVML cannot read it"])
        return states

    def is_available(self, host: str) -> bool:
        """The node may get new servers: schedulable in the swarm, and its agent (if any) not late."""
        return (self._schedulable is None or host in self._schedulable) and host not in self.stale

    def _update_availability(self) -> None:
        if self._schedulable is None:
            hosts = None if not self.stale else set(self.allocator.hosts()) - set(self.stale)
        else:
            hosts = self._schedulable - set(self.stale)
        self.allocator.set_available_hosts(hosts)

    def adopt(self, name: str, claim: ServerLabels) -> tuple[Allocation, list[str]]:
        """Book what a running service holds (its labels, read strictly).
        Devices not offered yet (an agent has not reported, or the device is
        unhealthy) are taken the moment they are, before any request can see
        them free."""
        shares = None if claim.milli is None else [fraction(m) for m in claim.milli]
        alloc, problems = self.allocator.adopt(name, claim.user, claim.host, claim.uuids, shares)
        if len(alloc.devices) < len(claim.uuids):
            self.pending[name] = claim
        else:
            self.pending.pop(name, None)
        return alloc, problems

    def _adopt_pending(self) -> None:
        for name, claim in list(self.pending.items()):
            self.adopt(name, claim)

    async def _probe_local(self, log) -> None:
        """NVML in the hub's own process, at most once per interval."""
        from .agent import AgentError, probe

        if time.monotonic() < self._local_due:
            return
        self._local_due = time.monotonic() + self.settings.local_interval
        try:
            found = await asyncio.get_running_loop().run_in_executor(
                None, lambda: probe(max_temperature_c=self.settings.max_temperature_c)
            )
            found.update(hostname=self.settings.local_host, interval=self.settings.local_interval)
            self.receive(parse_report(json.dumps(found)))
        except AgentError as exc:
            log.error("Local GPU probe: %s", exc)
        except ValueError as exc:
            log.error("Local GPU probe gave an unusable report: %s", exc)

    # -- swarm state ---------------------------------------------------------------

    async def refresh(self, swarm: Swarm, log: logging.Logger | logging.LoggerAdapter) -> None:
        """Take node status from the swarm (at most every NODES_MAX_AGE seconds:
        a burst of spawns asks once); on first use, rebuild holdings."""
        async with self._lock:
            if "local" in self.settings.sources:
                await self._probe_local(log)
            if not self._nodes_read or time.monotonic() - self._nodes_at >= NODES_MAX_AGE:
                nodes = await swarm.nodes()
                self._nodes_at = time.monotonic()
                self.nodes = {n.hostname: n for n in nodes}
                self._schedulable = {n.hostname for n in nodes if n.schedulable}
            self.apply()
            self._update_availability()
            self._nodes_read = True

    def node_addr(self, hostname: str) -> str | None:
        node = self.nodes.get(hostname)
        return node.addr if node else None

    def hostname_of(self, node_id: str) -> str | None:
        for node in self.nodes.values():
            if node.id == node_id:
                return node.hostname
        return None

    # -- views for admins ------------------------------------------------------------
    #
    # The allocation map, its JSON, the /hub/gpus page and the metrics are made
    # host by host, and each host's part is kept until that host changes: a
    # report from its agent (``_readings``; the metrics only count a change of
    # its devices or their health, ``_health_changes``), a holding booked or given
    # back on it (``Allocator.version``), ``holders_changed``, or its staleness or
    # availability. Who holds a device is an input: ``holders_of(uuid)``.

    def holders_of(self, uuid: str) -> list[dict]:
        """Who holds the device, as the allocation map lists them, by holder
        name: ``[{"user", "server", "share", ...}]``. The hub's holdings put
        their own answer here; whoever changes it other than by booking or
        giving back devices in the allocator calls :meth:`holders_changed`."""
        allocator = self.allocator
        whole = allocator.holder_of(uuid)
        shares = {whole: UNIT} if whole is not None else allocator.sharers_of(uuid)
        return [
            {"user": getattr(allocator.holding(h), "owner", ""), "server": "", "share": milli / UNIT}
            for h, milli in shares.items()
        ]

    def holders_changed(self, host: str | None = None) -> None:
        """What ``holders_of`` says of the devices of ``host`` (None: of any
        host) changed in a way the allocator's own bookings do not show (a
        holder's user or server name): their views are made again."""
        if host is None:
            self._holders_epoch += 1
        else:
            self._holder_changes[host] = self._holder_changes.get(host, 0) + 1

    def _holders_from(self, holders_of: HoldersOf | None) -> HoldersOf:
        holders_of = holders_of or self.holders_of
        if holders_of != self._holders_source:  # another source: nothing kept is its answer
            self._holders_source = holders_of
            self._holders_kept.clear()
            self._holders_epoch += 1
        return holders_of

    def _holders_key(self, host: str) -> tuple:
        return (
            self.allocator.version(host),
            self._holder_changes.get(host, 0),
            self._holders_epoch,
            self._health_changes.get(host, 0),
        )

    def _holders(self, host: str, key: tuple, holders_of: HoldersOf) -> dict[str, list[dict]]:
        """The holders of each of the host's devices, kept while ``key`` (its _holders_key) holds."""
        kept = self._holders_kept.get(host)
        if kept is not None and kept[0] == key:
            return kept[1]
        holders = {}  # only the held: fewer objects for the garbage collector to walk
        for uuid in self._states.get(host, ()):
            held = holders_of(uuid)
            if held:
                holders[uuid] = held
        self._holders_kept[host] = (key, holders)
        return holders

    def _hosts_with_devices(self) -> list[str]:
        return sorted(host for host, states in self._states.items() if states)

    def alloc_map(self, holders_of: HoldersOf | None = None) -> dict[str, dict[str, dict]]:
        """Every known device by host, with who holds it and how healthy it is:
        ``{host: {uuid: {model, allocated, health, problems, holders, ...}}}``.
        Made afresh (its dicts are the caller's) for all devices: the hub's
        handlers use :meth:`alloc_map_json` and :meth:`host_views`, which keep
        each host's part."""
        holders_of = self._holders_from(holders_of)
        out = {}
        for host in self._hosts_with_devices():
            holders = self._holders(host, self._holders_key(host), holders_of)
            copies = {uuid: [dict(h) for h in held] for uuid, held in holders.items()}
            out[host] = views.host_entries(self._states[host].values(), copies, self.stale.get(host))
        return out

    async def alloc_map_json(self, holders_of: HoldersOf | None = None) -> bytes:
        """:meth:`alloc_map` as JSON, byte for byte what tornado's ``write`` makes
        of it, from each host's part kept as JSON text (see :meth:`host_views`)."""
        return views.join_json(await self.host_views("json", views.host_json, holders_of))

    async def host_views(self, kind: str, make: Maker, holders_of: HoldersOf | None = None, inline: int = 16) -> list:
        """``make(host, entries, stale)`` for every host with devices, by hostname:
        ``entries`` as :meth:`alloc_map` has them for the host, ``stale`` why its
        agent is late (None when it is not). Each host's result is kept, under
        ``kind``, until that host changes; another ``make`` (``!=``) starts the
        kind afresh.

        When more than ``inline`` hosts changed, their parts are made in a
        thread (``make`` must allow that), from inputs that are never changed
        after: a host's device states are replaced by each report, never
        changed, and holders are made anew on every change. Making every host's
        part is O(devices) (e.g. JSON of 8,000 devices: ~40 ms) and would
        otherwise block the event loop. What is left on it (checking each
        host's key, gathering the inputs of those that changed) gives way to
        other work every ``HOSTS_PER_STEP`` hosts."""
        holders_of = self._holders_from(holders_of)
        cache = self._views.get(kind)
        if cache is None or cache.maker != make:
            cache = self._views[kind] = HostCache(make)
        out: list = []
        todo: list[tuple[int, str, tuple]] = []
        jobs = []
        for n, host in enumerate(self._hosts_with_devices(), 1):
            if n % HOSTS_PER_STEP == 0:
                await asyncio.sleep(0)
                if not self._states.get(host):
                    continue  # cannot happen today (a host's states are replaced, never removed)
            holders_key = self._holders_key(host)
            stale = self.stale.get(host)
            key = (self._readings.get(host, 0), stale, holders_key)
            found, value = cache.get(host, key)
            out.append(value)
            if not found:
                todo.append((len(out) - 1, host, key))
                jobs.append(
                    (host, tuple(self._states[host].values()), self._holders(host, holders_key, holders_of), stale)
                )
        if len(jobs) > inline:
            made = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(views.make_hosts, make, jobs, yield_gil=True)
            )
        else:
            made = views.make_hosts(make, jobs)
        for (i, host, key), value in zip(todo, made):
            cache.put(host, key, value)
            out[i] = value
        return out

    def device_counts(self, holders_of: HoldersOf | None = None) -> list[tuple[str, list[tuple[str, tuple]]]]:
        """For the metrics, per host with devices, by hostname: per model, by
        name, (devices, free, unhealthy, allocated share). Each host's list is
        kept (the same object) until its devices or their health, its holdings,
        its staleness or its availability change: readings alone do not count."""
        holders_of = self._holders_from(holders_of)
        cache = self._views.get("counts")
        if cache is None:
            cache = self._views["counts"] = HostCache()
        out = []
        for host in self._hosts_with_devices():
            holders_key = self._holders_key(host)
            stale, available = self.stale.get(host), self.is_available(host)
            key = (self._health_changes.get(host, 0), stale is not None, available, holders_key)
            found, rows = cache.get(host, key)
            if not found:
                holders = self._holders(host, holders_key, holders_of)
                rows = views.host_counts(views.host_entries(self._states[host].values(), holders, stale), available)
                cache.put(host, key, rows)
            out.append((host, rows))
        return out

    def unhealthy_by_model(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for models in self._unhealthy.values():
            for model, n in models.items():
                counts[model] = counts.get(model, 0) + n
        return counts
