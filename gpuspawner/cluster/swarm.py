"""The one seam to the Docker Swarm API.

Every call runs in the spawner's executor (docker-py is blocking) and every
docker/requests error is translated here into :class:`SwarmError`, so the rest
of the package deals with plain records and one exception type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import docker.errors
import requests

__all__ = ["Node", "Swarm", "SwarmError", "TASK_FAILED", "TASK_WAITING", "spec_reservations"]

# Task states (docker/api/types/swarm TaskState).
TASK_WAITING = {"new", "allocated", "pending", "assigned", "accepted", "preparing", "ready", "starting"}
TASK_FAILED = {"failed", "rejected", "shutdown", "complete", "orphaned", "remove"}


class SwarmError(Exception):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status

    @property
    def not_found(self) -> bool:
        return self.status == 404


@dataclass(frozen=True)
class Node:
    id: str
    hostname: str
    addr: str  # the address the node advertises in the swarm
    ready: bool
    availability: str  # active, pause, drain
    generic_resources: tuple[str, ...] = ()  # kinds of swarm generic resources the node offers
    cpu_milli: int | None = None  # CPUs it has, in thousandths (None: it does not say)
    memory_mib: int | None = None  # memory it has, in MiB
    role: str = ""  # manager or worker
    labels: tuple[tuple[str, str], ...] = ()  # the node's labels (Spec.Labels), by name
    os: str = ""  # Description.Platform: what node.platform.* constraints name
    arch: str = ""

    @property
    def schedulable(self) -> bool:
        return self.ready and self.availability == "active"


class Swarm:
    """The swarm manager, through a docker.APIClient whose blocking calls run in
    ``executor``. Built from a ``connect()`` that returns both instead, it
    connects at its first call (off the event loop; a daemon that cannot be
    reached then is a SwarmError like any other)."""

    def __init__(self, client: Any, executor: Executor | None = None):
        if executor is None:
            self._connect: Callable[[], tuple[Any, Executor]] | None = client
            self.client: Any = None
        else:
            self._connect, self.client = None, client  # a docker.APIClient talking to a manager
        self.executor = executor

    async def _connected(self) -> tuple[Any, Executor | None]:
        if self._connect is not None:
            connect = self._connect
            try:
                client, executor = await asyncio.get_running_loop().run_in_executor(None, connect)
            except (requests.RequestException, docker.errors.DockerException, OSError) as exc:
                raise SwarmError(f"cannot reach the swarm manager: {exc}") from exc
            if self._connect is connect:  # not connected by another call meanwhile
                self.client, self.executor, self._connect = client, executor, None
        return self.client, self.executor

    async def _call(self, method: str, *args, **kwargs):
        client, executor = await self._connected()
        fn = getattr(client, method)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))
        except docker.errors.APIError as exc:
            status = exc.response.status_code if exc.response is not None else None
            raise SwarmError(f"swarm {method} failed: {exc.explanation or exc}", status) from exc
        except (requests.RequestException, docker.errors.DockerException, OSError) as exc:
            raise SwarmError(f"cannot reach the swarm manager for {method}: {exc}") from exc

    async def nodes(self) -> list[Node]:
        return [_node(n) for n in await self._call("nodes")]

    async def services(self, label: str) -> list[dict]:
        return await self._call("services", filters={"label": label})

    async def reservations(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Node ID -> service name -> (CPU thousandths, memory MiB) that its running
        tasks reserve on that node."""
        names = {s["ID"]: s.get("Spec", {}).get("Name", "") for s in await self._call("services")}
        found: dict[str, dict[str, tuple[int, int]]] = {}
        for task in await self._call("tasks", filters={"desired-state": "running"}):
            node, name = task.get("NodeID") or "", names.get(task.get("ServiceID", ""), "")
            reserved = (task.get("Spec", {}).get("Resources") or {}).get("Reservations") or {}
            cpu, mem = _amount(reserved.get("NanoCPUs"), 10**6), _amount(reserved.get("MemoryBytes"), 2**20)
            if node and (cpu or mem):
                had = found.setdefault(node, {}).get(name, (0, 0))
                found[node][name] = (had[0] + cpu, had[1] + mem)
        return found

    async def create_service(self, **kwargs) -> dict:
        return await self._call("create_service", **kwargs)

    async def remove_service(self, name_or_id: str) -> bool:
        """Remove a service; False when it was already gone."""
        try:
            await self._call("remove_service", name_or_id)
        except SwarmError as exc:
            if exc.not_found:
                return False
            raise
        return True

    async def wait_tasks_ended(self, task_ids: list[str], timeout: float) -> bool:
        """Wait until these tasks' containers have exited (the tasks are gone
        or in a final state). False if some still run after ``timeout`` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while task_ids:
            tasks = await self._call("tasks", filters={"id": task_ids})
            if all(t.get("Status", {}).get("State") in TASK_FAILED for t in tasks):
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.2)
        return True

    async def service(self, name: str) -> dict:
        return await self._call("inspect_service", name)

    async def image_command(self, image: str) -> list[str]:
        """The image's own command (its Cmd), for servers without ``cmd``."""
        return list((await self._call("inspect_image", image)).get("Config", {}).get("Cmd") or [])

    async def tasks(self, service: str) -> list[dict]:
        """The service's tasks, newest first."""
        tasks = await self._call("tasks", filters={"service": service})
        return sorted(tasks, key=lambda t: t.get("CreatedAt", ""), reverse=True)


def spec_reservations(spec: dict) -> tuple[int, int]:
    """(CPU thousandths, memory MiB) a service's spec reserves for its task."""
    reserved = ((spec.get("TaskTemplate") or {}).get("Resources") or {}).get("Reservations") or {}
    return _amount(reserved.get("NanoCPUs"), 10**6), _amount(reserved.get("MemoryBytes"), 2**20)


def _amount(value: object, unit: int) -> int:
    """A count of the daemon's (nano-CPUs, bytes) in ``unit``s, rounded up; 0 for anything else."""
    return -(-value // unit) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _node(raw: dict) -> Node:
    status = raw.get("Status", {})
    resources = raw.get("Description", {}).get("Resources", {}) or {}
    spec = raw.get("Spec", {})
    addr = status.get("Addr", "")
    if addr in ("", "0.0.0.0"):
        # Some managers report 0.0.0.0; their manager address is the real one.
        addr = raw.get("ManagerStatus", {}).get("Addr", "").rsplit(":", 1)[0]
    return Node(
        id=raw["ID"],
        hostname=raw.get("Description", {}).get("Hostname", ""),
        addr=addr,
        ready=status.get("State") == "ready",
        availability=spec.get("Availability", "active"),
        generic_resources=tuple(
            sorted(
                {
                    kind
                    for r in raw.get("Description", {}).get("Resources", {}).get("GenericResources") or []
                    for v in r.values()
                    if isinstance(v, dict) and (kind := v.get("Kind"))
                }
            )
        ),
        role=spec.get("Role", ""),
        labels=tuple(sorted((str(k), str(v)) for k, v in (spec.get("Labels") or {}).items())),
        os=raw.get("Description", {}).get("Platform", {}).get("OS", ""),
        arch=raw.get("Description", {}).get("Platform", {}).get("Architecture", ""),
        # What the node has: rounded down (a reservation rounds up), None when not said.
        cpu_milli=_amount(resources.get("NanoCPUs"), 1) // 10**6 or None,
        memory_mib=_amount(resources.get("MemoryBytes"), 1) // 2**20 or None,
    )
