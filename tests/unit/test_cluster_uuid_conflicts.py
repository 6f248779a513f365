"""A UUID belongs to one host: a report naming a UUID another host has (by the
static inventory or by that host's accepted report) is refused as a whole, the
refusal shows in doctor until it is settled, and a GPU that really moved is
taken by its new host once its old host no longer names it or its agent is late."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from tornado import web

from gpuspawner.allocator.allocator import Request
from gpuspawner.cluster.cluster import GPUCluster, InventorySettings
from gpuspawner.cluster.doctor import diagnose
from gpuspawner.cluster.swarm import Node
from gpuspawner.core.inventory import GPU
from gpuspawner.core.reports import ReportError, UUIDConflict, parse_report
from gpuspawner.holdings.holdings import Holdings
from gpuspawner.reclaim.reclaimer import Reclaimer
from gpuspawner.web.api import ReportHandler
from tests.unit.test_cluster_views import served_map
from tests.unit.test_reports import A100, MIG, device, report

FIX = "the same UUID on two nodes: a copied inventory or a spoofed agent; check nvidia-smi -L on both"


def agent_cluster(**kw) -> GPUCluster:
    return GPUCluster(InventorySettings(sources=("agent",), **kw))


def send(cluster, body, now=0.0):
    cluster.receive(parse_report(json.dumps(body)), now=now)


def hosts_of(cluster) -> dict[str, str]:
    """uuid -> host, as the allocator has them."""
    return {g.uuid: g.host for g in cluster.allocator._index.gpus.values()}


def findings(cluster):
    nodes = [
        Node(id=h, hostname=h, addr="10.0.0.1", ready=True, availability="active", generic_resources=())
        for h in ("gpu-a", "gpu-b")
    ]
    reports = {host: r for host, (r, _) in cluster.reports.items()}
    return [
        f
        for f in diagnose(
            nodes,
            cluster.settings.static,
            reports,
            cluster.stale,
            cluster.settings.sources,
            conflicts=cluster.uuid_conflicts,
        )
        if f.fix == FIX
    ]


def test_a_report_naming_another_hosts_uuid_is_refused_and_takes_nothing():
    c = agent_cluster()
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1")))
    send(c, report(device(0, "GPU-a0"), hostname="gpu-a"))
    a_before = c.reports["gpu-a"]
    with pytest.raises(UUIDConflict) as refused:
        send(c, report(device(0, "GPU-a0"), device(1, "GPU-b1"), device(2, "GPU-a2"), hostname="gpu-a"), now=1)
    assert isinstance(refused.value, ReportError)  # the endpoint answers 400
    assert str(refused.value) == (
        "report refused: GPU-b1 is on gpu-b (by its agent's report), not on gpu-a: a copied inventory or "
        "a spoofed agent; check nvidia-smi -L on both"
    )
    # Nothing of it is taken: gpu-a keeps its previous report (and its time), GPU-a2 is not offered.
    assert c.reports["gpu-a"] is a_before
    assert hosts_of(c) == {"GPU-a0": "gpu-a", "GPU-b0": "gpu-b", "GPU-b1": "gpu-b"}
    assert set(served_map(c)["gpu-b"]) == {"GPU-b0", "GPU-b1"} and set(served_map(c)["gpu-a"]) == {"GPU-a0"}
    # Allocations still land on gpu-b, with gpu-b's own devices.
    c.allocator.allocate("pin-a", Request(model=A100, count=1, host="gpu-a"))
    for name in ("s1", "s2"):
        alloc = c.allocator.allocate(name, Request(model=A100, count=1))
        assert alloc.host == "gpu-b" and hosts_of(c)[alloc.uuids[0]] == "gpu-b"
    # gpu-b's own reports go on as before.
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1", temperature_c=50)), now=2)
    assert hosts_of(c)["GPU-b1"] == "gpu-b"


def test_the_message_counts_every_conflicting_uuid():
    c = agent_cluster()
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1")))
    with pytest.raises(UUIDConflict) as refused:
        send(c, report(device(0, "GPU-b1"), device(1, "GPU-b0"), hostname="gpu-a"))
    assert "GPU-b0 is on gpu-b" in str(refused.value) and "(and 1 more)" in str(refused.value)
    assert [(x.host, x.uuid, x.owner) for x in refused.value.conflicts] == [
        ("gpu-a", "GPU-b0", "gpu-b"),
        ("gpu-a", "GPU-b1", "gpu-b"),
    ]
    assert "gpu-a" not in c.reports


def test_a_uuid_listed_in_the_static_inventory_cannot_be_reported_by_another_host():
    static = (GPU("gpu-b", 0, "GPU-b0", A100, 81920),)
    c = GPUCluster(InventorySettings(static=static, sources=("static", "agent")))
    with pytest.raises(UUIDConflict, match=r"GPU-b0 is on gpu-b \(in the static inventory\), not on gpu-a"):
        send(c, report(device(0, "GPU-b0"), hostname="gpu-a"))
    assert hosts_of(c) == {"GPU-b0": "gpu-b"} and "gpu-a" not in c.reports
    # A listed host's agent never goes late, and the file decides: still refused much later.
    with pytest.raises(UUIDConflict):
        send(c, report(device(0, "GPU-b0"), hostname="gpu-a"), now=10_000)
    # The listed host's own agent reports it as usual.
    send(c, report(device(0, "GPU-b0", ecc_uncorrected=1)), now=10_001)
    assert served_map(c)["gpu-b"]["GPU-b0"]["health"] == "unhealthy"
    # Without 'static' as a source the file does not count.
    c2 = GPUCluster(InventorySettings(static=static, sources=("agent",)))
    send(c2, report(device(0, "GPU-b0"), hostname="gpu-a"))
    assert hosts_of(c2) == {"GPU-b0": "gpu-a"}


def test_mig_uuids_and_the_parent_gpu_uuid_belong_to_their_host():
    c = agent_cluster()
    send(c, report(device(0, "GPU-b0"), MIG))
    for stolen in (
        device(1, "GPU-a1", mig_mode=True, mig_devices=[dict(MIG["mig_devices"][1])]),  # a MIG UUID of gpu-b
        device(1, "GPU-a100-mig", mig_mode=True, mig_devices=[]),  # the MIG-mode GPU itself
    ):
        with pytest.raises(UUIDConflict) as refused:
            send(c, report(device(0, "GPU-a0"), stolen, hostname="gpu-a"))
        assert refused.value.conflicts[0].owner == "gpu-b"
    assert set(served_map(c)["gpu-b"]) == {"GPU-b0", "MIG-aaaa-0001", "MIG-aaaa-0002"}
    assert "gpu-a" not in c.reports


def test_the_conflict_shows_in_doctor_until_the_host_reports_without_it():
    c = agent_cluster()
    send(c, report(device(0, "GPU-b0")))
    send(c, report(device(0, "GPU-a0"), hostname="gpu-a"))
    assert findings(c) == []
    with pytest.raises(UUIDConflict):
        send(c, report(device(0, "GPU-a0"), device(1, "GPU-b0"), hostname="gpu-a"), now=1)
    (f,) = findings(c)
    assert (f.severity, f.host) == ("error", "gpu-a")
    assert f.problem.startswith("its agent's reports are refused since 20")
    assert f.problem.endswith(": GPU-b0 is on gpu-b (by its agent's report), not on gpu-a")
    (x,) = c.uuid_conflicts
    assert (x.host, x.uuid, x.owner, x.listed) == ("gpu-a", "GPU-b0", "gpu-b", False) and x.since <= x.last
    # Refused again: one record, first seen kept.
    with pytest.raises(UUIDConflict):
        send(c, report(device(0, "GPU-a0"), device(1, "GPU-b0"), hostname="gpu-a"), now=2)
    (y,) = c.uuid_conflicts
    assert y.since == x.since and y.last >= x.last
    # Other hosts' reports leave it standing.
    send(c, report(device(0, "GPU-b0", temperature_c=60)), now=3)
    assert len(findings(c)) == 1
    # gpu-a's next report without it is taken, and settles it.
    send(c, report(device(0, "GPU-a0"), hostname="gpu-a"), now=4)
    assert findings(c) == [] and c.conflicts == {}
    assert hosts_of(c) == {"GPU-a0": "gpu-a", "GPU-b0": "gpu-b"}


def test_the_conflict_clears_when_the_owner_no_longer_has_the_uuid_and_the_next_report_is_taken():
    c = agent_cluster()
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1")))
    with pytest.raises(UUIDConflict):
        send(c, report(device(0, "GPU-b1"), hostname="gpu-a"))
    assert len(findings(c)) == 1
    send(c, report(device(0, "GPU-b0")), now=1)  # the GPU left gpu-b
    assert findings(c) == []
    assert hosts_of(c) == {"GPU-b0": "gpu-b"}  # gpu-a has not reported since: it is not offered yet
    send(c, report(device(0, "GPU-b1"), hostname="gpu-a"), now=2)
    assert hosts_of(c) == {"GPU-b0": "gpu-b", "GPU-b1": "gpu-a"}
    assert c.allocator.allocate("s1", Request(model=A100, count=1, host="gpu-a")).uuids == ("GPU-b1",)
    # Now gpu-b may not have it back while gpu-a reports it.
    with pytest.raises(UUIDConflict, match="GPU-b1 is on gpu-a"):
        send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1")), now=3)


def test_a_gpu_that_moved_is_taken_from_a_late_agent_and_its_old_host_may_not_take_it_back():
    c = agent_cluster(stale_intervals=3)
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1"), interval=10), now=0)
    # gpu-b's agent is still in time (30 s): the new host waits.
    with pytest.raises(UUIDConflict):
        send(c, report(device(0, "GPU-b1"), hostname="gpu-a", interval=10), now=30)
    # Late (over 3 × 10 s): the device moves, and the refusal is settled.
    send(c, report(device(0, "GPU-b1"), hostname="gpu-a", interval=10), now=31)
    assert hosts_of(c) == {"GPU-b0": "gpu-b", "GPU-b1": "gpu-a"} and c.conflicts == {}
    assert set(served_map(c)["gpu-b"]) == {"GPU-b0"} and set(served_map(c)["gpu-a"]) == {"GPU-b1"}
    assert sum(len(states) for states in c.states.values()) == 2
    # gpu-b's agent comes back still naming it: refused, gpu-b keeps its last report (now without GPU-b1).
    with pytest.raises(UUIDConflict, match="GPU-b1 is on gpu-a"):
        send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1"), interval=10), now=40)
    assert len(findings(c)) == 1 and findings(c)[0].host == "gpu-b"
    # Once it no longer names it, it is back to normal.
    send(c, report(device(0, "GPU-b0"), interval=10), now=41)
    assert findings(c) == [] and "gpu-b" not in c.stale
    assert hosts_of(c) == {"GPU-b0": "gpu-b", "GPU-b1": "gpu-a"}


def test_a_uuid_dropped_by_its_host_is_free_and_the_same_report_twice_is_not_checked_again():
    c = agent_cluster()
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1")))
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1")), now=1)  # its own UUIDs: never a conflict
    send(c, report(device(0, "GPU-b0")), now=2)
    assert c._owner == {"GPU-b0": "gpu-b"} and c._claims["gpu-b"] == {"GPU-b0"}
    send(c, report(device(0, "GPU-b1"), hostname="gpu-a"), now=3)
    assert c._owner == {"GPU-b0": "gpu-b", "GPU-b1": "gpu-a"}


class _Handler(ReportHandler):
    """ReportHandler.post without a hub: the token is taken as good."""

    def __init__(self, cluster, body: bytes):
        self.request = SimpleNamespace(body=body)
        self._cluster = cluster
        self._holdings = Holdings(cluster, swarm=None)  # holds nothing: reports only feed idle timers
        self.written = None

    async def reporter(self):
        return None  # the shared agent token, allowed

    def gpu_hub(self):
        return SimpleNamespace(holdings=self._holdings, reclaimer=Reclaimer(self._holdings))

    def set_header(self, *args):
        pass

    def write(self, chunk):
        self.written = chunk


def test_the_endpoint_answers_400_with_the_sentence():
    c = agent_cluster()
    c.nodes = {"gpu-a": None, "gpu-b": None}
    ok = _Handler(c, json.dumps(report(device(0, "GPU-b0"))).encode())
    asyncio.run(ok.post())
    assert ok.written == {"hostname": "gpu-b", "devices": 1, "interval": 15}
    bad = _Handler(c, json.dumps(report(device(0, "GPU-b0"), hostname="gpu-a")).encode())
    with pytest.raises(web.HTTPError) as answer:
        asyncio.run(bad.post())
    assert answer.value.status_code == 400
    assert answer.value.log_message.startswith(
        "report refused: GPU-b0 is on gpu-b (by its agent's report), not on gpu-a"
    )
