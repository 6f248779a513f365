"""Process-wide state of the GPU cluster, shared by every spawner of a hub.

JupyterHub drops a Spawner object after each stop, so what must outlive one
server lives here: the allocator (who holds which device), the ports taken by
host-network servers, and the nodes' last known status. At first use it is
rebuilt from the labels of the services the swarm actually runs, so a
restarted hub neither forgets a running server's GPUs nor hands them out twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Callable, Iterable

from .allocator import Allocation, Allocator
from .inventory import GPU
from .service_spec import LABEL, holding_from_labels
from .swarm import Node, Swarm

__all__ = ["GPUCluster"]


class GPUCluster:
    _shared: dict[str, "GPUCluster"] = {}

    @classmethod
    def shared(cls, key: object, load: Callable[[], Iterable[GPU]]) -> "GPUCluster":
        """The one instance for this inventory in this process (spawners that
        differ in policy still share one allocator); ``load`` reads the
        inventory the first time only."""
        k = json.dumps(key, sort_keys=True, default=str)
        if k not in cls._shared:
            cls._shared[k] = cls(load())
        return cls._shared[k]

    def __init__(self, gpus: Iterable[GPU]):
        self.allocator = Allocator(gpus)
        self.nodes: dict[str, Node] = {}
        self.ports: dict[str, int] = {}  # holder -> port, for host networking
        self._next_port: int | None = None
        self._rebuilt = False
        self._lock = asyncio.Lock()

    async def refresh(self, swarm: Swarm, log: logging.Logger | logging.LoggerAdapter) -> None:
        """Take node status from the swarm; on first use, rebuild holdings."""
        async with self._lock:
            nodes = await swarm.nodes()
            self.nodes = {n.hostname: n for n in nodes}
            self.allocator.set_available_hosts(n.hostname for n in nodes if n.schedulable)
            if not self._rebuilt:
                await self._rebuild(swarm, log)
                self._rebuilt = True

    async def _rebuild(self, swarm: Swarm, log) -> None:
        services = await swarm.services(f"{LABEL}.devices")
        held = 0
        for service in services:
            spec = service.get("Spec", {})
            holding = holding_from_labels(spec.get("Labels") or {})
            name = spec.get("Name", "")
            if holding is None or not name:
                continue
            if holding.port is not None:
                self.ports[name] = holding.port
            if holding.uuids:
                alloc, problems = self.allocator.adopt(name, holding.user, holding.host, holding.uuids)
                held += len(alloc.devices)
                for problem in problems:
                    log.warning("Service %s: %s", name, problem)
        log.info("GPU allocations rebuilt from the swarm: %d services, %d devices held", len(services), held)

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
        return self.allocator.release(holder)

    def node_addr(self, hostname: str) -> str | None:
        node = self.nodes.get(hostname)
        return node.addr if node else None

    def hostname_of(self, node_id: str) -> str | None:
        for node in self.nodes.values():
            if node.id == node_id:
                return node.hostname
        return None
