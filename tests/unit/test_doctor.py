"""gpuspawner doctor's checks over plain data (pure)."""

from __future__ import annotations

import json

from gpuspawner.cluster.doctor import diagnose
from gpuspawner.cluster.swarm import Node
from gpuspawner.core.inventory import GPU
from gpuspawner.core.reports import parse_report
from tests.unit.test_reports import A100, device, report


def node(host, kinds=()):
    return Node(id=host, hostname=host, addr="10.0.0.1", ready=True, availability="active", generic_resources=kinds)


def parsed(body) -> dict:
    r = parse_report(json.dumps(body))
    return {r.hostname: r}


def problems(findings):
    return [(f.severity, f.host, f.problem.split(":")[0]) for f in findings]


def test_a_clean_cluster_has_no_findings():
    reports = parsed({**report(device(0, "GPU-b0")), "docker_default_runtime": "nvidia"})
    static = [GPU("gpu-b", 0, "GPU-b0", A100, 81920)]
    assert diagnose([node("gpu-a"), node("gpu-b")], static, reports, {}, ["static", "agent"]) == []


def test_generic_gpu_resources_are_an_error_with_the_fix():
    """Guards docs/admin.md, "The admin's tools: allocation map, usage, health": "doctor checks for:
    swarm generic GPU resources on a node"."""
    (f,) = diagnose(
        [node("gpu-a", ("NVIDIA-GPU",)), node("gpu-b", ("ssd",))],
        [GPU("gpu-a", 0, "GPU-a0", "x", 1)],
        {},
        {},
        ["static"],
    )
    assert (f.severity, f.host) == ("error", "gpu-a") and "NVIDIA-GPU" in f.problem
    assert "node-generic-resources" in f.fix


def test_gpus_without_the_nvidia_default_runtime_are_an_error():
    """Guards docs/admin.md, "The admin's tools: allocation map, usage, health": "GPUs on a node whose
    dockerd default runtime is not nvidia"."""
    reports = parsed({**report(device(0, "GPU-b0")), "docker_default_runtime": "runc"})
    (f,) = diagnose([node("gpu-b")], [], reports, {}, ["agent"])
    assert f.severity == "error" and "'runc'" in f.problem and '"default-runtime": "nvidia"' in f.fix
    unknown = parsed(report(device(0, "GPU-b0")))  # no daemon.json readable: not judged
    assert diagnose([node("gpu-b")], [], unknown, {}, ["agent"]) == []


def test_inventory_disagreeing_with_the_nodes():
    """Guards docs/admin.md, "The admin's tools: allocation map, usage, health": "inventory hosts that
    are not swarm nodes, and listed devices the node's agent does not see (or the other way round,
    or under another name)"."""
    static = [
        GPU("gpu-b", 0, "GPU-b0", "A100 (old name)", 81920),
        GPU("gpu-b", 1, "GPU-gone", A100, 81920),
        GPU("gpu-z", 0, "GPU-z0", A100, 81920),
    ]
    reports = parsed(report(device(0, "GPU-b0"), device(2, "GPU-new")))
    found = problems(diagnose([node("gpu-b")], static, reports, {}, ["static", "agent"]))
    assert ("error", "gpu-z", "the GPU inventory lists this host, but it is not a node of this swarm") in found
    assert ("error", "gpu-b", "the inventory lists GPU-gone, but the node's agent does not see it") in found
    assert ("warning", "gpu-b", f"the agent sees GPU-new ({A100}), not in the inventory") in found
    assert ("warning", "gpu-b", f"GPU-b0 is listed as 'A100 (old name)' but NVML names it {A100!r}") in found


def test_stale_agents_and_an_empty_cluster_are_warnings():
    """Guards docs/admin.md, "The admin's tools: allocation map, usage, health": "agents that stopped
    reporting"."""
    found = diagnose([node("gpu-a")], [], {}, {"gpu-a": "no report from its agent for 50 s"}, ["agent"])
    assert [(f.severity, f.host) for f in found] == [("warning", "gpu-a"), ("warning", "")]


def test_a_report_naming_another_nodes_uuid_is_an_error_with_the_fix():
    from gpuspawner.core.reports import Conflict

    refused = Conflict("gpu-a", "GPU-b0", "gpu-b", True, since=0.0, last=5.0)
    (f,) = diagnose(
        [node("gpu-a"), node("gpu-b")],
        [GPU("gpu-b", 0, "GPU-b0", A100, 81920)],
        {},
        {},
        ["static"],
        conflicts=[refused],
    )
    assert (f.severity, f.host) == ("error", "gpu-a")
    assert f.problem == (
        "its agent's reports name a device another node has, left out since 1970-01-01T00:00:00Z: "
        "GPU-b0 is on gpu-b (in the static inventory), not on gpu-a"
    )
    assert f.fix == "the same UUID on two nodes: a copied inventory or a spoofed agent; check nvidia-smi -L on both"


def test_the_shared_agent_token_is_a_warning_while_allowed():
    """Guards docs/admin.md, "The admin's tools: allocation map, usage, health": "agent_shared_token
    left on (any holder of the shared token can report for every node)"."""
    assert diagnose([node("gpu-a")], [GPU("gpu-a", 0, "GPU-a0", A100, 1)], {}, {}, ["static"]) == []
    (f,) = diagnose([node("gpu-a")], [GPU("gpu-a", 0, "GPU-a0", A100, 1)], {}, {}, ["static"], shared_token=True)
    assert f.severity == "warning" and "agent_shared_token is on" in f.problem
    assert "agent_shared_token = False" in f.fix
