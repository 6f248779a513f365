"""The GPU cluster as the hub sees it: which devices exist, how healthy they
are, and which nodes may get servers.

It holds the nodes' last known status and the GPUs as the inventory sources
describe them (a static file, node agents' reports, an NVML probe in the hub
itself: see :mod:`gpuspawner.cluster.devices`), and feeds the allocator the
devices it may offer. Who holds which device is :mod:`gpuspawner.holdings.holdings`'
concern; it tells the admin views (:attr:`GPUCluster.views`, see
:mod:`gpuspawner.cluster.views`).

Only healthy devices on nodes that report in time are given to the
allocator; the others stay known here, with the reason, for admins.

A UUID belongs to one host at a time: the one the static inventory lists it
for, or else the one whose report named it first. Another host's report that
names it has that device left out, and only that device (see
:meth:`GPUCluster.receive`). It moves when the host that has it by its report
no longer names it, or is no longer a node of the swarm; a late agent is not
enough, so a leaked node token cannot take another node's devices.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable, Mapping

from ..allocator.allocator import AdoptProblem, Allocation, Allocator
from ..core.inventory import GPU
from ..core.labels import Held
from ..core.reports import Conflict, NodeReport, parse_report, report_uuids
from .devices import SOURCES, DeviceState, InventorySettings, host_states
from .host_views import HoldersOf
from .swarm import Node, Swarm, SwarmError
from .views import ClusterViews

__all__ = ["GPUCluster", "DeviceState", "SOURCES", "InventorySettings"]

NODES_MAX_AGE = 1.0  # seconds a node list is good for
NODES_PER_SECOND = 100  # figures of what other services reserve are kept a second per this many nodes
READ_WAIT = 0.25  # seconds a spawn waits for that read before it goes on with the last figures


def reservations_max_age(nodes: int) -> float:
    """Seconds the figures of what other services reserve are kept on a swarm of
    ``nodes``: a second up to NODES_PER_SECOND nodes, then a second more per as many
    (10 s at 1,000 nodes, where a read takes about a second: the event loop spends at
    most about a tenth of its time on them). By size, not by how long a read took: a
    read slowed by other Docker calls would keep old figures for long."""
    return max(NODES_MAX_AGE, nodes / NODES_PER_SECOND)


class GPUCluster:
    def __init__(self, settings: InventorySettings | Iterable[GPU] = (), holders_of: HoldersOf | None = None):
        if not isinstance(settings, InventorySettings):
            settings = InventorySettings(static=tuple(settings))
        self.settings = settings
        self.aliases: Mapping[str, str] = dict(settings.aliases)
        self.allocator = Allocator()
        self.nodes: dict[str, Node] = {}
        self.reports: dict[str, tuple[NodeReport, float]] = {}  # host -> (report, when received)
        self.states: dict[str, dict[str, DeviceState]] = {}  # host -> uuid -> every known device
        self._offered_by_host: dict[str, tuple[GPU, ...]] = {}  # host -> its healthy devices
        self.stale: dict[str, str] = {}  # host -> why its devices are not offered
        self._last_uuid: dict[tuple[str, int], str] = {}  # a lost GPU may no longer say its UUID
        # Who has each UUID, kept as reports come in (never rebuilt from all hosts).
        self._listed: dict[str, str] = {}  # uuid -> host, from the static inventory (when it is a source)
        self._owner: dict[str, str] = {}  # uuid -> host: listed for it, or named by its accepted report
        self._claims: dict[str, frozenset[str]] = {}  # host -> the UUIDs its accepted report named, less those moved
        self.conflicts: dict[str, dict[str, Conflict]] = {}  # refused host -> uuid -> who has it; replaced, not changed
        # host -> when (monotonic) a report naming it was last refused for its token, since
        # its last accepted one: its agent runs, and the hub refuses what it sends.
        self.refused: dict[str, float] = {}
        # Holdings found in the swarm on devices not offered yet, by service name.
        self.pending: dict[str, tuple[Held, tuple[int, int]]] = {}  # adopted, devices not offered yet
        self._offered = False  # the allocator has had a first inventory
        self.views = ClusterViews(self, holders_of)  # who holds a device: the hub's holdings say
        self._schedulable: set[str] | None = None
        self._reserved_at = -float("inf")  # when the nodes' reservations were last read (monotonic)
        self._reserved_read = False  # once: the first read is waited for to its end
        self._reading: asyncio.Future | None = None
        self.reserved_max_age = NODES_MAX_AGE  # seconds the last read's figures are good for
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

    def receive(self, report: NodeReport, now: float | None = None) -> tuple[Conflict, ...]:
        """Take a node's report. A host in the static inventory keeps its
        listed devices; its report then only says how healthy they are.
        Only this host is recomputed; the allocator is touched only when the
        set of devices it may offer changed.

        A UUID (of a GPU or a MIG device) that another host has, listed for it
        in the static inventory or named by its report, is left out with its
        device, and returned: the rest of the report is taken. Such a conflict
        is kept in :attr:`conflicts` (for doctor) until this host's report no
        longer names it, or the other host no longer has the UUID."""
        now = time.monotonic() if now is None else now
        host = report.hostname
        uuids = report_uuids(report)
        refused = sorted((u, o) for u in uuids if (o := self._owner.get(u, host)) != host)
        mine = uuids - {u for u, _ in refused}
        before = self._claims.get(host, frozenset())
        if mine != before:
            self._claim(host, before, mine)
        self._note_conflicts(host, refused)
        self.reports[host] = (report, now)
        self.refused.pop(host, None)
        self.allocator.set_host_topology(host, report.topology)  # (None: its agent did not say)
        changed = self._set_host(host)
        back = host in self.stale and self._check_stale(now)
        if changed or back:
            self._offer([host] if changed else [])
        return tuple(self.conflicts.get(host, {}).values())

    def _note_conflicts(self, host: str, refused: list[tuple[str, str]]) -> None:
        """Remember which UUIDs of the host's report another host has (first seen kept)."""
        if not refused:
            self.conflicts.pop(host, None)
            return
        wall = time.time()
        old = self.conflicts.get(host, {})
        records = {}
        for uuid, owner in refused:
            prev = old.get(uuid)
            since = prev.since if prev is not None and prev.owner == owner else wall
            records[uuid] = Conflict(host, uuid, owner, uuid in self._listed, since, wall)
        self.conflicts[host] = records

    def _claim(self, host: str, before: frozenset[str], uuids: frozenset[str]) -> None:
        """The index after the host's report naming ``uuids`` (``before``: its last one's) is accepted."""
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

    def _set_host(self, host: str) -> bool:
        """Recompute one host's devices; True when what it may offer changed."""
        states = self._host_states(host)
        offered = tuple(sorted(s.gpu for s in states.values() if s.healthy))
        # Replaced, never changed in place: the admin views may read a host's
        # states from a thread while the next report comes in.
        self.states[host] = states
        self.views.states_replaced(host, states)
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

    def last_reports(self) -> dict[str, NodeReport]:
        """Each host's latest report (without when it came)."""
        return {host: report for host, (report, _) in self.reports.items()}

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

    def _host_states(self, host: str) -> dict[str, DeviceState]:
        report = self.reports[host][0] if host in self.reports else None
        listed = host in self.static_hosts
        return host_states(host, self.settings, self.aliases, listed, report, self._owner, self._last_uuid, self.states)

    def report_refused(self, host: str, now: float | None = None) -> None:
        """A report naming ``host`` was refused for its token (none, not valid, or revoked or
        replaced: a rotated token whose node's file is not written yet). Only what the form
        and admins are told depends on it (:meth:`why_unavailable`): the report's hostname
        is its sender's word, and the host's devices are offered or not by its reports alone."""
        self.refused[host] = time.monotonic() if now is None else now

    def why_unavailable(self, host: str) -> str:
        """Why new servers may not go to ``host`` now: "swarm" (its node is down, drained or
        paused), "refused" (its agent is late because the hub refuses its reports: their
        token), "late" (its agent has not reported in time), or "" (it is available)."""
        if self._schedulable is not None and host not in self._schedulable:
            return "swarm"
        if host not in self.stale:
            return ""
        refused = self.refused.get(host)
        received = self.reports[host][1] if host in self.reports else None
        if refused is not None and (received is None or refused >= received):
            return "refused"
        return "late"

    def is_available(self, host: str) -> bool:
        """The node may get new servers: schedulable in the swarm, and its agent (if any) not late."""
        return (self._schedulable is None or host in self._schedulable) and host not in self.stale

    def _update_availability(self) -> None:
        if self._schedulable is None:
            hosts = None if not self.stale else set(self.allocator.hosts()) - set(self.stale)
        else:
            hosts = self._schedulable - set(self.stale)
        self.allocator.set_available_hosts(hosts)

    def adopt(
        self, name: str, claim: Held, reserved: tuple[int, int] = (0, 0)
    ) -> tuple[Allocation, list[AdoptProblem]]:
        """Book what a running service holds (its labels, read strictly; ``reserved``:
        the CPU thousandths and memory MiB its spec reserves). Devices not offered yet
        (an agent has not reported, or the device is unhealthy) are taken the moment
        they are, before any request can see them free."""
        alloc, problems = self.allocator.adopt(name, claim.user, claim.host, claim.uuids, claim.milli, *reserved)
        if len(alloc.devices) < len(claim.uuids):
            self.pending[name] = (claim, reserved)
        else:
            self.pending.pop(name, None)
        return alloc, problems

    def _adopt_pending(self) -> None:
        for name, (claim, reserved) in list(self.pending.items()):
            self.adopt(name, claim, reserved)

    async def _probe_local(self, log) -> None:
        """NVML in the hub's own process, at most once per interval."""
        from ..agent.errors import AgentError
        from ..agent.nvml import probe

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
                self._forget_gone(log)
                for n in nodes:
                    self.allocator.set_host_resources(n.hostname, n.cpu_milli, n.memory_mib)
            self.apply()
            self._update_availability()
            self._nodes_read = True

    async def read_reservations(self, swarm: Swarm, log: logging.Logger | logging.LoggerAdapter) -> None:
        """What the services running on each node reserve there, for the allocator
        (asked only for requests that reserve CPU or memory), when the figures are
        older than :attr:`reserved_max_age`: one read at a time, waited for up to
        READ_WAIT seconds (the first, until it ends); a read that takes longer goes
        on in the background and the caller goes on with the last figures. When it
        cannot be read, what was last read stays (could not find out is not "none
        reserved")."""
        if time.monotonic() - self._reserved_at < self.reserved_max_age:
            return
        if self._reading is None or self._reading.done():  # done: cancelled before it began
            self._reading = asyncio.ensure_future(self._read_reserved(swarm, log))
        # asyncio.wait neither cancels the read at its timeout nor when the caller is cancelled.
        await asyncio.wait([self._reading], timeout=READ_WAIT if self._reserved_read else None)

    @property
    def reading(self) -> asyncio.Future | None:
        """The read of the nodes' reservations under way, if any."""
        return self._reading

    async def _read_reserved(self, swarm: Swarm, log: logging.Logger | logging.LoggerAdapter) -> None:
        try:
            async with self._lock:
                try:
                    reserved = await swarm.reservations()
                except SwarmError as exc:
                    log.warning("What services reserve on the nodes could not be read (the last figures stay): %s", exc)
                    return
                except Exception:  # read in the background: nobody else would hear of it
                    log.exception("What services reserve on the nodes could not be read (the last figures stay)")
                    return
                self._reserved_at, self._reserved_read = time.monotonic(), True
                self.reserved_max_age = reservations_max_age(len(self.nodes))
                for hostname, n in self.nodes.items():
                    self.allocator.set_host_reserved(hostname, reserved.get(n.id, {}))
        finally:
            self._reading = None

    def _forget_gone(self, log: logging.Logger | logging.LoggerAdapter) -> None:
        """A host that is no longer a node of the swarm has no devices by its
        reports: a GPU that moved from it can be taken by its new node."""
        gone = [h for h in self._claims if h not in self.nodes and h != self.settings.local_host]
        for host in gone:
            log.info("%s is no longer a node of the swarm: its reported devices are forgotten", host)
            self._claim(host, self._claims[host], frozenset())
            del self._claims[host]
            self.reports.pop(host, None)
            self.conflicts.pop(host, None)
        if gone and self._offered:
            self._offer([h for h in gone if self._set_host(h)])

    def node_addr(self, hostname: str) -> str | None:
        node = self.nodes.get(hostname)
        return node.addr if node else None

    def hostname_of(self, node_id: str) -> str | None:
        for node in self.nodes.values():
            if node.id == node_id:
                return node.hostname
        return None
