"""A UUID belongs to one host: a report naming a UUID another host has (by the
static inventory or by that host's report) has that device left out, and only
that device; the conflict shows in doctor until it is settled; a GPU that
really moved is taken by its new host once its old host no longer names it or
is no longer a node of the swarm. A late agent is not enough: a leaked node
token cannot take another node's devices, nor get its reports refused.

Guards docs/nodes.md, "Where the hub learns the GPUs": "is left out of the report, and
only that device" and "a late agent does not let another node take its GPUs"."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

from gpuspawner.allocator.allocator import Request
from gpuspawner.cluster.cluster import GPUCluster, InventorySettings
from gpuspawner.cluster.doctor import diagnose
from gpuspawner.cluster.swarm import Node
from gpuspawner.core.inventory import GPU
from gpuspawner.core.reports import parse_report
from gpuspawner.holdings.holdings import Holdings
from gpuspawner.reclaim.reclaimer import Reclaimer
from gpuspawner.web.api import ReportHandler
from tests.unit.test_cluster_views import served_map
from tests.unit.test_reports import A100, MIG, device, report

FIX = "the same UUID on two nodes: a copied inventory or a spoofed agent; check nvidia-smi -L on both"


def agent_cluster(**kw) -> GPUCluster:
    return GPUCluster(InventorySettings(sources=("agent",), **kw))


def send(cluster, body, now=0.0):
    """The UUIDs the cluster left out of the report."""
    return [c.uuid for c in cluster.receive(parse_report(json.dumps(body)), now=now)]


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


def test_a_report_naming_another_hosts_uuid_has_that_device_left_out_and_the_rest_taken():
    c = agent_cluster()
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1")))
    send(c, report(device(0, "GPU-a0"), hostname="gpu-a"))
    left_out = send(c, report(device(0, "GPU-a0"), device(1, "GPU-b1"), device(2, "GPU-a2"), hostname="gpu-a"), now=1)
    assert left_out == ["GPU-b1"]
    assert c.reports["gpu-a"][1] == 1  # taken: a report in time
    assert hosts_of(c) == {"GPU-a0": "gpu-a", "GPU-a2": "gpu-a", "GPU-b0": "gpu-b", "GPU-b1": "gpu-b"}
    assert set(served_map(c)["gpu-b"]) == {"GPU-b0", "GPU-b1"} and set(served_map(c)["gpu-a"]) == {"GPU-a0", "GPU-a2"}
    (x,) = c.uuid_conflicts
    assert x.sentence() == "GPU-b1 is on gpu-b (by its agent's report), not on gpu-a"
    # Allocations pinned to gpu-b get gpu-b's own devices.
    for name in ("s1", "s2"):
        alloc = c.allocator.allocate(name, Request(model=A100, count=1, host="gpu-b"))
        assert hosts_of(c)[alloc.uuids[0]] == "gpu-b"
    # gpu-b's own reports go on as before.
    assert send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1", temperature_c=50)), now=2) == []
    assert hosts_of(c)["GPU-b1"] == "gpu-b"


def test_every_conflicting_uuid_is_named():
    c = agent_cluster()
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1")))
    assert send(c, report(device(0, "GPU-b1"), device(1, "GPU-b0"), hostname="gpu-a")) == ["GPU-b0", "GPU-b1"]
    assert [(x.host, x.uuid, x.owner) for x in c.uuid_conflicts] == [
        ("gpu-a", "GPU-b0", "gpu-b"),
        ("gpu-a", "GPU-b1", "gpu-b"),
    ]
    assert "gpu-a" not in served_map(c) or served_map(c)["gpu-a"] == {}


def test_a_uuid_listed_in_the_static_inventory_is_never_taken_by_another_host():
    static = (GPU("gpu-b", 0, "GPU-b0", A100, 81920),)
    c = GPUCluster(InventorySettings(static=static, sources=("static", "agent")))
    assert send(c, report(device(0, "GPU-b0"), device(1, "GPU-a1"), hostname="gpu-a")) == ["GPU-b0"]
    assert hosts_of(c) == {"GPU-b0": "gpu-b", "GPU-a1": "gpu-a"}
    assert c.uuid_conflicts[0].sentence() == "GPU-b0 is on gpu-b (in the static inventory), not on gpu-a"
    # The file decides, however late anything is.
    assert send(c, report(device(0, "GPU-b0"), hostname="gpu-a"), now=10_000) == ["GPU-b0"]
    # The listed host's own agent reports it as usual.
    send(c, report(device(0, "GPU-b0", ecc_uncorrected=1)), now=10_001)
    assert served_map(c)["gpu-b"]["GPU-b0"]["health"] == "unhealthy"
    # Without 'static' as a source the file does not count.
    c2 = GPUCluster(InventorySettings(static=static, sources=("agent",)))
    assert send(c2, report(device(0, "GPU-b0"), hostname="gpu-a")) == []
    assert hosts_of(c2) == {"GPU-b0": "gpu-a"}


def test_mig_uuids_and_the_parent_gpu_uuid_belong_to_their_host():
    c = agent_cluster()
    send(c, report(device(0, "GPU-b0"), MIG))
    for stolen in (
        device(1, "GPU-a1", mig_mode=True, mig_devices=[dict(MIG["mig_devices"][1])]),  # a MIG UUID of gpu-b
        device(1, "GPU-a100-mig", mig_mode=True, mig_devices=[dict(MIG["mig_devices"][0], uuid="MIG-new")]),
    ):
        left_out = send(c, report(device(0, "GPU-a0"), stolen, hostname="gpu-a"))
        assert c.uuid_conflicts[0].owner == "gpu-b" and left_out
        assert set(served_map(c)["gpu-a"]) == {"GPU-a0"}  # the whole device is left out, MIG devices and all
    assert set(served_map(c)["gpu-b"]) == {"GPU-b0", "MIG-aaaa-0001", "MIG-aaaa-0002"}


def test_the_conflict_shows_in_doctor_until_the_host_reports_without_it():
    """Guards docs/security.md, "A node's agent token": "and doctor lists the conflict"."""
    c = agent_cluster()
    send(c, report(device(0, "GPU-b0")))
    send(c, report(device(0, "GPU-a0"), hostname="gpu-a"))
    assert findings(c) == []
    send(c, report(device(0, "GPU-a0"), device(1, "GPU-b0"), hostname="gpu-a"), now=1)
    (f,) = findings(c)
    assert (f.severity, f.host) == ("error", "gpu-a")
    assert f.problem.startswith("its agent's reports name a device another node has, left out since 20")
    assert f.problem.endswith(": GPU-b0 is on gpu-b (by its agent's report), not on gpu-a")
    (x,) = c.uuid_conflicts
    assert (x.host, x.uuid, x.owner, x.listed) == ("gpu-a", "GPU-b0", "gpu-b", False) and x.since <= x.last
    # Named again: one record, first seen kept.
    send(c, report(device(0, "GPU-a0"), device(1, "GPU-b0"), hostname="gpu-a"), now=2)
    (y,) = c.uuid_conflicts
    assert y.since == x.since and y.last >= x.last
    # Other hosts' reports leave it standing.
    send(c, report(device(0, "GPU-b0", temperature_c=60)), now=3)
    assert len(findings(c)) == 1
    # gpu-a's next report without it settles it.
    send(c, report(device(0, "GPU-a0"), hostname="gpu-a"), now=4)
    assert findings(c) == [] and c.conflicts == {}
    assert hosts_of(c) == {"GPU-a0": "gpu-a", "GPU-b0": "gpu-b"}


def test_the_conflict_clears_when_the_owner_no_longer_has_the_uuid_and_the_next_report_takes_it():
    """Guards docs/reliability.md, "The fault model": "A GPU moves only when the node that has it no
    longer names it"."""
    c = agent_cluster()
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1")))
    assert send(c, report(device(0, "GPU-b1"), hostname="gpu-a")) == ["GPU-b1"]
    assert len(findings(c)) == 1
    send(c, report(device(0, "GPU-b0")), now=1)  # the GPU left gpu-b
    assert findings(c) == []
    assert hosts_of(c) == {"GPU-b0": "gpu-b"}  # gpu-a has not reported since: it is not offered yet
    assert send(c, report(device(0, "GPU-b1"), hostname="gpu-a"), now=2) == []
    assert hosts_of(c) == {"GPU-b0": "gpu-b", "GPU-b1": "gpu-a"}
    assert c.allocator.allocate("s1", Request(model=A100, count=1, host="gpu-a")).uuids == ("GPU-b1",)
    # Now gpu-b may not have it back while gpu-a reports it; the rest of gpu-b's report is taken.
    assert send(c, report(device(0, "GPU-b0", temperature_c=55), device(1, "GPU-b1")), now=3) == ["GPU-b1"]
    assert served_map(c)["gpu-b"]["GPU-b0"]["temperature_c"] == 55


def test_a_leaked_token_cannot_take_a_late_nodes_gpus_or_get_its_reports_refused():
    """gpu-b's agent is late (restarting); a report under gpu-a's token names one of
    gpu-b's UUIDs. It is left out: nothing moves, and gpu-b's next report is taken
    whole, every one of its GPUs offered again.

    Guards docs/security.md, "A node's agent token": "take another node's GPU by naming its UUID,
    even while that node's agent is late".

    Guards docs/reliability.md, "The fault model": "a late agent does not let another node take its
    GPUs"."""
    c = agent_cluster(stale_intervals=3)
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1"), interval=10), now=0)
    assert send(c, report(device(0, "GPU-b1"), hostname="gpu-a", interval=10), now=100) == ["GPU-b1"]
    assert hosts_of(c)["GPU-b1"] == "gpu-b" and "GPU-b1" not in served_map(c).get("gpu-a", {})
    assert send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1"), interval=10), now=101) == []
    assert "gpu-b" not in c.stale and set(served_map(c)["gpu-b"]) == {"GPU-b0", "GPU-b1"}
    assert c.allocator.allocate("s", Request(model=A100, count=2, host="gpu-b")).host == "gpu-b"


class _Nodes:
    """The swarm's node list, as GPUCluster.refresh reads it (a stand-in)."""

    def __init__(self, *hosts):
        self.hosts = hosts

    async def nodes(self):
        return [
            Node(id=h, hostname=h, addr="10.0.0.1", ready=True, availability="active", generic_resources=())
            for h in self.hosts
        ]


def test_a_gpu_that_moved_from_a_node_that_left_the_swarm_is_taken_by_its_new_node(caplog):
    """Guards docs/reliability.md, "The fault model": "or has left the swarm"."""
    caplog.set_level(logging.INFO)
    c = agent_cluster(stale_intervals=3)
    asyncio.run(c.refresh(_Nodes("gpu-a", "gpu-b"), logging.getLogger("test")))
    send(c, report(device(0, "GPU-b0"), device(1, "GPU-b1"), interval=10), now=0)
    assert send(c, report(device(0, "GPU-b1"), hostname="gpu-a", interval=10), now=1000) == ["GPU-b1"]
    c._nodes_at = 0.0  # the node list is read again at the next look
    asyncio.run(c.refresh(_Nodes("gpu-a"), logging.getLogger("test")))  # the admin removed gpu-b's node
    assert "gpu-b is no longer a node of the swarm" in caplog.text
    assert send(c, report(device(0, "GPU-b1"), hostname="gpu-a", interval=10), now=1001) == []
    assert hosts_of(c) == {"GPU-b1": "gpu-a"} and c.conflicts == {}


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
        return SimpleNamespace(
            holdings=self._holdings, reclaimer=Reclaimer(self._holdings), enforcement_seen=lambda report: None
        )

    def set_header(self, *args):
        pass

    def write(self, chunk):
        self.written = chunk


def test_the_endpoint_takes_the_report_and_names_what_it_left_out():
    c = agent_cluster()
    c.nodes = {"gpu-a": None, "gpu-b": None}
    ok = _Handler(c, json.dumps(report(device(0, "GPU-b0"))).encode())
    asyncio.run(ok.post())
    assert ok.written == {"hostname": "gpu-b", "devices": 1, "interval": 15, "left_out": []}
    other = _Handler(c, json.dumps(report(device(0, "GPU-b0"), device(1, "GPU-a1"), hostname="gpu-a")).encode())
    asyncio.run(other.post())
    assert other.written["left_out"] == ["GPU-b0 is on gpu-b (by its agent's report), not on gpu-a"]
    assert hosts_of(c) == {"GPU-b0": "gpu-b", "GPU-a1": "gpu-a"}
