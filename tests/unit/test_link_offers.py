"""What the form can offer: for each count, the host a request of a model would get
now and how the farthest pair of its set there is linked (Allocator.link_offers),
checked against what allocate() then gives, on the fake NVML's nodes (a DGX-1, NVLink
bridged pairs on two sockets, an NVSwitch box) with GPUs busy in every pattern; and a
decision works each host's set out once."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.bench_topology import NODES, cluster, topology_of
from gpuspawner.allocator import links as links_module
from gpuspawner.allocator.allocator import AllocationRefused, Allocator, Request
from gpuspawner.allocator.fragment import Mix, Placed
from gpuspawner.core.inventory import GPU
from gpuspawner.core.topology import Topology


def fake_cluster(per_kind: int = 2, known: bool = True) -> tuple[list[GPU], dict[str, Topology]]:
    """``per_kind`` nodes of each of the fake NVML's kinds; hosts of kind k are k-0, k-1..."""
    gpus, tops = cluster(per_kind, "{kind}-{n}")
    return gpus, tops if known else {}


def allocator(policy: str, busy: set[int], unknown: set[str] = frozenset()) -> Allocator:
    """The fake cluster with the GPUs numbered in ``busy`` (in inventory order) held."""
    gpus, tops = fake_cluster()
    alloc = Allocator(gpus, policy)
    if policy == "frag":
        alloc.set_mix(Mix.learned([Placed(g.model, (1000, 1000)) for g in gpus[:3]]))
    for host, topology in tops.items():
        if host not in unknown:
            alloc.set_host_topology(host, topology)
    for i in sorted(busy):
        g = gpus[i]
        alloc.adopt(f"busy-{i}", "someone", g.host, [g.uuid])
    return alloc


def models() -> list[str]:
    return sorted({g.model for g in fake_cluster()[0]})


def check_offers_against_allocate(alloc: Allocator) -> int:
    """Each model's offers are what allocate() gives, count by count; how many were checked."""
    checked = 0
    for model in models():
        offers = alloc.link_offers(model)
        block = alloc._index.models[model].largest_block()
        assert set(offers) <= set(range(2, block + 1))
        for n in range(2, block + 1):
            try:
                got = alloc.allocate("probe", Request(model=model, count=n))
            except AllocationRefused:
                assert n not in offers
                continue
            host, worst = offers[n]
            topology = alloc.topology(got.host)
            assert got.host == host
            assert worst == (None if topology is None else topology.worst(got.uuids))
            alloc.release("probe")
            checked += 1
    return checked


@settings(max_examples=60, deadline=None, database=None, derandomize=True)
@given(
    st.sampled_from(["pack", "spread", "frag"]),
    st.sets(st.integers(0, 2 * (8 + 4 + 8) - 1)),
    st.sets(st.sampled_from([f"{k}-{n}" for k in NODES for n in range(2)]), max_size=2),
)
def test_each_offer_is_the_host_and_worst_link_allocate_then_gives(policy, busy, unknown):
    alloc = allocator(policy, busy, unknown)
    check_offers_against_allocate(alloc)


def test_offers_on_an_idle_cluster_name_each_count_up_to_the_largest_free_block():
    alloc = allocator("pack", set())
    offers = alloc.link_offers("Tesla V100-SXM2-32GB")
    assert sorted(offers) == list(range(2, 9))
    host, worst = offers[2]
    assert host.startswith("dgx1-") and worst is not None and worst.nvlinks == 2  # the cube-mesh's doubled pair
    assert offers[8][1] is not None and not offers[8][1].nvlinks  # all 8: some pair only across the CPUs
    assert check_offers_against_allocate(alloc) > 0
    assert alloc.link_offers("no such model") == {}
    plain = allocator("pack", set(), {f"{k}-{n}" for k in NODES for n in range(2)})
    assert {n: w for n, (_, w) in plain.link_offers("NVIDIA RTX A6000").items()} == {2: None, 3: None, 4: None}


def test_a_decision_works_out_each_hosts_set_once(monkeypatch):
    """allocate() ranks the alike hosts by their best set and takes the chosen host's
    set from that ranking, not anew."""
    calls: list[tuple] = []
    real = links_module.best_set

    def counted(m, n, score):
        calls.append((m, n))
        return real(m, n, score)

    monkeypatch.setattr(links_module, "best_set", counted)
    alloc = allocator("pack", {0, 1, 8, 15})  # two DGX-1s with 6 free each (not alike linked): ranked alike
    got = alloc.allocate("s", Request(model="Tesla V100-SXM2-32GB", count=2))
    assert got.host in {"dgx1-0", "dgx1-1"}
    assert len(calls) == 2  # one per host ranked, none more for the one taken


@pytest.mark.parametrize("kind", list(NODES))
def test_every_busy_pattern_of_one_node(kind):
    """On one node of each kind, every pattern of busy GPUs (all 256 of an 8-GPU node)."""
    devices = NODES[kind]("00000000")
    gpus = [GPU("h", d["index"], d["uuid"], d["name"], d["memory_total_mib"]) for d in devices]
    for k in range(len(gpus) + 1):
        for busy in itertools.combinations(range(len(gpus)), k):
            alloc = Allocator(gpus, "pack")
            alloc.set_host_topology("h", topology_of(devices))
            for i in busy:
                alloc.adopt(f"b{i}", "x", "h", [gpus[i].uuid])
            offers = alloc.link_offers(gpus[0].model)
            assert sorted(offers) == list(range(2, len(gpus) - k + 1))
            for n, (host, worst) in offers.items():
                got = alloc.allocate("p", Request(model=gpus[0].model, count=n))
                assert (got.host, worst) == (host, alloc.topology("h").worst(got.uuids))
                alloc.release("p")


@settings(max_examples=40, deadline=None, database=None, derandomize=True)
@given(
    st.sampled_from(["pack", "spread", "frag"]),
    st.sets(st.integers(0, 2 * (8 + 4 + 8) - 1)),
    st.sets(st.sampled_from([f"{k}-{n}" for k in NODES for n in range(2)]), max_size=3),
)
def test_offers_follow_the_spawners_policy_and_the_cpu_its_server_reserves(policy, busy, short):
    """The allocator's own policy is pack; a spawn asks under its own policy and with the
    CPU its server reserves, and the offers the form shows are asked the same way: the
    host named is the one the spawn gets (hosts in ``short`` lack the CPU)."""
    alloc = allocator("pack", busy)
    if policy == "frag":
        alloc.set_mix(Mix.learned([Placed(g.model, (1000, 1000)) for g in fake_cluster()[0][:3]]))
    for host in {g.host for g in fake_cluster()[0]}:
        alloc.set_host_resources(host, 1000 if host in short else 64000, 512000)
    for model in models():
        offers = alloc.link_offers(model, 4000, 1024, policy)
        for n in range(2, alloc._index.models[model].largest_block() + 1):
            try:
                got = alloc.allocate(
                    "probe", Request(model=model, count=n, cpu_milli=4000, memory_mib=1024), policy=policy
                )
            except AllocationRefused:
                assert n not in offers
                continue
            assert got.host not in short
            assert offers[n][0] == got.host
            alloc.release("probe")
