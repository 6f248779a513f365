"""The cluster's inventory from its sources: agent reports, health, staleness,
static overrides, holdings adopted before their devices are reported, and the
allocator fed one host at a time (pure: no swarm; reports go in as the hub's
endpoint hands them over)."""

from __future__ import annotations

import json
import random

import pytest

from gpuspawner.allocator.allocator import AllocationRefused, Allocator, Request
from gpuspawner.cluster.cluster import GPUCluster, InventorySettings
from gpuspawner.core.inventory import GPU
from gpuspawner.core.labels import Held
from gpuspawner.core.reports import parse_report
from gpuspawner.core.sharing import UNIT
from tests.unit.test_cluster_views import served_map
from tests.unit.test_reports import A100, MIG, device, report

GTX = "NVIDIA GeForce GTX 1070"
SHARING = {"*": {"quantum": 0.05, "split": True}}


def agent_cluster(**kw) -> GPUCluster:
    return GPUCluster(InventorySettings(sources=("agent",), **kw))


def send(cluster, body, now=0.0):
    cluster.receive(parse_report(json.dumps(body)), now=now)


def free(cluster) -> dict[str, int]:
    return {m.model: m.free for m in cluster.allocator.summary()}


def test_reports_feed_the_form_counts_with_models_and_mig_slices():
    c = agent_cluster()
    send(c, report(device(0, "GPU-a100-0"), MIG))
    send(c, report(*[device(i, f"GPU-gtx-{i}", GTX, 8192) for i in range(3)], hostname="gpu-a"))
    assert free(c) == {A100: 1, A100 + " · MIG 1g.10gb": 1, A100 + " · MIG 3g.40gb": 1, GTX: 3}
    assert c.allocator.allocate("s1", Request(model=GTX, count=2)).host == "gpu-a"


def test_unhealthy_gpus_are_not_offered_their_reason_is_kept_and_recovery_puts_them_back():
    """Guards docs/nodes.md, "Where the hub learns the GPUs": "has uncorrected ECC errors (volatile
    count) or is hotter than gpu_max_temperature (90 °C) is not offered; the reason shows in the
    allocation map"."""
    c = agent_cluster(max_temperature_c=85)
    ok = [device(i, f"GPU-a100-{i}") for i in range(4)]
    send(c, report(*ok))
    assert free(c) == {A100: 4}
    sick = [
        device(0, "GPU-a100-0", ecc_uncorrected=2),
        device(1, "GPU-a100-1", temperature_c=91),
        {"index": 2, "uuid": None, "lost": True},
        device(3, "GPU-a100-3"),
    ]
    send(c, report(*sick), now=1)
    assert free(c) == {A100: 1}
    m = served_map(c)["gpu-b"]
    assert m["GPU-a100-0"]["health"] == "unhealthy" and m["GPU-a100-0"]["problems"] == ["2 uncorrected ECC errors"]
    assert m["GPU-a100-1"]["problems"] == ["temperature 91 C is above 85 C"]
    # NVML no longer says the lost GPU's UUID; the map still shows it, by the UUID last seen at its index.
    assert m["GPU-a100-2"]["problems"] == ["GPU is lost (NVML_ERROR_GPU_IS_LOST)"]
    assert m["GPU-a100-3"]["health"] == "ok"
    send(c, report(*ok), now=2)
    assert free(c) == {A100: 4}
    assert all(d["health"] == "ok" for d in served_map(c)["gpu-b"].values())


def test_a_running_server_on_a_gpu_that_turns_unhealthy_keeps_it_and_it_is_not_offered_after():
    c = agent_cluster()
    send(c, report(device(0, "GPU-a100-0"), device(1, "GPU-a100-1")))
    alloc = c.allocator.allocate("s1", Request(model=A100, count=1))
    send(c, report(device(0, "GPU-a100-0", ecc_uncorrected=1), device(1, "GPU-a100-1", ecc_uncorrected=1)), now=1)
    assert c.allocator.holding("s1") == alloc
    send(c, report(device(0, "GPU-a100-0"), device(1, "GPU-a100-1")), now=2)
    assert free(c) == {A100: 1}  # the held one stays held when it comes back
    c.allocator.release("s1")
    assert free(c) == {A100: 2}


def test_a_node_whose_agent_stops_reporting_is_not_offered_until_it_reports_again():
    """Guards docs/nodes.md, "Where the hub learns the GPUs": "A node whose agent has not reported for
    agent_stale_intervals (3) of its intervals is not offered either" and "The next good report puts
    them back"."""
    c = agent_cluster(stale_intervals=3)
    send(c, report(device(0, "GPU-a100-0"), interval=10), now=100)
    send(c, report(device(0, "GPU-gtx-0", GTX, 8192), hostname="gpu-a", interval=10), now=100)
    c.apply(now=129)
    assert free(c) == {A100: 1, GTX: 1} and not c.stale
    c.apply(now=131)  # more than 3 intervals of 10 s
    assert free(c) == {A100: 0, GTX: 0} and set(c.stale) == {"gpu-a", "gpu-b"}
    assert served_map(c)["gpu-b"]["GPU-a100-0"]["health"] == "stale"
    with pytest.raises(AllocationRefused) as refused:
        c.allocator.allocate("s1", Request(model=A100))
    assert refused.value.retry
    send(c, report(device(0, "GPU-a100-0"), interval=10), now=132)
    assert free(c) == {A100: 1, GTX: 0}


def test_static_inventory_overrides_the_agent_for_its_hosts_and_takes_health_from_it():
    """Guards docs/nodes.md, "Where the hub learns the GPUs": "a host listed in the file keeps the
    devices listed there, and its agent only says how healthy they are"."""
    static = (GPU("gpu-b", 0, "GPU-a100-0", "A100 listed", 81920),)
    c = GPUCluster(InventorySettings(static=static, sources=("static", "agent")))
    send(c, report(device(0, "GPU-a100-0"), device(1, "GPU-a100-1")))  # gpu-b lists only one device
    send(c, report(device(0, "GPU-gtx-0", GTX, 8192), hostname="gpu-a"))
    assert free(c) == {"A100 listed": 1, GTX: 1}
    send(c, report(device(0, "GPU-a100-0", lost=True), device(1, "GPU-a100-1")), now=1)
    assert free(c) == {GTX: 1}  # its only device is unhealthy: the model is not offered
    assert served_map(c)["gpu-b"]["GPU-a100-0"]["model"] == "A100 listed"
    c.apply(now=10_000)  # a listed host is not stale without an agent: the file says what it has
    assert "gpu-b" not in c.stale and "gpu-a" in c.stale


def test_a_holding_rebuilt_before_its_node_reported_takes_its_devices_the_moment_they_appear():
    c = agent_cluster()
    holding = Held(user="ann", server="", host="gpu-b", uuids=("GPU-a100-1",), model=A100, port=None)
    alloc, problems = c.allocator.adopt("jupyter-ann", "ann", "gpu-b", holding.uuids)
    assert problems and not alloc.devices
    c.pending["jupyter-ann"] = (holding, (0, 0))  # as Holdings records it when it adopts
    send(c, report(device(0, "GPU-a100-0"), device(1, "GPU-a100-1")))
    assert c.allocator.booked_on("GPU-a100-1") == {"jupyter-ann": UNIT}
    assert c.allocator.allocate("s2", Request(model=A100, count=1)).uuids == ("GPU-a100-0",)
    with pytest.raises(AllocationRefused):
        c.allocator.allocate("s3", Request(model=A100, count=1))


@pytest.mark.parametrize("seed", range(4))
def test_one_host_at_a_time_gives_the_allocator_a_full_rebuild_gives(seed):
    """Reports that change health, drop devices, bring them back or rename them,
    with allocations and releases between: the cluster's allocator (fed one host
    at a time) and one rebuilt from every offered device each time decide alike
    and end with the same index."""
    rng = random.Random(seed)
    hosts = [f"node-{i}" for i in range(6)]
    c = GPUCluster(InventorySettings(sources=("agent",), aliases=(("renamed", GTX),)))
    c.allocator.set_sharing(SHARING)
    full = Allocator(sharing=SHARING)
    state = {h: {"sick": None, "gone": set(), "name": A100 if i % 2 else GTX} for i, h in enumerate(hosts)}

    def body(h):
        s = state[h]
        return [
            device(i, f"GPU-{h}-{i}", s["name"], ecc_uncorrected=int(i == s["sick"]))
            for i in range(4)
            if i not in s["gone"]
        ]

    def decide(name, request):
        got = []
        for allocator in (c.allocator, full):
            try:
                got.append(allocator.allocate(name, request).uuids)
            except AllocationRefused as exc:
                got.append(exc.message)
        assert got[0] == got[1]

    def offered():
        return [g for host in sorted(c._offered_by_host) for g in c._offered_by_host[host]]

    for h in hosts:
        send(c, report(*body(h), hostname=h))
    full.set_inventory(offered())
    for step in range(300):
        h = rng.choice(hosts)
        kind = rng.random()
        if kind < 0.25:
            state[h]["sick"] = rng.choice([None, 0, 1, 2, 3])
        elif kind < 0.5:
            state[h]["gone"] ^= {rng.randrange(4)}
        elif kind < 0.55:
            state[h]["name"] = rng.choice([A100, GTX, "renamed"])
        elif kind < 0.8:
            milli = rng.choice([None, 250, 500, 1500])
            decide(f"s{step}", Request(milli=milli) if milli else Request(count=rng.choice([1, 2, 4])))
            continue
        else:
            holders = sorted(c.allocator.holdings())
            if holders:
                holder = rng.choice(holders)
                assert c.allocator.release(holder) == full.release(holder)
            continue
        send(c, report(*body(h), hostname=h))
        full.set_inventory(offered())
        assert c.allocator.holdings() == full.holdings()
        mine, theirs = c.allocator._index, full._index
        assert mine.models == theirs.models and list(mine.models) == list(theirs.models)
        assert mine.hosts == theirs.hosts and mine.gpus == theirs.gpus
