"""Admin settings cannot undo gpuspawner's guarantees, on the real swarm: with
the admin's own task spec, container env, placement and labels, every GPU
server still runs on its host with exactly its GPUs, and every CPU-only server
sees none (read from the containers themselves); the NVIDIA_* env that cannot
add a device reaches the containers. A setting that can only conflict (a node
pin, device env, swarm generic resources, a mount of GPU device nodes) stops the
hub at start with one line.

Guards docs/security.md, "An admin (of JupyterHub, or its configuration)": "undo gpuspawner's
guarantees through environment, extra_container_spec, extra_task_spec"."""

from __future__ import annotations

import pytest

from devtools.hub import HubError
from tests.integration.support import hub_on, services_of, spawn_ready
from tests.integration.test_spawner_swarm import UUIDS, container_env, running_node

A100 = "NVIDIA A100 80GB PCIe"
HARMLESS = {"NVIDIA_REQUIRE_CUDA": "cuda>=11.0", "NVIDIA_DRIVER_CAPABILITIES": "all"}
ADMIN = (
    f"HARMLESS = {HARMLESS!r}\n"
    + """
from docker.types import ContainerSpec
c.GPUSwarmSpawner.extra_task_spec = {
    "container_spec": ContainerSpec(image=c.GPUSwarmSpawner.image, env={"ADMIN_TASK_ENV": "1"}),
    "placement": ["node.platform.os==linux"],
    "restart_policy": {"condition": "none"},
}
c.GPUSwarmSpawner.extra_container_spec = {"env": {"ADMIN_CONTAINER_ENV": "1", **HARMLESS}}
c.GPUSwarmSpawner.extra_placement_spec = {"constraints": ["node.platform.os!=windows"]}
c.GPUSwarmSpawner.extra_create_kwargs = {"labels": {"team": "ml"}}
"""
)


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    with hub_on(swarm, tmp_path_factory.mktemp("hub"), port_from=21500, extra_config=ADMIN) as h:
        yield h


def test_admin_task_spec_and_env_keep_gpu_servers_on_their_host_and_cpu_servers_blind(hub, swarm):
    """Guards docs/security.md, "A user's server": "gpuspawner sets the variable last, over the admin's
    environment, extra_container_spec and extra_task_spec".

    Guards docs/how-it-works.md, "What admin settings cannot change": "NVIDIA_VISIBLE_DEVICES is the
    server's UUIDs, or void for a CPU-only server"."""
    spawn_ready(hub, "alice", {"gpu_model": A100})
    spawn_ready(hub, "bob", {})
    (gpu,), (cpu,) = services_of(swarm, "alice"), services_of(swarm, "bob")
    spec = gpu.attrs["Spec"]
    assert "node.hostname==gpu-b" in spec["TaskTemplate"]["Placement"]["Constraints"]
    assert spec["TaskTemplate"]["RestartPolicy"]["Condition"] == "none" and spec["Labels"]["team"] == "ml"
    assert running_node(swarm, gpu) == "gpu-b"
    env = container_env(swarm, "gpu-b", gpu)
    assert env["NVIDIA_VISIBLE_DEVICES"] in UUIDS["gpu-b"]
    assert env["ADMIN_TASK_ENV"] == "1" and env["ADMIN_CONTAINER_ENV"] == "1"
    # the harmless NVIDIA_* env is the admin's, but on a GPU server nvidia_driver_capabilities wins
    assert (env["NVIDIA_REQUIRE_CUDA"], env["NVIDIA_DRIVER_CAPABILITIES"]) == ("cuda>=11.0", "compute,utility")
    cpu_env = container_env(swarm, running_node(swarm, cpu), cpu)
    assert cpu_env["NVIDIA_VISIBLE_DEVICES"] == "void" and cpu_env["ADMIN_TASK_ENV"] == "1"
    assert {k: cpu_env[k] for k in HARMLESS} == HARMLESS
    hub.stop_server("alice")
    hub.stop_server("bob")


@pytest.mark.parametrize(
    "line",
    [
        'c.Spawner.environment = {"NVIDIA_VISIBLE_DEVICES": "all"}',
        'c.GPUSwarmSpawner.extra_placement_spec = {"constraints": ["node.hostname==gpu-a"]}',
        'c.SwarmSpawner.extra_resources_spec = {"generic_resources": {"NVIDIA-GPU": 1}}',
        'c.DockerSpawner.volumes = {"/dev/nvidia0": "/dev/nvidia0"}',
    ],
)
def test_a_setting_that_can_only_conflict_stops_the_hub_with_one_line(swarm, tmp_path, line):
    """Guards docs/security.md, "An admin (of JupyterHub, or its configuration)": "a setting that could
    only conflict stops the hub at start with one line" and "refused at start"."""
    config = f"{line}\nfrom gpuspawner import validate_config\nvalidate_config(c)\n"
    with pytest.raises(HubError):
        with hub_on(swarm, tmp_path / "hub", port_from=21600, extra_config=config):
            pass
    log = (tmp_path / "hub" / "jupyterhub.log").read_text()
    (found,) = [ln for ln in log.splitlines() if "gpuspawner configuration error:" in ln]
    assert "Traceback" not in log.split("gpuspawner configuration error:")[0][-400:]
    print(f"\n{found}")
