"""The nodes' CPU and memory in placement: what the swarm says each node has,
what other services reserve there, and what the hub's servers reserve (their
``cpu_guarantee`` / ``mem_guarantee``), through the real spawner over the fake
swarm. A node without the memory is not chosen, and a refusal names memory."""

from __future__ import annotations

import asyncio
import logging

import pytest
from jupyterhub.spawner import SpawnException

from gpuspawner.allocator.allocator import Refusal
from gpuspawner.cluster.swarm import Swarm, SwarmError
from tests.unit.test_holdings import A100, World, driven
from tests.unit.test_line import until

TWO = {"gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920} for i in range(2)]}
GIB = 2**30


def world(tmp_path, **settings) -> World:
    w = World(tmp_path, inventory=TWO, mem_guarantee=20 * GIB, **settings)
    w.fake.set_node_resources("gpu-b", cpus=8, memory_gib=32)
    return w


async def refused(w: World, user: str) -> SpawnException:
    with pytest.raises(SpawnException) as exc:
        await w.spawner(user, {"gpu_model": A100}).start()
    return exc.value


async def test_a_second_server_whose_memory_the_node_lacks_is_refused_naming_memory(tmp_path):
    """Guards docs/how-it-works.md, "CPU and memory count too": "A GPU that is free on a node without
    the CPU or memory is not offered to that server; the refusal says so" and "at once rather than
    after the start timeout"."""
    w = world(tmp_path)
    alice = w.spawner("alice", {"gpu_model": A100})
    await w.started(alice)
    assert w.owner.get(alice.service_name).held.host == "gpu-b"
    exc = await refused(w, "bob")  # one A100 is free, 12 GiB of memory
    assert exc.status_code == 409
    assert exc.message.startswith(f"1 {A100} free on gpu-b, but only 12.0 GiB of memory left there")
    assert isinstance(exc.__cause__, Exception) and exc.__cause__.reason is Refusal.RESOURCES_SHORT
    assert w.fake.service_names() == ["jupyter-alice"]  # nothing half-made
    # A restarted hub books alice's memory again, from her service's spec.
    w.restart()
    exc = await refused(w, "bob")
    assert "only 12.0 GiB of memory left there" in exc.message
    alice = w.spawner("alice", {"gpu_model": A100})  # the restarted hub's
    await driven(alice.stop(), w.fake.exit_all)
    await w.started(w.spawner("bob", {"gpu_model": A100}))  # at once: her memory is back with her GPU


async def test_what_another_service_reserves_on_the_node_counts_and_unknown_is_not_none(tmp_path, monkeypatch):
    """Guards docs/how-it-works.md, "CPU and memory count too": "what the node has, less what the
    services running there reserve"."""
    w = world(tmp_path)
    template = {
        "ContainerSpec": {"Image": "busybox"},
        "Resources": {"Reservations": {"MemoryBytes": 16 * GIB}},
        "Placement": {"Constraints": ["node.hostname==gpu-b"]},
    }
    w.fake.create_service(template, name="database")  # not the hub's
    w.fake.run_all()
    exc = await refused(w, "alice")  # 32 - 16 GiB: too little for 20
    assert "only 16.0 GiB of memory left there" in exc.message
    # The reservations cannot be read for a moment: the figures last read stay.
    w.fake.remove_service("database")

    async def down(self):
        raise SwarmError("swarm tasks failed: injected fault")

    with monkeypatch.context() as m:
        m.setattr(Swarm, "reservations", down)
        await asyncio.sleep(1.1)  # they are read again after a second
        exc = await refused(w, "alice")
        assert "only 16.0 GiB of memory left there" in exc.message
    await asyncio.sleep(1.1)  # read again: the database is gone
    await w.started(w.spawner("alice", {"gpu_model": A100}))


async def test_without_guarantees_or_node_figures_nothing_changes(tmp_path):
    w = World(tmp_path, inventory=TWO)  # the swarm says nothing of the nodes' resources
    for user in ("alice", "bob"):
        await w.started(w.spawner(user, {"gpu_model": A100}))
    assert len(w.fake.service_names()) == 2


async def test_a_request_that_may_wait_waits_in_line_for_the_memory_and_is_served_when_it_is_back(tmp_path):
    """Guards docs/how-it-works.md, "CPU and memory count too": "a request with gpu_wait waits in line
    for it"."""
    w = world(tmp_path)
    alice = w.spawner("alice", {"gpu_model": A100})
    await w.started(alice)
    bob = w.spawner("bob", {"gpu_model": A100, "gpu_wait": True})
    bob_start = asyncio.ensure_future(w.started(bob))
    await until(lambda: w.hub.line.place(bob.service_name) == (A100, 1))
    await driven(alice.stop(), w.fake.exit_all)
    await bob_start  # served once alice's memory (and GPU) came back
    assert w.owner.get(bob.service_name).held.host == "gpu-b"


def constraints(w: World, service: str) -> list[str]:
    return w.fake.inspect_service(service)["Spec"]["TaskTemplate"].get("Placement", {}).get("Constraints", [])


async def test_with_gpu_place_cpu_only_a_server_without_gpus_goes_to_a_node_without_gpus_and_stays_off_gpu_nodes(
    tmp_path,
):
    """Guards docs/how-it-works.md, "CPU and memory count too": "servers without GPUs are placed the
    same way, pinned to the node where they take least from GPU users"."""
    w = world(tmp_path, gpu_place_cpu_only=True)
    for node in ("manager", "gpu-a"):
        w.fake.set_node_resources(node, cpus=4, memory_gib=32)
    dan = w.spawner("dan", {})  # no GPU asked
    await w.started(dan)
    # gpu-a has no GPU in this inventory: the nodes without GPUs, by name.
    assert constraints(w, dan.service_name) == ["node.hostname==gpu-a"]
    assert w.fake.running_containers()[w.fake.task_ids(dan.service_name)[0]][2] == "void"
    assert w.owner.allocator.resources.free("gpu-a") == (4000, 12 * 1024)  # its 20 GiB booked
    eve = w.spawner("eve", {})  # gpu-a has 12 GiB left: too little
    await w.started(eve)
    assert constraints(w, eve.service_name) == ["node.hostname==manager"]
    w.restart()  # the restarted hub books their memory again: only the GPU node has 20 GiB left
    fay = w.spawner("fay", {})
    await w.started(fay)
    assert constraints(w, fay.service_name) == ["node.hostname==gpu-b"]
    with pytest.raises(SpawnException) as exc:
        await w.spawner("gus", {}).start()
    assert exc.value.status_code == 409 and "CPU and memory" in exc.value.message


async def test_without_gpu_place_cpu_only_the_swarm_places_servers_without_gpus(tmp_path):
    """Guards docs/how-it-works.md, "CPU and memory count too": "off by default: the swarm places
    them"."""
    w = world(tmp_path)
    dan = w.spawner("dan", {})
    await w.started(dan)
    assert constraints(w, dan.service_name) == []


async def test_a_server_without_gpus_goes_only_where_the_admins_constraints_allow(tmp_path):
    w = world(tmp_path, gpu_place_cpu_only=True, extra_placement_spec={"constraints": ["node.role == manager"]})
    for node in ("manager", "gpu-a"):
        w.fake.set_node_resources(node, cpus=4, memory_gib=32)
    dan = w.spawner("dan", {})
    await w.started(dan)  # gpu-a comes first by name, but it is a worker
    assert constraints(w, dan.service_name) == ["node.role == manager", "node.hostname==manager"]


def test_constraints_are_judged_on_what_the_node_list_says_and_the_rest_rules_out_nothing():
    from gpuspawner.cluster.constraints import allows, eligible
    from gpuspawner.cluster.swarm import Node

    a = Node("id-a", "gpu-a", "10.0.0.2", True, "active", role="worker", labels=(("gpu", "a100"),), os="linux")
    m = Node("id-m", "hub", "10.0.0.1", True, "active", role="manager", os="linux")
    assert allows("node.role == worker", a) and not allows("node.role==worker", m)
    assert allows("node.role == Worker", a) and allows("node.Labels.GPU == A100", a)  # the swarm ignores case
    assert allows("node.labels.gpu == a100", a) and allows("node.labels.gpu != a100", m)  # m lacks the label
    assert allows("node.platform.os == linux", m) and allows("node.id != id-a", m)
    assert allows("engine.labels.zone == x", a) is None and allows("nonsense", a) is None
    assert eligible(["node.role == worker", "engine.labels.zone == x"], [a, m]) == {"gpu-a"}
    assert eligible([], [a, m]) == {"gpu-a", "hub"}


async def test_the_form_counts_only_gpus_on_nodes_with_the_memory_the_server_reserves(tmp_path):
    """Guards docs/how-it-works.md, "CPU and memory count too": "The form's free counts are those on
    nodes with that CPU and memory free"."""
    from tests.unit.test_form_template import _TreeBuilder

    w = world(tmp_path)
    await w.started(w.spawner("alice", {"gpu_model": A100}))  # gpu-b: 12 GiB left, an A100 free
    form = _TreeBuilder()
    form.feed(await w.spawner("bob")._render_options_form())
    [radio] = [n for n in form.root.find_all("input") if n.attrs.get("value") == A100]
    helptext = " ".join(form.root.by_id(radio.attrs["aria-describedby"]).text.split())
    assert "0 of 2 free now (1 more on nodes without the CPU or memory your server reserves)" in helptext


async def test_a_server_the_swarm_placed_counts_by_its_task_also_after_a_restart(tmp_path):
    """A server without GPUs (gpu_place_cpu_only off) is held with no host: what it
    reserves is counted where its task runs, before and after a hub restart."""
    w = world(tmp_path)
    w.fake.set_node_resources("gpu-a", cpus=8, memory_gib=32)
    cy = w.spawner("cy", {})
    await w.started(cy)
    assert w.fake.running_containers()[w.fake.task_ids(cy.service_name)[0]][1] == "gpu-a"  # the swarm's choice
    for restart in (False, True):
        if restart:
            w.restart()
            await w.owner.reconcile()  # cy's service is adopted, held with no host
        holdings = w.hub.holdings
        await asyncio.sleep(holdings.cluster.reserved_max_age + 0.1)  # the figures are read at most this often
        await holdings.cluster.refresh(holdings.swarm, logging.getLogger())
        await holdings.cluster.read_reservations(holdings.swarm, logging.getLogger())
        if holdings.cluster.reading is not None:  # a read after the first runs in the background
            await holdings.cluster.reading
        assert holdings.allocator.resources.free("gpu-a") == (8000, 12 * 1024), restart


async def test_reservations_set_by_extra_resources_spec_count_too(tmp_path):
    w = World(tmp_path, inventory=TWO, extra_resources_spec={"mem_reservation": "20g"})
    w.fake.set_node_resources("gpu-b", cpus=8, memory_gib=32)
    alice = w.spawner("alice", {"gpu_model": A100})
    assert alice._reserves() == (0, 20 * 1024)
    await w.started(alice)
    exc = await refused(w, "bob")
    assert "only 12.0 GiB of memory left there" in exc.message


@pytest.mark.parametrize(
    "setting",
    [
        {"extra_task_spec": {"Resources": {"Reservations": {"MemoryBytes": 20 * 2**30}}}},
        {"extra_task_spec": {"resources": {"Reservations": {"MemoryBytes": 20 * 2**30}}}},
        # The admin's task template replaces the spawner's resources, as in the service's spec.
        {"mem_guarantee": "1G", "extra_task_spec": {"Resources": {"Reservations": {"MemoryBytes": 20 * 2**30}}}},
    ],
)
async def test_reservations_set_by_the_admins_task_template_count_as_the_service_has_them(tmp_path, setting):
    w = World(tmp_path, inventory=TWO, **setting)
    w.fake.set_node_resources("gpu-b", cpus=8, memory_gib=32)
    alice = w.spawner("alice", {"gpu_model": A100})
    assert alice._reserves() == (0, 20 * 1024)
    await w.started(alice)
    spec = w.fake.inspect_service(alice.service_name)["Spec"]
    assert spec["TaskTemplate"]["Resources"]["Reservations"]["MemoryBytes"] == 20 * 2**30
    exc = await refused(w, "bob")
    assert "only 12.0 GiB of memory left there" in exc.message


async def test_with_gpu_place_cpu_only_but_no_node_figures_the_swarm_places_servers_without_gpus(tmp_path):
    w = World(tmp_path, inventory=TWO, gpu_place_cpu_only=True)  # the fake's nodes say nothing of their resources
    dan = w.spawner("dan", {})
    await w.started(dan)
    assert constraints(w, dan.service_name) == []


async def test_a_hub_that_stops_cancels_a_read_of_the_nodes_reservations_under_way(tmp_path, monkeypatch):
    w = World(tmp_path, inventory=TWO, mem_guarantee="1G")
    w.fake.set_node_resources("gpu-b", cpus=8, memory_gib=32)
    await w.started(w.spawner("alice", {"gpu_model": A100}))  # the first read, waited for
    holdings = w.hub.holdings
    cluster = holdings.cluster

    async def stuck():
        await asyncio.Event().wait()

    monkeypatch.setattr(holdings.swarm, "reservations", stuck)
    cluster._reserved_at -= cluster.reserved_max_age  # as if that long had passed
    await cluster.read_reservations(holdings.swarm, logging.getLogger())  # goes on after READ_WAIT
    reading = cluster.reading
    assert reading is not None and not reading.done()
    await w.hub.stop()
    assert reading.cancelled() and cluster.reading is None
