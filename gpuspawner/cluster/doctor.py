"""Known misconfigurations of a GPU swarm, found from what the hub already
knows (the swarm's nodes, the static inventory, the agents' reports), each with
how to fix it. Pure: the hub endpoint and ``gpuspawner doctor`` feed it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from ..core.enforcement import missing
from ..core.inventory import GPU
from ..core.reports import Conflict, NodeReport, gpus_of
from .service_spec import enforcement_mode
from .swarm import Node

__all__ = ["Finding", "diagnose", "enforcement_gaps"]


@dataclass(frozen=True)
class Finding:
    severity: str  # "error": servers get the wrong GPUs or none; "warning": worth a look
    host: str
    problem: str
    fix: str

    def as_dict(self) -> dict:
        return asdict(self)


def diagnose(
    nodes: Iterable[Node],
    static: Iterable[GPU],
    reports: Mapping[str, NodeReport],
    stale: Mapping[str, str],
    sources: Iterable[str],
    aliases: Mapping[str, str] | None = None,
    foreign: Mapping[str, str] | None = None,
    conflicts: Iterable[Conflict] = (),
    shared_token: bool = False,
    enforcement: str | Mapping[str, str] = "none",
) -> list[Finding]:
    """``foreign``: labelled services the hub does not take as its servers, with why;
    ``conflicts``: UUIDs left out of reports because another host has them;
    ``shared_token``: whether ``agent_shared_token`` is on; ``enforcement``:
    ``gpu_share_enforcement``."""
    nodes = {n.hostname: n for n in nodes}
    static = list(static) if "static" in set(sources) else []
    out = [
        *_node_findings(nodes),
        *_report_findings(reports, nodes),
        *_stale_findings(stale),
        *_inventory_findings(static, reports, nodes, aliases),
        *_conflict_findings(conflicts),
        *_foreign_findings(foreign or {}),
        *_enforcement_findings(enforcement, reports),
    ]
    if shared_token:
        out.append(
            Finding(
                "warning",
                "",
                "agent_shared_token is on: the agents' shared token can report for any node, "
                "so whoever has it can mark every node's GPUs unhealthy or absent",
                "issue each node its own token (gpuspawner agent-token HOST, see docs/agent.md), "
                "then set c.GPUSwarmSpawner.agent_shared_token = False",
            )
        )
    if not static and not reports:
        out.append(
            Finding(
                "warning",
                "",
                "no GPU is known: no static inventory and no agent report",
                "set gpu_inventory, or run gpuspawner-agent on the GPU nodes (see docs/agent.md)",
            )
        )
    return out


def _node_findings(nodes: Mapping[str, Node]) -> Iterator[Finding]:
    """Swarm nodes configured in a way that gives servers other GPUs."""
    for host, node in sorted(nodes.items()):
        gpu_kinds = [k for k in node.generic_resources if "gpu" in k.lower()]
        if gpu_kinds:
            yield Finding(
                "error",
                host,
                f"swarm generic resources for GPUs are configured ({', '.join(gpu_kinds)}): the NVIDIA runtime "
                "then takes DOCKER_RESOURCE_* over NVIDIA_VISIBLE_DEVICES, so servers may get other GPUs",
                "remove node-generic-resources (and swarm-resource in the NVIDIA runtime config) from the "
                "node's daemon.json, and restart dockerd",
            )


def _report_findings(reports: Mapping[str, NodeReport], nodes: Mapping[str, Node]) -> Iterator[Finding]:
    """What the agents' reports say about their nodes' dockerd, and reports from no node."""
    for host, report in sorted(reports.items()):
        runtime = report.docker_default_runtime
        if report.devices and runtime is not None and runtime != "nvidia":
            yield Finding(
                "error",
                host,
                f"the agent sees {len(report.devices)} GPU(s) but dockerd's default runtime is {runtime!r}: "
                "servers there get no GPU whatever NVIDIA_VISIBLE_DEVICES says",
                'set "default-runtime": "nvidia" in /etc/docker/daemon.json (with the NVIDIA Container '
                "Toolkit installed) and restart dockerd",
            )
        if host not in nodes:
            yield Finding(
                "warning",
                host,
                "an agent reports from a host that is not a node of this swarm",
                "run the agent with --hostname set to the node's swarm hostname",
            )


def enforcement_gaps(enforcement: str | Mapping[str, str], reports: Mapping[str, NodeReport]) -> dict[str, str]:
    """The hosts whose agent found missing what their ``gpu_share_enforcement`` mode
    needs, each with a sentence for admins (doctor, the /hub/gpus page)."""
    gaps = {}
    for host, report in sorted(reports.items()):
        mode = enforcement_mode(enforcement, host)
        why = missing(mode, report.enforcement)
        if why is not None:
            gaps[host] = f"shares are set to be enforced with {mode}, but {why}"
    return gaps


def _enforcement_findings(enforcement: str | Mapping[str, str], reports: Mapping[str, NodeReport]) -> Iterator[Finding]:
    for host, why in enforcement_gaps(enforcement, reports).items():
        yield Finding(
            "error",
            host,
            f"{why}: a share there is a booking only, and one process can take the whole GPU",
            "start what enforces shares on the node (docs/sharing.md); if it is there, let the agent see it "
            "(mount it into the agent's container: --mps-pipe-dir, --hami-library, docs/agent.md); "
            "or set the node's gpu_share_enforcement to none",
        )


def _stale_findings(stale: Mapping[str, str]) -> Iterator[Finding]:
    for host, why in sorted(stale.items()):
        yield Finding(
            "warning",
            host,
            f"its GPUs are not offered: {why}",
            "check that gpuspawner-agent runs there and reaches the hub",
        )


def _inventory_findings(
    static: list[GPU],
    reports: Mapping[str, NodeReport],
    nodes: Mapping[str, Node],
    aliases: Mapping[str, str] | None,
) -> Iterator[Finding]:
    """Hosts of the static inventory that are no node, and where it and the agent disagree."""
    listed: dict[str, dict[str, GPU]] = {}
    for gpu in static:
        listed.setdefault(gpu.host, {})[gpu.uuid] = gpu
    for host, gpus in sorted(listed.items()):
        if host not in nodes:
            yield Finding(
                "error",
                host,
                "the GPU inventory lists this host, but it is not a node of this swarm",
                "fix the hostname in the inventory (it must be the node's swarm hostname)",
            )
        report = reports.get(host)
        if report is not None:
            yield from _inventory_against_report(host, gpus, {g.uuid: g for g, _ in gpus_of(report, aliases)})


def _inventory_against_report(host: str, listed: Mapping[str, GPU], seen: Mapping[str, GPU]) -> Iterator[Finding]:
    """The GPUs the inventory lists on ``host`` against those its agent sees, by UUID."""
    for uuid in sorted(listed.keys() - seen.keys()):
        yield Finding(
            "error",
            host,
            f"the inventory lists {uuid}, but the node's agent does not see it",
            "remove it from the inventory, or check the GPU (nvidia-smi -L)",
        )
    for uuid in sorted(seen.keys() - listed.keys()):
        yield Finding(
            "warning",
            host,
            f"the agent sees {uuid} ({seen[uuid].model}), not in the inventory",
            "add it to the inventory, or drop 'static' for this host and let the agent report it",
        )
    for uuid in sorted(listed.keys() & seen.keys()):
        if listed[uuid].model != seen[uuid].model:
            yield Finding(
                "warning",
                host,
                f"{uuid} is listed as {listed[uuid].model!r} but NVML names it {seen[uuid].model!r}",
                "use NVML's name in the inventory, or give it a friendlier one with gpu_model_aliases",
            )


def _conflict_findings(conflicts: Iterable[Conflict]) -> Iterator[Finding]:
    for c in conflicts:
        since = datetime.fromtimestamp(c.since, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        yield Finding(
            "error",
            c.host,
            f"its agent's reports name a device another node has, left out since {since}: {c.sentence()}",
            "the same UUID on two nodes: a copied inventory or a spoofed agent; check nvidia-smi -L on both",
        )


def _foreign_findings(foreign: Mapping[str, str]) -> Iterator[Finding]:
    for service, why in sorted(foreign.items()):
        yield Finding(
            "warning",
            service,
            f"a service labelled as a gpuspawner server is not one: {why}",
            "remove it (docker service rm) if nothing needs it; the hub leaves it alone",
        )
