"""The cluster's inventory from its sources: agent reports, health, staleness,
static overrides, and holdings adopted before their devices are reported (pure:
no swarm; reports go in as the hub's endpoint hands them over)."""

from __future__ import annotations

import json

from gpuspawner.allocator import AllocationRefused, Request
from gpuspawner.cluster import GPUCluster, InventorySettings
from gpuspawner.inventory import GPU
from gpuspawner.reports import parse_report
from gpuspawner.labels import ServerLabels
from tests.unit.test_reports import A100, MIG, device, report

import pytest

GTX = "NVIDIA GeForce GTX 1070"


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
    c = agent_cluster(max_temperature_c=85)
    ok = [device(i, f"GPU-a100-{i}") for i in range(4)]
    send(c, report(*ok))
    assert free(c) == {A100: 4}
    sick = [device(0, "GPU-a100-0", ecc_uncorrected=2), device(1, "GPU-a100-1", temperature_c=91),
            {"index": 2, "uuid": None, "lost": True}, device(3, "GPU-a100-3")]
    send(c, report(*sick), now=1)
    assert free(c) == {A100: 1}
    m = c.alloc_map()["gpu-b"]
    assert m["GPU-a100-0"]["health"] == "unhealthy" and m["GPU-a100-0"]["problems"] == ["2 uncorrected ECC errors"]
    assert m["GPU-a100-1"]["problems"] == ["temperature 91 C is above 85 C"]
    # NVML no longer says the lost GPU's UUID; the map still shows it, by the UUID last seen at its index.
    assert m["GPU-a100-2"]["problems"] == ["GPU is lost (NVML_ERROR_GPU_IS_LOST)"]
    assert m["GPU-a100-3"]["health"] == "ok"
    send(c, report(*ok), now=2)
    assert free(c) == {A100: 4}
    assert all(d["health"] == "ok" for d in c.alloc_map()["gpu-b"].values())


def test_a_running_server_on_a_gpu_that_turns_unhealthy_keeps_it_and_it_is_not_offered_after():
    c = agent_cluster()
    send(c, report(device(0, "GPU-a100-0"), device(1, "GPU-a100-1")))
    alloc = c.allocator.allocate("s1", Request(model=A100, count=1))
    send(c, report(device(0, "GPU-a100-0", ecc_uncorrected=1), device(1, "GPU-a100-1", ecc_uncorrected=1)), now=1)
    assert c.allocator.holding("s1") == alloc
    send(c, report(device(0, "GPU-a100-0"), device(1, "GPU-a100-1")), now=2)
    assert free(c) == {A100: 1}  # the held one stays held when it comes back
    c.release("s1")
    assert free(c) == {A100: 2}


def test_a_node_whose_agent_stops_reporting_is_not_offered_until_it_reports_again():
    c = agent_cluster(stale_intervals=3)
    send(c, report(device(0, "GPU-a100-0"), interval=10), now=100)
    send(c, report(device(0, "GPU-gtx-0", GTX, 8192), hostname="gpu-a", interval=10), now=100)
    c.apply(now=129)
    assert free(c) == {A100: 1, GTX: 1} and not c.stale
    c.apply(now=131)  # more than 3 intervals of 10 s
    assert free(c) == {A100: 0, GTX: 0} and set(c.stale) == {"gpu-a", "gpu-b"}
    assert c.alloc_map()["gpu-b"]["GPU-a100-0"]["health"] == "stale"
    with pytest.raises(AllocationRefused) as refused:
        c.allocator.allocate("s1", Request(model=A100))
    assert refused.value.retry
    send(c, report(device(0, "GPU-a100-0"), interval=10), now=132)
    assert free(c) == {A100: 1, GTX: 0}


def test_static_inventory_overrides_the_agent_for_its_hosts_and_takes_health_from_it():
    static = (GPU("gpu-b", 0, "GPU-a100-0", "A100 listed", 81920),)
    c = GPUCluster(InventorySettings(static=static, sources=("static", "agent")))
    send(c, report(device(0, "GPU-a100-0"), device(1, "GPU-a100-1")))  # gpu-b lists only one device
    send(c, report(device(0, "GPU-gtx-0", GTX, 8192), hostname="gpu-a"))
    assert free(c) == {"A100 listed": 1, GTX: 1}
    send(c, report(device(0, "GPU-a100-0", lost=True), device(1, "GPU-a100-1")), now=1)
    assert free(c) == {GTX: 1}  # its only device is unhealthy: the model is not offered
    assert c.alloc_map()["gpu-b"]["GPU-a100-0"]["model"] == "A100 listed"
    c.apply(now=10_000)  # a listed host is not stale without an agent: the file says what it has
    assert "gpu-b" not in c.stale and "gpu-a" in c.stale


def test_a_holding_rebuilt_before_its_node_reported_takes_its_devices_the_moment_they_appear():
    c = agent_cluster()
    holding = ServerLabels(user="ann", server="", host="gpu-b", uuids=("GPU-a100-1",), model=A100, port=None)
    alloc, problems = c.allocator.adopt("jupyter-ann", "ann", "gpu-b", holding.uuids)
    assert problems and not alloc.devices
    c._pending["jupyter-ann"] = holding  # as reconcile() records it
    send(c, report(device(0, "GPU-a100-0"), device(1, "GPU-a100-1")))
    assert c.allocator.holder_of("GPU-a100-1") == "jupyter-ann"
    assert c.allocator.allocate("s2", Request(model=A100, count=1)).uuids == ("GPU-a100-0",)
    with pytest.raises(AllocationRefused):
        c.allocator.allocate("s3", Request(model=A100, count=1))


def test_alloc_map_lists_every_device_with_its_holders():
    c = agent_cluster()
    send(c, report(device(0, "GPU-a100-0"), device(1, "GPU-a100-1")))
    c.allocator.allocate("jupyter-ann", Request(model=A100, owner="ann"))
    c.servers["jupyter-ann"] = ("ann", "")
    m = c.alloc_map()
    assert m["gpu-b"]["GPU-a100-0"]["allocated"] == 1.0
    assert m["gpu-b"]["GPU-a100-0"]["holders"] == [{"user": "ann", "server": "", "share": 1.0}]
    assert m["gpu-b"]["GPU-a100-1"]["allocated"] == 0 and m["gpu-b"]["GPU-a100-1"]["holders"] == []


async def test_reconciliation_counts_a_device_booked_by_two_services():
    import logging

    from gpuspawner import metrics

    class FakeSwarm:  # small fake: the two services' labels are all reconcile() reads
        async def services(self, label):
            return [{"Spec": {"Name": name, "Labels": {"gpuspawner.user": name, "gpuspawner.host": "gpu-b",
                                                       "gpuspawner.devices": "GPU-a100-0", "gpuspawner.model": A100}}}
                    for name in ("s1", "s2")]

    c = agent_cluster()
    send(c, report(device(0, "GPU-a100-0")))
    before = metrics.DOUBLE_BOOKINGS._value.get()
    await c.reconcile(FakeSwarm(), logging.getLogger("test"))
    assert metrics.DOUBLE_BOOKINGS._value.get() == before + 1
    assert c.allocator.holder_of("GPU-a100-0") == "s1"  # the first keeps it; the second is logged and counted


async def test_reconciliation_skips_a_service_with_malformed_labels_and_keeps_what_it_held(caplog):
    import logging

    c = agent_cluster()
    send(c, report(*(device(i, f"GPU-a100-{i}") for i in range(3))))
    held = c.allocator.allocate("s3", Request(model=A100, count=1))  # this hub started s3; then its labels changed
    good = {"gpuspawner.user": "ann", "gpuspawner.host": "gpu-b", "gpuspawner.devices": "GPU-a100-1",
            "gpuspawner.model": A100}
    services = {"s1": good, "s2": {**good, "gpuspawner.devices": "GPU-a100-2", "gpuspawner.shares": "inf"},
                "s3": {**good, "gpuspawner.devices": held.uuids[0], "gpuspawner.port": "٨٠٨٠"}}

    class FakeSwarm:
        async def services(self, label):
            return [{"Spec": {"Name": name, "Labels": labels}} for name, labels in services.items()]

    with caplog.at_level(logging.WARNING):
        result = await c.reconcile(FakeSwarm(), logging.getLogger("test"))
    assert result["services"] == 1 and result["released"] == 0
    assert c.allocator.holder_of("GPU-a100-1") == "s1"
    assert c.allocator.holder_of("GPU-a100-2") is None  # s2's claim is not booked
    assert c.allocator.holding("s3") == held  # still held: its service is still there
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2
    assert "Service s2 is skipped: label gpuspawner.shares" in skipped[0]
    assert "Service s3 is skipped: label gpuspawner.port" in skipped[1]
