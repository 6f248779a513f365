"""The cluster's views for admins, kept host by host: the allocation map, its
JSON, the /hub/gpus page's cards and the metrics' counts.

Each host's part is kept until that host changes: a report from its agent
(its readings; the metrics only count a change of its devices or their
health), a holding booked or given back on it (``Allocator.version``),
:meth:`ClusterViews.holders_changed`, or its staleness or availability. Who
holds a device is an input: :attr:`ClusterViews.holders_of`. What each part is
made of is :mod:`gpuspawner.cluster.host_views`' (pure).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Hashable, Mapping
from typing import Protocol

from ..allocator.allocator import Allocator
from ..core.sharing import UNIT
from . import host_views as views
from .devices import DeviceState
from .host_views import HoldersOf, HostCache, Maker

__all__ = ["ClusterViews", "Viewed"]

HOSTS_PER_STEP = 100  # the admin views check this many hosts, then let the event loop run other work


class Viewed(Protocol):
    """What the views read of the cluster."""

    @property
    def allocator(self) -> Allocator: ...

    @property
    def states(self) -> Mapping[str, Mapping[str, DeviceState]]: ...  # host -> uuid -> state, replaced at each reading

    @property
    def stale(self) -> Mapping[str, str]: ...  # host -> why its agent is late

    def is_available(self, host: str) -> bool: ...


class ClusterViews:
    """The admin views of one cluster (its ``views``)."""

    def __init__(self, cluster: Viewed, holders_of: HoldersOf | None = None):
        self.cluster = cluster
        self.allocator = cluster.allocator
        #: Who holds a device, as the map lists them (default: :meth:`allocator_holders`).
        self.holders_of: HoldersOf = holders_of or self.allocator_holders
        self._readings: dict[str, int] = {}  # host -> reports taken (its device states were replaced)
        self._health: dict[str, tuple] = {}  # host -> its devices and whether each is healthy
        self._health_changes: dict[str, int] = {}  # host -> changes of the above
        self._holder_changes: dict[str, int] = {}  # host -> holders_changed(host) calls
        self._holders_epoch = 0  # holders_changed() calls, and changes of holders_of
        self._holders_source: HoldersOf | None = None  # what made the holders kept below
        self._holders_kept: dict[str, tuple[Hashable, dict[str, list[dict]]]] = {}  # host -> (key, uuid -> holders)
        self.caches: dict[str, HostCache] = {}  # kind -> each host's part of that view

    def states_replaced(self, host: str, states: Mapping[str, DeviceState]) -> None:
        """The cluster took a reading of the host (its device states were replaced)."""
        self._readings[host] = self._readings.get(host, 0) + 1
        health = tuple((s.gpu, s.healthy) for s in states.values())
        if health != self._health.get(host):
            self._health[host] = health
            self._health_changes[host] = self._health_changes.get(host, 0) + 1

    def allocator_holders(self, uuid: str) -> list[dict]:
        """Who holds the device, as the allocation map lists them, by holder
        name: ``[{"user", "server", "share", ...}]``, from the allocator alone.
        The hub gives its own answer as :attr:`holders_of`; whoever
        changes it other than by booking or giving back devices in the
        allocator calls :meth:`holders_changed`."""
        allocator = self.allocator
        return [
            {"user": getattr(allocator.holding(h), "owner", ""), "server": "", "share": milli / UNIT}
            for h, milli in allocator.booked_on(uuid).items()
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
        for uuid in self.cluster.states.get(host, ()):
            held = holders_of(uuid)
            if held:
                holders[uuid] = held
        self._holders_kept[host] = (key, holders)
        return holders

    def _hosts_with_devices(self) -> list[str]:
        return sorted(host for host, states in self.cluster.states.items() if states)

    async def alloc_map_json(self, holders_of: HoldersOf | None = None) -> bytes:
        """Every known device by host, with who holds it and how healthy it is,
        as JSON: ``{host: {uuid: {model, allocated, health, problems, holders,
        ...}}}``, byte for byte what tornado's ``write`` makes of that map, from
        each host's part kept as JSON text (see :meth:`host_views`)."""
        return views.join_json(await self.host_views("json", views.host_json, holders_of))

    async def host_views(self, kind: str, make: Maker, holders_of: HoldersOf | None = None, inline: int = 16) -> list:
        """``make(host, entries, stale)`` for every host with devices, by hostname:
        ``entries`` the host's part of the map (see :meth:`alloc_map_json`) as dicts, ``stale`` why its
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
        cache = self.caches.get(kind)
        if cache is None or cache.maker != make:
            cache = self.caches[kind] = HostCache(make)
        out: list = []
        todo: list[tuple[int, str, tuple]] = []
        jobs = []
        for n, host in enumerate(self._hosts_with_devices(), 1):
            if n % HOSTS_PER_STEP == 0:
                await asyncio.sleep(0)
                if not self.cluster.states.get(host):
                    continue  # cannot happen today (a host's states are replaced, never removed)
            holders_key = self._holders_key(host)
            stale = self.cluster.stale.get(host)
            key = (self._readings.get(host, 0), stale, holders_key)
            found, value = cache.get(host, key)
            out.append(value)
            if not found:
                todo.append((len(out) - 1, host, key))
                jobs.append(
                    (
                        host,
                        tuple(self.cluster.states[host].values()),
                        self._holders(host, holders_key, holders_of),
                        stale,
                        self.allocator.topology(host),  # (it comes with each report: its readings key covers it)
                    )
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
        return [(host, self._host_counts(host, holders_of)) for host in self._hosts_with_devices()]

    async def warm_counts(self) -> None:
        """Make every host's counts now, giving way to other work every
        ``HOSTS_PER_STEP`` hosts: the hub does this at start, so that the first
        metrics scrape (which cannot give way) finds them made."""
        holders_of = self._holders_from(None)
        for n, host in enumerate(self._hosts_with_devices(), 1):
            if n % HOSTS_PER_STEP == 0:
                await asyncio.sleep(0)
            if self.cluster.states.get(host):
                self._host_counts(host, holders_of)

    def _host_counts(self, host: str, holders_of: HoldersOf) -> list[tuple[str, tuple]]:
        cache = self.caches.get("counts")
        if cache is None:
            cache = self.caches["counts"] = HostCache()
        holders_key = self._holders_key(host)
        stale, available = self.cluster.stale.get(host), self.cluster.is_available(host)
        key = (self._health_changes.get(host, 0), stale is not None, available, holders_key)
        found, rows = cache.get(host, key)
        if not found:
            holders = self._holders(host, holders_key, holders_of)
            rows = views.host_counts(views.host_entries(self.cluster.states[host].values(), holders, stale), available)
            cache.put(host, key, rows)
        return rows
