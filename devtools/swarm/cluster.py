"""The cluster as the harness records it: its nodes (hostname, address, daemon socket,
role, network namespace) and clients for their daemons."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import docker

from . import engine
from .errors import HarnessError
from .images import TEST_IMAGE

NODE_HOSTNAME_TIMEOUT = 30.0  # hostname_of(): a node that just joined has no description yet


@dataclasses.dataclass
class Node:
    hostname: str
    addr: str
    docker_url: str
    role: str  # "manager" or "worker"
    netns: str | None = None  # None: the host's network namespace (the manager)

    @property
    def socket_path(self) -> str:
        if not self.docker_url.startswith("unix://"):
            raise ValueError(f"not a unix socket URL: {self.docker_url}")
        return self.docker_url[len("unix://") :]

    def client(self, timeout: float = 60) -> docker.DockerClient:
        """A ``docker.DockerClient`` for this node's daemon; close it when done."""
        return engine.client(self.docker_url, timeout)


@dataclasses.dataclass
class Cluster:
    state_dir: Path
    run_dir: Path
    manager_url: str
    manager_addr: str
    nodes: dict[str, Node]
    image: str = TEST_IMAGE

    @property
    def manager(self) -> Node:
        return next(n for n in self.nodes.values() if n.role == "manager")

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.role == "worker"]

    def node(self, hostname: str | None = None) -> Node:
        return self.manager if hostname is None else self.nodes[hostname]

    def docker_url(self, hostname: str | None = None) -> str:
        return self.node(hostname).docker_url

    def client(self, hostname: str | None = None, timeout: float = 60) -> docker.DockerClient:
        """``docker.DockerClient`` for a node's daemon (default: the manager)."""
        return self.node(hostname).client(timeout=timeout)

    def hostname_of(self, node_id: str, timeout: float = NODE_HOSTNAME_TIMEOUT) -> str:
        """Swarm node ID -> hostname.

        A node that has just joined is listed before its agent has reported its
        description: wait (at most ``timeout`` s) for the hostname. An ID the swarm does
        not know (any more) raises ``HarnessError``."""
        with engine.connected(self.manager_url) as c:
            return wait_node_hostname(c, node_id, timeout)

    def env(self) -> dict[str, str]:
        """Environment for the docker CLI / SDK pointing at the manager."""
        return {"DOCKER_HOST": self.manager_url}

    def to_json(self) -> dict[str, Any]:
        return {
            "state_dir": str(self.state_dir),
            "run_dir": str(self.run_dir),
            "manager_url": self.manager_url,
            "manager_addr": self.manager_addr,
            "image": self.image,
            "nodes": {h: dataclasses.asdict(n) for h, n in self.nodes.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cluster:
        return cls(
            state_dir=Path(data["state_dir"]),
            run_dir=Path(data["run_dir"]),
            manager_url=data["manager_url"],
            manager_addr=data["manager_addr"],
            image=data.get("image", TEST_IMAGE),
            nodes={h: Node(**n) for h, n in data["nodes"].items()},
        )


def daemon_name(node: Node) -> str:
    """The name of a node's files: "manager", or the worker's hostname."""
    return "manager" if node.role == "manager" else node.hostname


def node_hostname(node: dict[str, Any]) -> str | None:
    """Hostname of a swarm node object; None while the node hasn't reported it yet."""
    return ((node.get("Description") or {}).get("Hostname")) or None


def wait_node_hostname(c: docker.DockerClient, node_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            node = c.nodes.get(node_id).attrs
        except docker.errors.NotFound as e:
            raise HarnessError(f"swarm node {node_id} is not in the swarm (any more): {e.explanation}") from e
        except engine.ENGINE_ERRORS as e:
            raise HarnessError(f"asking the manager for swarm node {node_id}: {engine.describe(e)}") from e
        host = node_hostname(node)
        if host:
            return host
        if time.monotonic() >= deadline:
            state = (node.get("Status") or {}).get("State", "unknown")
            raise HarnessError(f"swarm node {node_id} ({state}) did not report its hostname within {timeout:.0f}s")
        time.sleep(0.2)
