"""The nodes' CPU and memory in placement, on the real three-node swarm: each
node's dockerd says what it has (this machine's CPUs and memory), servers
reserve ``cpu_guarantee`` (three quarters of a node's CPUs) and ``mem_guarantee``. A server the node has no CPU
left for is refused at once with a sentence naming CPUs (the swarm alone would
leave its task pending until the start timeout); a node whose memory another
service reserved is not chosen, and the refusal names memory."""

from __future__ import annotations

import time

import pytest

from tests.integration.support import hub_on, spawn_ready, wait_until

A100 = "NVIDIA A100 80GB PCIe"


def gpu_b(swarm) -> dict:
    client = swarm.client()
    return next(n for n in client.nodes.list() if n.attrs["Description"]["Hostname"] == "gpu-b").attrs


def cpus(swarm) -> float:
    return gpu_b(swarm)["Description"]["Resources"]["NanoCPUs"] / 1e9


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    # Each server reserves three quarters of a node's CPUs: one fits on gpu-b, two do not.
    config = (
        f"c.GPUSwarmSpawner.cpu_guarantee = {0.75 * cpus(swarm)}\nc.GPUSwarmSpawner.mem_guarantee = '1G'\n"
        "c.GPUSwarmSpawner.gpu_place_cpu_only = True\n"
    )
    with hub_on(swarm, tmp_path_factory.mktemp("hub"), port_from=21900, extra_config=config) as h:
        yield h


def test_a_server_the_node_has_no_cpu_left_for_is_refused_naming_cpus(hub, swarm):
    """Guards docs/how-it-works.md, "CPU and memory count too": "A GPU that is free on a node without
    the CPU or memory is not offered to that server; the refusal says so"."""
    spawn_ready(hub, "alice", {"gpu_model": A100})
    t0 = time.monotonic()
    r = hub.spawn("bob", {"gpu_model": A100})
    assert r.status_code == 409, r.text
    left = round(cpus(swarm) * 1000) - round(0.75 * cpus(swarm) * 1000)  # thousandths of a CPU
    assert f"1 {A100} free on gpu-b, but only {left / 1000:g} CPUs left there" in r.json()["message"]
    assert time.monotonic() - t0 < 20  # at once, not after the task's start timeout
    hub.stop_server("alice")
    spawn_ready(hub, "bob", {"gpu_model": A100})
    hub.stop_all_servers()


def test_a_node_whose_memory_another_service_reserved_is_not_chosen_and_the_refusal_names_memory(hub, swarm):
    """Guards docs/how-it-works.md, "CPU and memory count too": "and anything else on the node"."""
    memory = gpu_b(swarm)["Description"]["Resources"]["MemoryBytes"]
    big = swarm.client().services.create(  # not the hub's: it leaves gpu-b 0.5 GiB
        "gpuspawner-test/busybox:latest",
        ["sleep", "600"],
        name="bigdb",
        constraints=["node.hostname==gpu-b"],
        resources={"Reservations": {"MemoryBytes": memory - 2**29}},
    )
    try:
        wait_until(lambda: any(t["Status"]["State"] == "running" for t in big.tasks()), "bigdb did not start", 60)
        time.sleep(1.5)  # the hub reads the nodes' reservations at most every second
        r = hub.spawn("carol", {"gpu_model": A100})
        assert r.status_code == 409, r.text
        assert f"2 {A100} free on gpu-b, but only 0.5 GiB of memory left there" in r.json()["message"]
    finally:
        big.remove()
    time.sleep(1.5)  # its tasks are no longer meant to run: the hub's next read leaves them out
    spawn_ready(hub, "carol", {"gpu_model": A100})
    hub.stop_all_servers()


def test_with_gpu_place_cpu_only_a_server_without_gpus_goes_where_fewest_gpus_are_free_and_the_admin_allows(hub, swarm):
    """The example config keeps servers off the manager (``node.role == worker``): of
    the workers, gpu-b (2 free A100s) has fewer free GPUs than gpu-a (3 GTX 1070s)."""
    client = swarm.client()
    spawn_ready(hub, "dan", {})  # no GPU asked
    [service] = [s for s in client.services.list() if s.name == "jupyter-dan"]
    placed = service.attrs["Spec"]["TaskTemplate"]["Placement"]["Constraints"]
    assert placed == ["node.role == worker", "node.hostname==gpu-b"]
    [task] = [t for t in service.tasks() if t["Status"]["State"] == "running"]
    assert task["NodeID"] == gpu_b(swarm)["ID"]
    hub.stop_all_servers()


def test_an_any_of_models_request_lands_on_whichever_model_has_room(hub, swarm):
    """gpu-b has an A100 free but no CPU left for a second server: a request for an
    A100 or a GTX 1070 gets a GTX 1070 on gpu-a."""
    spawn_ready(hub, "erin", {"gpu_model": A100})
    spawn_ready(hub, "finn", {"gpu_model": [A100, "NVIDIA GeForce GTX 1070"]})
    [service] = [s for s in swarm.client().services.list() if s.name == "jupyter-finn"]
    assert service.attrs["Spec"]["Labels"]["gpuspawner.model"] == "NVIDIA GeForce GTX 1070"
    assert "node.hostname==gpu-a" in service.attrs["Spec"]["TaskTemplate"]["Placement"]["Constraints"]
    hub.stop_all_servers()
