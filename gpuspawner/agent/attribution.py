"""Whose are the compute processes on this node's GPUs: process → container → swarm service.

NVML lists each GPU's compute processes by PID (in the node's PID namespace). The
agent reads ``PROC/PID/cgroup`` (the node's /proc, mounted into the agent's
container) for the container ID, then asks the node's dockerd (its socket, mounted
read only; only ``GET /containers/ID/json`` is sent) for that container's labels,
which name the swarm service it belongs to. The hub trusts none of it: it takes the
service name only where that service holds the device, and reads who the holder is
from its own holdings (the service's ``gpuspawner.*`` labels)
(see :mod:`gpuspawner.reclaim.reclaimer`). A process that cannot be traced is reported with
no service ("unattributed"). Stdlib only: nodes run only the agent.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
from collections.abc import Callable

__all__ = ["Attributor", "DockerLabels", "container_id"]

SERVICE_LABEL = "com.docker.swarm.service.name"
# cgroup v1 and v2, cgroupfs or systemd driver: ".../docker/ID", ".../docker-ID.scope".
_CONTAINER_RE = re.compile(r"(?:^|/)(?:docker[-/])([0-9a-f]{64})(?:\.scope)?(?:/|$)")
MAX_CACHED = 1024  # containers remembered; a node runs far fewer at once
DOCKER_TIMEOUT_S = 2.0


def container_id(cgroup_text: str) -> str | None:
    """The Docker container ID in a /proc/PID/cgroup file; None when it is in none."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        m = _CONTAINER_RE.search(path)
        if m:
            return m.group(1)
    return None


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class DockerLabels:
    """A container's labels from the node's dockerd; None when it cannot say."""

    def __init__(self, socket_path: str, timeout: float = DOCKER_TIMEOUT_S):
        self.socket_path = socket_path
        self.timeout = timeout

    def __call__(self, cid: str) -> dict[str, str] | None:
        conn = _UnixHTTPConnection(self.socket_path, self.timeout)
        try:
            conn.request("GET", f"/containers/{cid}/json")
            resp = conn.getresponse()
            body = resp.read(1024 * 1024)
            if resp.status != 200:
                return None
            labels = (json.loads(body).get("Config") or {}).get("Labels") or {}
        except (OSError, ValueError, http.client.HTTPException, AttributeError):
            return None
        finally:
            conn.close()
        return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


class Attributor:
    """Adds ``holder`` (``{"service": NAME}``, or None) to each process of a
    report's devices. Containers are looked up once: their labels
    never change; a container that is gone leaves the cache after MAX_CACHED others."""

    def __init__(self, proc_root: str | os.PathLike, lookup: Callable[[str], dict[str, str] | None]):
        self.proc_root = str(proc_root)
        self.lookup = lookup
        self._labels: dict[str, dict[str, str] | None] = {}

    def holder(self, pid: int) -> dict[str, str] | None:
        # Plain open(): pathlib's objects and errors made the agent's memory creep for thousands of cycles.
        try:
            with open(f"{self.proc_root}/{int(pid)}/cgroup", "rb") as f:
                text = f.read(64 * 1024).decode("utf-8", "replace")
        except OSError:
            return None  # gone already, or /proc is not mounted
        cid = container_id(text)
        if cid is None:
            return None  # a process outside any container (e.g. on the node itself)
        if cid not in self._labels:
            labels = self.lookup(cid)
            if labels is None:
                return None  # dockerd could not say now: ask again next time
            if len(self._labels) >= MAX_CACHED:
                self._labels.pop(next(iter(self._labels)))
            self._labels[cid] = labels
        labels = self._labels[cid]
        service = (labels or {}).get(SERVICE_LABEL)
        return {"service": service} if service else None

    def attribute(self, report: dict) -> dict:
        """The report, each device's processes with their holder (None: unattributed)."""
        for dev in report.get("devices", ()):
            for proc in dev.get("processes", ()):
                proc["holder"] = self.holder(proc["pid"])
        return report
