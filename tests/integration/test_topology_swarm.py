"""Multi-GPU servers on the real test swarm get the best linked GPUs their node's agent
reports: gpu-a is a DGX-1 (V100s in the hybrid cube-mesh) and gpu-b a workstation with
NVLink-bridged pairs, each reported by gpuspawner-agent over the fake NVML.

Guards docs/topology.md: "A request for several GPUs of a host ... the split whose groups
are best linked in all is taken, and of it the best linked group", on real services, and
"GPUSPAWNER_GPU_NUMA_NODES"."""

from __future__ import annotations

import pytest

from devtools import agent_stack, fakenvml
from devtools.fakenvml import topologies
from tests.integration.support import hub_on, service_gpus, services_of, spawn_ready, wait_until

DGX1, PAIRS = topologies.dgx1(), topologies.pcie_pairs()


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    work = tmp_path_factory.mktemp("topology")
    lib_dir = fakenvml.build(work / "lib").parent
    gpus = work / "gpus"
    gpus.mkdir()
    fakenvml.write_devices(gpus / "gpu-a.txt", DGX1)
    fakenvml.write_devices(gpus / "gpu-b.txt", PAIRS)
    env = {"GPUSPAWNER_INVENTORY_SOURCE": "agent"}
    config = "c.GPUSwarmSpawner.max_gpus_per_user = 8\n"
    with hub_on(swarm, work / "hub", port_from=20200, extra_config=config, env=env) as hub:
        tokens = {h: hub.api("POST", f"/gpuspawner/agent-tokens/{h}").json()["token"] for h in ("gpu-a", "gpu-b")}
        agent_stack.write_tokens(work / "tokens", tokens)
        hub_api = f"http://{swarm.manager_addr}:{hub.port + 81}/"
        stack = agent_stack.local_stack(
            hub_api, lib_dir, str(gpus / "{{.Node.Hostname}}.txt"), swarm.image, work / "tokens", interval=1.0
        )
        with agent_stack.deployed(swarm, stack, {"gpu-a": "true", "gpu-b": "true"}, work):
            wait_until(lambda: set(alloc_map(hub)) == {"gpu-a", "gpu-b"}, "the agents did not report", timeout=90)
            yield hub


def alloc_map(hub) -> dict:
    return hub.api("GET", "/gpuspawner/alloc-map").json()


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
