"""How a node's GPUs are linked, as gpuspawner-agent reads it through the real pynvml
bindings over the fake libnvidia-ml.so.1 (DGX-1, NVLink-bridged PCIe pairs, NVSwitch),
and as the hub takes it: validated in the report, then placing multi-GPU requests.

Guards docs/topology.md: "a node whose driver lacks a call reports what it has, and the
rest as unknown, never as no link", and "MIG devices have no links"."""

from __future__ import annotations

import json

import pytest

from devtools import fakenvml
from devtools.fakenvml import topologies
from devtools.fakenvml.nodes import MIXED_NODE
from gpuspawner.allocator.allocator import Allocator, Request
from gpuspawner.core.inventory import GPU
from gpuspawner.core.reports import ReportError, parse_report
from gpuspawner.core.topology import Path
from tests.unit.test_agent_fake_nvml import run_agent
from tests.unit.test_linked import DGX1_VOLTA


def probe(tmp_path, lib_dir, devices: list[dict]) -> dict:
    path = fakenvml.write_devices(tmp_path / "devices.txt", devices)
    proc = run_agent(["probe"], lib_dir, path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def body(report: dict, host: str = "gpu-a") -> str:
    return json.dumps(dict(report, hostname=host, interval=15))


def test_a_dgx1_reports_its_cube_mesh_and_the_hub_places_a_pair_on_two_nvlinks(tmp_path, fake_lib_dir):
    devices = topologies.dgx1()
    report = probe(tmp_path, fake_lib_dir, devices)
    uuids = [d["uuid"] for d in devices]
    links = {(u.index(x["a"]) if (u := uuids) else 0, uuids.index(x["b"])): x for x in report["topology"]["links"]}
    assert len(links) == 28
    assert links[(0, 3)]["nvlinks"] == 2 and links[(0, 1)]["nvlinks"] == 1 and links[(0, 5)]["nvlinks"] == 0
    assert links[(0, 1)]["path"] == 10 and links[(0, 2)]["path"] == 30 and links[(3, 4)]["path"] == 50
    assert report["topology"]["numa"] == {u: i // 4 for i, u in enumerate(uuids)}
    topology = parse_report(body(report)).topology
    assert topology is not None
    for a in range(8):
        for b in range(a + 1, 8):  # the same as the device plugin's DGX-1, link for link
            assert topology.link(uuids[a], uuids[b]) == DGX1_VOLTA.link(f"GPU-{a}", f"GPU-{b}"), (a, b)
    alloc = Allocator([GPU("gpu-a", i, u, topologies.V100, 32768) for i, u in enumerate(uuids)])
    alloc.set_host_topology("gpu-a", topology)
    assert alloc.allocate("s", Request(count=2)).uuids == (uuids[0], uuids[3])


def test_bridged_pairs_and_an_nvswitch_box(tmp_path, fake_lib_dir):
    pairs = probe(tmp_path, fake_lib_dir, topologies.pcie_pairs())["topology"]
    nvlinks = {(x["a"][-1], x["b"][-1]): x["nvlinks"] for x in pairs["links"]}
    assert nvlinks == {("0", "1"): 4, ("0", "2"): 0, ("0", "3"): 0, ("1", "2"): 0, ("1", "3"): 0, ("2", "3"): 4}
    switch = probe(tmp_path, fake_lib_dir, topologies.nvswitch())["topology"]
    assert {x["nvlinks"] for x in switch["links"]} == {18}  # every pair through the switches alike


@pytest.mark.parametrize("kind", ["dgx1", "pcie_pairs", "nvswitch"])
def test_the_topology_benchmark_counts_links_as_the_agent_reads_them(tmp_path, fake_lib_dir, kind):
    """The benchmark builds its nodes' topologies from the fake NVML's devices with the
    agent's own counting (nvlinks_between): the same as the agent reports over the fake
    libnvidia-ml.so.1."""
    from benchmarks.bench_topology import topology_of

    devices = getattr(topologies, kind)()
    assert parse_report(body(probe(tmp_path, fake_lib_dir, devices))).topology == topology_of(devices)


def test_what_a_node_cannot_say_stays_unknown_and_mig_and_lost_gpus_have_no_links(tmp_path, fake_lib_dir):
    """MIXED_NODE's driver answers "not supported" for the PCIe paths and NUMA nodes,
    and has no NVLink: paths unknown, no NVLinks, no NUMA node; its lost GPU and its
    MIG-mode A100 are not in the topology."""
    report = probe(tmp_path, fake_lib_dir, MIXED_NODE)
    whole = [d["uuid"] for d in MIXED_NODE if not d.get("lost") and not d.get("mig")]
    named = {u for x in report["topology"]["links"] for u in (x["a"], x["b"])}
    assert named == set(whole)
    assert {(x["path"], x["nvlinks"]) for x in report["topology"]["links"]} == {(None, 0)}
    assert report["topology"]["numa"] == {}
    topology = parse_report(body(report)).topology
    assert topology.link(whole[0], whole[1]).words == "unknown"


def test_a_dgx1_whose_driver_cannot_trace_links_reports_them_unknown(tmp_path, fake_lib_dir):
    devices = [{k: v for k, v in d.items() if k != "bus"} for d in topologies.dgx1()]  # no PCI bus ids
    report = probe(tmp_path, fake_lib_dir, devices)
    assert {x["nvlinks"] for x in report["topology"]["links"]} == {None}  # links exist, peers unknown
    assert Path(report["topology"]["links"][0]["path"]) is Path.SWITCH


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            lambda t, u: t["links"].__setitem__(-1, dict(t["links"][0], a=t["links"][0]["b"], b=t["links"][0]["a"])),
            "listed twice",
        ),
        (lambda t, u: t["links"][0].update(path=25), "NVML's topology levels"),
        (lambda t, u: t["links"][0].update(nvlinks=37), "from 0 to 36"),
        (lambda t, u: t["links"][0].update(b="GPU-00000000-0000-4000-8000-000000000000"), "two GPUs of this node"),
        (lambda t, u: t["links"][0].update(b=t["links"][0]["a"]), "two GPUs of this node"),
        (lambda t, u: t["numa"].update({u[0]: -1}), "NUMA node from 0"),
        (lambda t, u: t.update(links=[t["links"][0]] * 29), "at most 28 pairs"),
        (lambda t, u: t.update(extra=1), "links and numa"),
    ],
    ids=["twice", "level", "nvlinks", "stranger", "itself", "numa", "oversized", "extra"],
)
def test_a_malformed_topology_is_refused_with_the_field_named(tmp_path, fake_lib_dir, change, words):
    report = probe(tmp_path, fake_lib_dir, topologies.dgx1())
    change(report["topology"], [d["uuid"] for d in report["devices"]])
    with pytest.raises(ReportError, match=words):
        parse_report(body(report))


async def test_the_allocation_map_shows_each_gpus_links_and_numa_node(tmp_path, fake_lib_dir):
    """Guards docs/topology.md, "Where you see it": the allocation map "lists, for each
    GPU, its links to the others of its node and its NUMA node"."""
    from gpuspawner.cluster.cluster import GPUCluster, InventorySettings

    devices = topologies.dgx1()
    report = probe(tmp_path, fake_lib_dir, devices)
    cluster = GPUCluster(InventorySettings(sources=("agent",)))
    cluster.receive(parse_report(body(report)), now=0.0)
    host = json.loads(await cluster.views.alloc_map_json())["gpu-a"]
    first = host[devices[0]["uuid"]]
    assert first["numa_node"] == 0 and len(first["links"]) == 7
    assert first["links"][devices[3]["uuid"]] == "2 NVLinks" and first["links"][devices[5]["uuid"]] == "across CPUs"
    plain = GPUCluster(InventorySettings(sources=("agent",)))
    plain.receive(parse_report(body({k: v for k, v in report.items() if k != "topology"})), now=0.0)
    assert "links" not in json.loads(await plain.views.alloc_map_json())["gpu-a"][devices[0]["uuid"]]


def test_a_servers_numa_nodes_are_told_only_when_its_node_reported_every_one():
    from gpuspawner.core.topology import Topology, numa_env

    topology = Topology(numa={"GPU-a": 0, "GPU-b": 1})
    assert numa_env(topology, ["GPU-b", "GPU-a"]) == {"GPUSPAWNER_GPU_NUMA_NODES": "1,0"}
    assert numa_env(topology, ["GPU-a", "GPU-c"]) == {}  # one not known: nothing said
    assert numa_env(None, ["GPU-a"]) == {} and numa_env(topology, []) == {}


def test_the_largest_node_with_every_pairs_links_fits_in_a_report():
    """64 whole GPUs (the most a report lists) with the links of all 2,016 pairs and their
    NUMA nodes, as the agent encodes it, is taken: the report's size limit leaves room."""
    from gpuspawner.agent.report import encode_report
    from gpuspawner.core.reports import MAX_DEVICES, MAX_REPORT_BYTES

    uuids = [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(MAX_DEVICES)]
    devices = [
        {"index": i, "uuid": u, "name": topologies.V100, "memory_total_mib": 32768, "memory_used_mib": 0,
         "utilization_gpu": 0, "temperature_c": 40.0, "ecc_uncorrected": 0, "lost": False, "processes": [],
         "mig_mode": False, "mig_devices": [], "healthy": True, "problems": []}
        for i, u in enumerate(uuids)
    ]  # fmt: skip
    links = [{"a": a, "b": b, "path": 50, "nvlinks": 12} for i, a in enumerate(uuids) for b in uuids[i + 1 :]]
    topology = {"links": links, "numa": {u: i // 32 for i, u in enumerate(uuids)}}
    body = encode_report({"devices": devices, "topology": topology}, "gpu-a", 15.0)
    assert len(body) < MAX_REPORT_BYTES
    assert len(parse_report(body).topology.links) == 2016
