"""Multi-GPU servers on the real test swarm get the best linked GPUs their node's agent
reports: gpu-a is a DGX-1 (V100s in the hybrid cube-mesh) and gpu-b a workstation with
NVLink-bridged pairs, each reported by gpuspawner-agent over the fake NVML.

Guards docs/topology.md: "A request for several GPUs of a host ... the split whose groups
are best linked in all is taken, and of it the best linked group", on real services, and
"GPUSPAWNER_GPU_NUMA_NODES"."""

from __future__ import annotations

import pytest

from devtools.fakenvml import topologies
from tests.integration.support import hub_with_agents, service_gpus, services_of, spawn_ready
from tests.integration.test_agents_on_nodes import alloc_map

DGX1, PAIRS = topologies.dgx1(), topologies.pcie_pairs()


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    work = tmp_path_factory.mktemp("topology")
    config = "c.GPUSwarmSpawner.max_gpus_per_user = 8\n"
    with hub_with_agents(swarm, work, {"gpu-a": DGX1, "gpu-b": PAIRS}, port_from=20200, extra_config=config) as (
        hub,
        _,
    ):
        yield hub


def uuids(devices: list[dict], *positions: int) -> list[str]:
    return [devices[i]["uuid"] for i in positions]


def test_pairs_of_v100s_get_two_nvlinks_and_a_pair_of_a6000s_its_bridge(hub, swarm):
    dgx = alloc_map(hub)["gpu-a"]
    assert dgx[DGX1[0]["uuid"]]["links"][DGX1[3]["uuid"]] == "2 NVLinks"
    for user, want in (("ann", (0, 3)), ("ben", (1, 2)), ("cal", (4, 7))):
        spawn_ready(hub, user, {"gpu_model": topologies.V100, "gpu_count": 2})
        [service] = services_of(swarm, user)
        assert service_gpus(service) == uuids(DGX1, *want), user
    spawn_ready(hub, "dee", {"gpu_model": topologies.RTX, "gpu_count": 2})
    [service] = services_of(swarm, "dee")
    assert service_gpus(service) == uuids(PAIRS, 0, 1)  # the bridged pair, on one socket
    env = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Env"]
    assert "GPUSPAWNER_GPU_NUMA_NODES=0,0" in env  # where they sit, for binding CPU threads near them
