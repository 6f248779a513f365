"""How the GPUs of one node talk to each other (pure values, no NVML).

For each pair of a node's GPUs: the PCIe path between them, as NVML's
``nvmlDeviceGetTopologyCommonAncestor`` classes it (the same board, one PCIe
switch, several switches, a host bridge, the same CPU, across CPUs), and how many
NVLinks join them. For each GPU: the NUMA node it sits on. What the node could not
find out stays unknown (None), never "no link": an unknown path scores as the
farthest, and is shown as unknown.

A pair's score is the one NVIDIA's device plugin allocator uses: 100 for each
NVLink, plus 60 on the same board, 50 behind one PCIe switch, 40 behind several,
30 through a host bridge, 20 on the same CPU and 10 across CPUs. A set's score is
the sum over its pairs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["NUMA_ENV", "NVLINK_SCORE", "Link", "Path", "Topology", "TopologyError", "numa_env", "parse_topology"]

NVLINK_SCORE = 100  # per NVLink between two GPUs


class Path(enum.IntEnum):
    """The PCIe path between two GPUs, nearest first (NVML's topology levels)."""

    BOARD = 0  # NVML_TOPOLOGY_INTERNAL: two GPUs of one board
    SWITCH = 10  # NVML_TOPOLOGY_SINGLE: one PCIe switch
    SWITCHES = 20  # NVML_TOPOLOGY_MULTIPLE: several PCIe switches, no host bridge
    BRIDGE = 30  # NVML_TOPOLOGY_HOSTBRIDGE: one host bridge
    CPU = 40  # NVML_TOPOLOGY_NODE: host bridges of one CPU (NUMA node)
    CROSS_CPU = 50  # NVML_TOPOLOGY_SYSTEM: across CPUs (QPI/UPI, SMP interconnect)

    @property
    def score(self) -> int:
        return 60 - self.value

    @property
    def words(self) -> str:
        return _WORDS[self]


_WORDS = {
    Path.BOARD: "same board",
    Path.SWITCH: "one PCIe switch",
    Path.SWITCHES: "several PCIe switches",
    Path.BRIDGE: "a host bridge",
    Path.CPU: "the same CPU",
    Path.CROSS_CPU: "across CPUs",
}


@dataclass(frozen=True)
class Link:
    """How two GPUs talk: their PCIe ``path`` and the ``nvlinks`` joining them (None: not known)."""

    path: Path | None = None
    nvlinks: int | None = None

    @property
    def score(self) -> int:
        return NVLINK_SCORE * (self.nvlinks or 0) + (self.path.score if self.path is not None else 0)

    @property
    def words(self) -> str:
        """E.g. "2 NVLinks", "one PCIe switch", "unknown"."""
        if self.nvlinks:
            return f"{self.nvlinks} NVLink{'s' if self.nvlinks > 1 else ''}"
        return self.path.words if self.path is not None else "unknown"


UNKNOWN = Link()


@dataclass(frozen=True)
class Topology:
    """One node's links between its GPUs (by UUID, each pair once, either order) and
    the NUMA node of each GPU where known."""

    links: Mapping[frozenset[str], Link] = field(default_factory=dict)
    numa: Mapping[str, int] = field(default_factory=dict)

    def link(self, a: str, b: str) -> Link:
        return self.links.get(frozenset((a, b)), UNKNOWN)

    def peers(self, uuid: str) -> list[str]:
        """The GPUs ``uuid`` has a link entry with, by UUID."""
        return sorted(u for pair in self.links if uuid in pair for u in pair if u != uuid)

    def score(self, a: str, b: str) -> int:
        return self.link(a, b).score

    def set_score(self, uuids: Iterable[str]) -> int:
        """The sum of the scores of every pair of ``uuids``."""
        us = list(uuids)
        return sum(self.score(a, b) for i, a in enumerate(us) for b in us[i + 1 :])

    def worst(self, uuids: Iterable[str]) -> Link | None:
        """The link of the set's farthest pair (None: fewer than two GPUs)."""
        us = list(uuids)
        pairs = [self.link(a, b) for i, a in enumerate(us) for b in us[i + 1 :]]
        return min(pairs, key=lambda link: link.score) if pairs else None


MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS: NVLinks one GPU has at most
MAX_NUMA_NODE = 1023


class TopologyError(ValueError):
    """A node's topology is malformed; the message names the field."""


def parse_topology(data: object, gpus: Iterable[str], where: str = "topology") -> Topology:
    """A report's ``{"links": [{"a", "b", "path", "nvlinks"}], "numa": {uuid: node}}``
    for the whole GPUs ``gpus`` of its node (``path``: NVML's topology level, 0 to
    50; ``nvlinks``: how many join the pair; either null where the node could not
    find out). Each pair once; raises :class:`TopologyError`."""
    known = set(gpus)
    if not isinstance(data, dict) or set(data) - {"links", "numa"}:
        raise TopologyError(f"{where}: expected an object with links and numa")
    raw_links, raw_numa = data.get("links", []), data.get("numa", {})
    most = len(known) * (len(known) - 1) // 2
    if not isinstance(raw_links, list) or len(raw_links) > most:
        raise TopologyError(f"{where}.links: expected a list of at most {most} pairs of this node's GPUs")
    links: dict[frozenset[str], Link] = {}
    for i, entry in enumerate(raw_links):
        at = f"{where}.links[{i}]"
        if not isinstance(entry, dict) or set(entry) - {"a", "b", "path", "nvlinks"}:
            raise TopologyError(f"{at}: expected an object with a, b, path and nvlinks")
        a, b, path, nvlinks = (entry.get(k) for k in ("a", "b", "path", "nvlinks"))
        if a not in known or b not in known or a == b:
            raise TopologyError(f"{at}: a and b are two GPUs of this node")
        pair = frozenset((a, b))
        if pair in links:
            raise TopologyError(f"{at}: {a} and {b} are listed twice")
        if path is not None and (isinstance(path, bool) or path not in {p.value for p in Path}):
            raise TopologyError(f"{at}.path: one of {sorted(p.value for p in Path)} (NVML's topology levels) or null")
        if nvlinks is not None and (
            isinstance(nvlinks, bool) or not isinstance(nvlinks, int) or not 0 <= nvlinks <= MAX_NVLINKS
        ):
            raise TopologyError(f"{at}.nvlinks: a whole number from 0 to {MAX_NVLINKS}, or null")
        links[pair] = Link(None if path is None else Path(path), nvlinks)
    if not isinstance(raw_numa, dict):
        raise TopologyError(f"{where}.numa: expected an object of GPU UUID to NUMA node")
    numa: dict[str, int] = {}
    for uuid, node in raw_numa.items():
        if uuid not in known or isinstance(node, bool) or not isinstance(node, int) or not 0 <= node <= MAX_NUMA_NODE:
            raise TopologyError(f"{where}.numa: a GPU of this node and a NUMA node from 0 to {MAX_NUMA_NODE}")
        numa[uuid] = node
    return Topology(links, numa)


NUMA_ENV = "GPUSPAWNER_GPU_NUMA_NODES"  # per device, in NVIDIA_VISIBLE_DEVICES order: "0,0"


def numa_env(topology: Topology | None, uuids: Iterable[str]) -> dict[str, str]:
    """What a server's env says of where its GPUs sit: each one's NUMA node, in the
    order of NVIDIA_VISIBLE_DEVICES (so a job can bind its CPU threads near them), when
    its node reported every one of them; nothing otherwise."""
    us = list(uuids)
    nodes = [None if topology is None else topology.numa.get(u) for u in us]
    if not us or None in nodes:
        return {}
    return {NUMA_ENV: ",".join(str(n) for n in nodes)}
