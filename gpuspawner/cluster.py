"""Process-wide state of the GPU cluster, shared by every spawner of a hub.

JupyterHub drops a Spawner object after each stop, so what must outlive one
server lives here: the allocator (who holds which device), the ports taken by
host-network servers, the nodes' last known status, and the GPUs as the
inventory sources describe them (a static file, node agents' reports, an
NVML probe in the hub itself). At first use it is rebuilt from the labels of
the services the swarm actually runs, so a restarted hub neither forgets a
running server's GPUs nor hands them out twice.

Only healthy devices on nodes that report in time are given to the
allocator; the others stay known here, with the reason, for admins.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from . import metrics
from .allocator import Allocation, Allocator
from .inventory import GPU
from .ledger import Ledger, LedgerError
from .reports import NodeReport, device_problems, gpus_of, parse_report
from .service_spec import LABEL, Holding, holding_from_labels
from .swarm import Node, Swarm, SwarmError

__all__ = ["GPUCluster", "DeviceState", "SOURCES", "InventorySettings"]

#: Where GPUs can come from. ``static``: the admin's file; ``agent``: reports
#: posted by gpuspawner-agent on each node; ``local``: NVML in the hub's own
#: process (a single-host setup).
SOURCES = ("static", "agent", "local")
# Allocator.adopt's words for a device that two services book.
DOUBLE_BOOKED = re.compile(r"also held by|held whole by|is shared \(|would be booked to")
NODES_MAX_AGE = 1.0  # seconds a node list is good for  # how long a removed orphan's container may take to exit


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
    _shared: dict[str, "GPUCluster"] = {}

    @classmethod
    def shared(cls, key: object, settings: Callable[[], InventorySettings]) -> "GPUCluster":
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
        self.servers: dict[str, tuple[str, str]] = {}  # holder -> (user, server name)
        self.ledger: Ledger | None = None  # the history of allocations, when configured
        self.busy: set[str] = set()  # holders being started or stopped: their service may come or go
        self._pending: dict[str, Holding] = {}
        self._orphans: set[str] = set()  # services whose server the hub did not know last time  # adopted holdings of devices not (yet) offered
        self._offered = False  # the allocator has had a first inventory
        self._schedulable: set[str] | None = None
        self._next_port: int | None = None
        self._rebuilt = False
        self._nodes_at = 0.0  # when the node list was last read
        self._local_due = 0.0
        self._lock = asyncio.Lock()
        self.apply()

    # -- inventory sources -------------------------------------------------------

    @property
    def static_hosts(self) -> set[str]:
        return {g.host for g in self.settings.static} if "static" in self.settings.sources else set()

    def receive(self, report: NodeReport, now: float | None = None) -> None:
        """Take a node's report. A host in the static inventory keeps its
        listed devices; its report then only says how healthy they are.
        Only this host is recomputed; the allocator is touched only when the
        set of devices it may offer changed."""
        now = time.monotonic() if now is None else now
        self.reports[report.hostname] = (report, now)
        changed = self._set_host(report.hostname)
        back = report.hostname in self.stale and self._check_stale(now)
        if changed or back:
            self._offer([report.hostname] if changed else [])

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
        self._states[host] = states
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
        for gpu, dev in gpus_of(report, self.aliases):
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

    def _adopt_pending(self) -> None:
        """Holdings found in the swarm whose devices were not offered when the
        hub rebuilt them (an agent had not reported yet, or the device was
        unhealthy) are taken the moment those devices are offered, before any
        request can see them free."""
        for holder, h in list(self._pending.items()):
            alloc, problems = self.allocator.adopt(holder, h.user, h.host, h.uuids, h.shares)
            if len(alloc.devices) == len(h.uuids):
                del self._pending[holder]

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
            if not self._rebuilt or time.monotonic() - self._nodes_at >= NODES_MAX_AGE:
                nodes = await swarm.nodes()
                self._nodes_at = time.monotonic()
                self.nodes = {n.hostname: n for n in nodes}
                self._schedulable = {n.hostname for n in nodes if n.schedulable}
            self.apply()
            self._update_availability()
            if not self._rebuilt:
                await self._reconcile(swarm, log)
                self._rebuilt = True

    async def reconcile(self, swarm: Swarm, log, untracked: Callable[[str, str], bool] | None = None) -> dict[str, int]:
        """Make the holdings match the services the swarm runs: adopt each
        labelled service's devices, and give back those of services that are
        gone (except servers being started or stopped right now).

        ``untracked(user, server)`` says whether the hub has no such server
        running or starting (e.g. its spawn died with a killed hub): such a
        service, found so at two reconciliations in a row, is removed."""
        async with self._lock:
            return await self._reconcile(swarm, log, untracked)

    async def _reconcile(self, swarm: Swarm, log, untracked=None) -> dict[str, int]:
        services = await swarm.services(f"{LABEL}.devices")
        found: dict[str, Holding] = {}
        adopted = 0
        for service in services:
            spec = service.get("Spec", {})
            holding = holding_from_labels(spec.get("Labels") or {})
            name = spec.get("Name", "")
            if holding is None or not name:
                continue
            found[name] = holding
            self.servers[name] = (holding.user, holding.server)
            if holding.port is not None:
                self.ports.setdefault(name, holding.port)
            current = self.allocator.holding(name)
            if not holding.uuids or (current is not None and current.uuids == holding.uuids):
                continue
            alloc, problems = self.allocator.adopt(name, holding.user, holding.host, holding.uuids, holding.shares)
            adopted += 1
            if len(alloc.devices) < len(holding.uuids):
                self._pending[name] = holding
            for problem in problems:
                log.warning("Service %s: %s", name, problem)
                if DOUBLE_BOOKED.search(problem):
                    metrics.DOUBLE_BOOKINGS.inc()
            if alloc.devices:  # what was adopted: devices the inventory knows
                await self._record(log, "open", name, holding.user, holding.server, holding.host, holding.model,
                                   alloc.uuids, [float(s) for s in alloc.shares])
        removed = await self._remove_orphans(swarm, log, found, untracked)
        gone = [h for h in self.allocator.holdings() if h not in found and h not in self.busy]
        for holder in gone:
            log.warning("Service %s is gone; releasing its GPUs", holder)
            self.release(holder)
        # Also closes what a stop could not record while the database was down.
        await self._record(log, "close_missing", set(found) | self.busy)
        held = sum(len(a.devices) for a in self.allocator.holdings().values())
        log.info("GPU allocations reconciled with the swarm: %d services, %d adopted, %d released, %d devices held",
                 len(found), adopted, len(gone), held)
        return {"services": len(found), "adopted": adopted, "released": len(gone), "held": held, "removed": removed}

    async def _remove_orphans(self, swarm: Swarm, log, found: dict[str, Holding], untracked) -> int:
        """Remove services of servers the hub does not know, found so twice in a
        row (not a spawn about to register). Their GPUs stay held until a later
        round finds the service gone, which gives the container time to exit;
        nothing here waits, so spawns are never held up behind a slow node."""
        orphans = set()
        if untracked is not None:
            orphans = {name for name, h in found.items() if name not in self.busy and untracked(h.user, h.server)}
        removed = 0
        for name in sorted(orphans & self._orphans):
            h = found[name]
            log.warning("Service %s runs a server the hub does not know (%s/%s); removing it", name, h.user, h.server)
            try:
                await swarm.remove_service(name)
                removed += 1
            except SwarmError as exc:
                log.warning("Could not remove service %s: %s", name, exc)
        self._orphans = orphans
        return removed

    async def ledger_call(self, method: str, *args):
        """A ledger call, off the event loop (database I/O); None without a ledger.
        Raises LedgerError."""
        if self.ledger is None:
            return None
        call = functools.partial(getattr(self.ledger, method), *args)
        return await asyncio.get_running_loop().run_in_executor(None, call)

    async def _record(self, log, method: str, *args) -> None:
        """Reconciliation goes on when the ledger cannot be written: the next one catches up."""
        try:
            await self.ledger_call(method, *args)
        except LedgerError as exc:
            log.warning("%s", exc)

    def pick_port(self, holder: str, first: int, last: int) -> int | None:
        """A port no other server of this hub uses. Ports are handed out in
        turn through the range, so a port freed by a stopped server (whose
        process may still be exiting) is not reused at once."""
        if holder in self.ports:
            return self.ports[holder]
        taken = set(self.ports.values())
        size = last - first + 1
        if self._next_port is None or not first <= self._next_port <= last:
            # A restarted hub starts somewhere else in the range than the last
            # one did, away from ports its stopped servers may still hold.
            self._next_port = random.randint(first, last)
        start = self._next_port
        for i in range(size):
            port = first + (start - first + i) % size
            if port not in taken:
                self.ports[holder] = port
                self._next_port = port + 1 if port < last else first
                return port
        return None  # every port of the range is taken

    def release(self, holder: str) -> Allocation | None:
        self.ports.pop(holder, None)
        self._pending.pop(holder, None)
        self.servers.pop(holder, None)
        return self.allocator.release(holder)

    def node_addr(self, hostname: str) -> str | None:
        node = self.nodes.get(hostname)
        return node.addr if node else None

    def hostname_of(self, node_id: str) -> str | None:
        for node in self.nodes.values():
            if node.id == node_id:
                return node.hostname
        return None

    # -- views for admins ------------------------------------------------------------

    def alloc_map(self) -> dict[str, dict[str, dict]]:
        """Every known device by host, with who holds it and how healthy it is:
        ``{host: {uuid: {model, allocated, health, problems, holders, ...}}}``."""
        holders: dict[str, list[dict]] = {}
        for holder, alloc in sorted(self.allocator.holdings().items()):
            user, server = self.servers.get(holder, (alloc.owner, ""))
            for gpu, share in zip(alloc.devices, alloc.shares):
                holders.setdefault(gpu.uuid, []).append({"user": user, "server": server, "share": float(share)})
        out: dict[str, dict[str, dict]] = {}
        for uuid, state in sorted(self.devices.items(), key=lambda kv: kv[1].gpu):
            gpu = state.gpu
            held = holders.get(uuid, [])
            problems = state.problems + ([self.stale[gpu.host]] if gpu.host in self.stale else [])
            health = "unhealthy" if not state.healthy else ("stale" if gpu.host in self.stale else "ok")
            out.setdefault(gpu.host, {})[uuid] = {
                "model": gpu.model,
                "index": gpu.index,
                "memory_mib": gpu.memory_mib,
                "allocated": round(sum(h["share"] for h in held), 6),
                "health": health,
                "problems": problems,
                "holders": held,
                "source": state.source,
                "temperature_c": state.temperature_c,
                "utilization_gpu": state.utilization_gpu,
            }
        return out

    def unhealthy_by_model(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for state in self.devices.values():
            if not state.healthy:
                counts[state.gpu.model] = counts.get(state.gpu.model, 0) + 1
        return counts
