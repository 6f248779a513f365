"""The link class an admin may require of a multi-GPU server's set (gpu_link_required,
core/link_classes.py): what meets each class, and that placement, refusals and the
line's plan all hold to it, against a brute force over every set of every host of
clusters of the fake NVML's nodes (a DGX-1, NVLink-bridged pairs on two sockets, an
NVSwitch box) with GPUs busy in every pattern.

Guards docs/topology.md, "What the admin can require": "nvlink: every pair of the set
joined by at least one NVLink", "switch: every pair behind one PCIe switch (or on one
board), or joined by NVLink", "cpu: every pair on one CPU socket (any PCIe path short of
crossing to the other socket), or joined by NVLink", "The model's own entry goes first
(its count, then its "*"), then "*"'s", "A request for all GPUs of one host is held to the
class for that many", "A pair whose links the node could not find out meets nothing it
is not known to meet, and a host whose links are not known has no such set", "A request
of that model and count then gets only a set that meets the class, on any host that has
one free: the set it would get anyway where that one meets the class, else the best
linked of those that do", "are given only as GPUs joined by NVLink, and no host has 2
such free now", "When some host has such a set, free or not, it may wait in line (a
refusal for now, 409); when no host's links have one at all, it is refused as never
possible (400)", "no host has 4 so linked" and "The line plans a waiter only on a host
that has such a set, free or not, and counts what that host lacks as the fewest GPUs that
must free up before one such set is all free"."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.bench_topology import NODES, topology_of
from gpuspawner.allocator.allocator import AllocationRefused, Allocator, Request
from gpuspawner.allocator.fragment import Mix, Placed
from gpuspawner.allocator.linked import best_set, fewest_missing, required_set
from gpuspawner.allocator.refusals import Refusal
from gpuspawner.core.inventory import GPU
from gpuspawner.core.link_classes import LinkClass, LinkRequired, parse_link_required
from gpuspawner.core.topology import Link, Path
from tests.unit.test_link_offers import fake_cluster

RTX = "NVIDIA RTX A6000"
NVLINK, SWITCH, CPU = LinkClass.NVLINK, LinkClass.SWITCH, LinkClass.CPU


@pytest.mark.parametrize(
    ("link", "met"),
    [
        (Link(Path.CROSS_CPU, 1), {NVLINK, SWITCH, CPU}),
        (Link(None, 2), {NVLINK, SWITCH, CPU}),
        (Link(Path.BOARD, 0), {SWITCH, CPU}),
        (Link(Path.SWITCH, None), {SWITCH, CPU}),
        (Link(Path.SWITCHES, 0), {CPU}),
        (Link(Path.BRIDGE, 0), {CPU}),
        (Link(Path.CPU, None), {CPU}),
        (Link(Path.CROSS_CPU, 0), set()),
        (Link(Path.CROSS_CPU, None), set()),
        (Link(None, 0), set()),
        (Link(None, None), set()),
    ],
)
def test_what_meets_each_class(link, met):
    assert {c for c in LinkClass if c.met_by(link)} == met


def test_the_models_own_entry_goes_first_then_stars():
    required = LinkRequired({"A": {4: NVLINK, "*": SWITCH}, "*": {2: CPU, 8: NVLINK}})
    assert [required.of("A", n) for n in (1, 2, 3, 4, 8)] == [None, SWITCH, SWITCH, NVLINK, SWITCH]
    assert [required.of("B", n) for n in (1, 2, 3, 8)] == [None, CPU, None, NVLINK]
    assert parse_link_required({"big": {2: "cpu"}}, {"NVIDIA A100 80GB PCIe": "big"}).of("big", 2) is CPU
    assert (
        parse_link_required({"NVIDIA A100 80GB PCIe": {2: "cpu"}}, {"NVIDIA A100 80GB PCIe": "big"}).of("big", 2) is CPU
    )
    assert not parse_link_required({}) and not parse_link_required(None)


def pairs(s):
    return itertools.combinations(s, 2)


def random_pairs(m: int, draw):
    links = [draw(st.sampled_from(LINKS)) for _ in range(m * m)]
    return lambda a, b: links[min(a, b) * m + max(a, b)]


LINKS = [Link(p, k) for p in [*Path, None] for k in (0, 1, 2, None)]


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.data(), st.integers(2, 7), st.sampled_from(list(LinkClass)))
def test_the_set_meets_the_class_iff_some_set_does_against_brute_force(data, m, need):
    n = data.draw(st.integers(2, m))
    link = random_pairs(m, data.draw)
    score = lambda a, b: link(a, b).score  # noqa: E731
    meets = lambda a, b: need.met_by(link(a, b))  # noqa: E731
    sets = [s for s in itertools.combinations(range(m), n) if all(meets(a, b) for a, b in itertools.combinations(s, 2))]
    chosen = required_set(m, n, score, meets)
    assert (fewest_missing(m, n, meets, set(range(m))) == 0) == bool(sets) == (chosen is not None)
    if chosen is not None:
        assert chosen in sets
        plain = best_set(m, n, score)
        if plain in sets:  # what would be taken anyway, where it meets the class
            assert chosen == plain
        else:  # else the best linked of those that do
            key = lambda s: (min(map(score, *zip(*pairs(s)))), sum(map(score, *zip(*pairs(s)))))  # noqa: E731
            assert key(chosen) == max(key(s) for s in sets)
    free = set(data.draw(st.sets(st.integers(0, m - 1))))
    fewest = min((len(set(s) - free) for s in sets), default=None)
    assert fewest_missing(m, n, meets, free) == fewest


# -- placement, refusals and the line on clusters of the fake NVML's nodes ---------------

GPUS, TOPOLOGIES = fake_cluster()
MODELS = sorted({g.model for g in GPUS})


def meeting_sets(alloc: Allocator, host: str, model: str, n: int, need: LinkClass, uuids: set[str]) -> list:
    """Brute force: the sets of ``n`` of ``uuids`` (GPUs of ``model`` on ``host``) whose every pair meets."""
    topology = alloc.topology(host)
    if topology is None:
        return []
    mine = sorted(g.uuid for g in GPUS if g.host == host and g.model == model and g.uuid in uuids)
    return [
        s
        for s in itertools.combinations(mine, n)
        if all(need.met_by(topology.link(a, b)) for a, b in itertools.combinations(s, 2))
    ]


def cluster(policy: str, busy: set[int], unknown: set[str], required: LinkRequired) -> Allocator:
    alloc = Allocator(GPUS, policy)
    if policy == "frag":
        alloc.set_mix(Mix.learned([Placed(m, (1000,) * k) for m in MODELS for k in (1, 2, 4)]))
    for host, topology in TOPOLOGIES.items():
        if host not in unknown:
            alloc.set_host_topology(host, topology)
    alloc.set_link_required(required)
    for i in sorted(busy):
        alloc.adopt(f"busy-{i}", "someone", GPUS[i].host, [GPUS[i].uuid])
    return alloc


requirements = st.dictionaries(
    st.sampled_from([*MODELS, "*"]),
    st.dictionaries(st.sampled_from([2, 3, 4, 5, 8, "*"]), st.sampled_from([c.value for c in LinkClass]), min_size=1),
    max_size=3,
).map(parse_link_required)


@settings(max_examples=70, deadline=None, database=None, derandomize=True)
@given(
    st.sampled_from(["pack", "spread", "frag"]),
    st.sets(st.integers(0, len(GPUS) - 1)),
    st.sets(st.sampled_from(sorted(TOPOLOGIES)), max_size=2),
    requirements,
)
def test_a_request_is_placed_iff_some_host_has_a_set_that_meets_the_class_and_the_line_agrees(
    policy, busy, unknown, required
):
    alloc = cluster(policy, busy, unknown, required)
    hosts = sorted(TOPOLOGIES)
    for model in MODELS:
        for n in range(2, 9):
            need = required.of(model, n)
            request = Request(model=model, count=n)
            free = {u for u, held in alloc.model_devices(model).items() if not held}
            planned = alloc.nearest_host(request)
            try:
                got = alloc.allocate("probe", request)
            except AllocationRefused as exc:
                got, refused = None, exc
            if need is None:
                if got is not None:
                    alloc.release("probe")
                continue
            can_now = {h for h in hosts if meeting_sets(alloc, h, model, n, need, free)}
            ever = {h: meeting_sets(alloc, h, model, n, need, {g.uuid for g in GPUS}) for h in hosts}
            assert (got is not None) == bool(can_now)
            if got is not None:
                assert got.host in can_now and tuple(sorted(got.uuids)) in meeting_sets(
                    alloc, got.host, model, n, need, set(got.uuids)
                )
                alloc.release("probe")
            else:
                assert refused.reason in (Refusal.NOT_LINKED_NOW, Refusal.NEVER_LINKED, Refusal.NO_HOST_BIG_ENOUGH)
                # A host with enough GPUs whose links are not known may have such a set.
                maybe = {h for h in unknown if sum(g.host == h and g.model == model for g in GPUS) >= n}
                assert refused.retry == (any(ever.values()) or bool(maybe)), refused.message
                if refused.reason is not Refusal.NO_HOST_BIG_ENOUGH:
                    assert f"{n} × {model} are given only as {need.words}" in refused.message
            # The line's plan: a host that has such a set, lacking the fewest GPUs for one.
            lacks = {h: min(len(set(s) - free) for s in sets) for h, sets in ever.items() if sets}
            if not lacks:
                assert planned is None
            else:
                assert planned in lacks and lacks[planned] == min(lacks.values())


@pytest.mark.parametrize("kind", list(NODES))
@pytest.mark.parametrize("need", list(LinkClass))
def test_every_busy_pattern_of_one_node_for_every_count(kind, need):
    devices = NODES[kind]("00000000")
    gpus = [GPU("h", d["index"], d["uuid"], d["name"], d["memory_total_mib"]) for d in devices]
    topology = topology_of(devices)
    model = gpus[0].model
    alloc = Allocator(gpus, "pack")
    alloc.set_host_topology("h", topology)
    alloc.set_link_required(LinkRequired({"*": {"*": need}}))

    def meet(s) -> bool:
        return all(need.met_by(topology.link(a, b)) for a, b in itertools.combinations(s, 2))

    for k in range(len(gpus) - 1):
        for busy in itertools.combinations(range(len(gpus)), k):
            for i in busy:
                alloc.adopt(f"b{i}", "x", "h", [gpus[i].uuid])
            free = [g.uuid for i, g in enumerate(gpus) if i not in busy]
            for n in range(2, len(free) + 1):
                some = any(meet(s) for s in itertools.combinations(free, n))
                try:
                    got = alloc.allocate("p", Request(model=model, count=n))
                except AllocationRefused:
                    assert not some, (busy, n)
                    continue
                assert some and meet(got.uuids), (busy, n)
                alloc.release("p")
            for i in busy:
                alloc.release(f"b{i}")


def rtx_pair(busy: set[int], required=None, unknown=()) -> Allocator:
    """Two RTX A6000 workstations (GPUs 0-1 and 2-3 NVLink-bridged, each pair on one of
    two CPUs), pairs-0's GPUs numbered 0-3, pairs-1's 4-7."""
    gpus = [g for g in GPUS if g.model == RTX]
    alloc = Allocator(gpus, "pack")
    for host in ("pairs-0", "pairs-1"):
        if host not in unknown:
            alloc.set_host_topology(host, TOPOLOGIES[host])
    alloc.set_link_required(parse_link_required({RTX: {2: "nvlink"}}) if required is None else required)
    for i in busy:
        alloc.adopt(f"b{i}", "x", gpus[i].host, [gpus[i].uuid])
    return alloc


def test_the_refusal_names_the_class_and_what_the_host_with_most_free_has():
    alloc = rtx_pair({1, 3, 4, 5, 6, 7})  # pairs-0 has 0 and 2 free: across the CPUs
    with pytest.raises(AllocationRefused) as refused:
        alloc.allocate("s", Request(model=RTX, count=2))
    assert refused.value.message == (
        "2 × NVIDIA RTX A6000 are given only as GPUs joined by NVLink, and no host has 2 such free now "
        "(pairs-0 has 2 free, across CPUs)"
    )
    assert refused.value.reason is Refusal.NOT_LINKED_NOW and refused.value.status == 409
    alloc.release("b1")  # 0-1 free: an NVLink pair
    assert alloc.allocate("s", Request(model=RTX, count=2)).uuids == tuple(g.uuid for g in GPUS[16:18])


def test_a_class_no_hosts_links_have_is_refused_for_good():
    alloc = rtx_pair(set(), parse_link_required({"*": {3: "switch", 2: "nvlink"}}))
    with pytest.raises(AllocationRefused) as refused:
        alloc.allocate("s", Request(model=RTX, count=3))
    assert refused.value.message == (
        "3 × NVIDIA RTX A6000 are given only as GPUs behind one PCIe switch or joined by NVLink, "
        "and no host has 3 so linked"
    )
    assert refused.value.reason is Refusal.NEVER_LINKED and refused.value.status == 400
    alloc.allocate("s", Request(model=RTX, count=2))  # a pair is, though
    with pytest.raises(AllocationRefused) as four:
        rtx_pair(set(), parse_link_required({RTX: {4: "nvlink"}})).allocate("s", Request(model=RTX, count=4))
    assert four.value.message.endswith("no host has 4 so linked") and four.value.status == 400


def test_a_host_whose_links_are_not_known_gives_no_such_set_and_the_line_plans_elsewhere():
    """pairs-0 has all four free but did not say how they are linked; pairs-1 has all
    four busy: the request waits, planned on pairs-1.

    Guards docs/topology.md, "What the admin can require": "A host with enough GPUs whose
    links are not known yet counts as one that may have such a set"."""
    alloc = rtx_pair({4, 5, 6, 7}, unknown={"pairs-0"})
    with pytest.raises(AllocationRefused) as refused:
        alloc.allocate("s", Request(model=RTX, count=2))
    assert refused.value.message.endswith("(pairs-0 has 4 free, links not known)")
    assert refused.value.retry
    assert alloc.nearest_host(Request(model=RTX, count=2)) == "pairs-1"
    assert alloc.planner()(Request(model=RTX, count=2), frozenset()) == "pairs-1"
    plain = rtx_pair({4, 5, 6, 7}, LinkRequired(), unknown={"pairs-0"})
    assert plain.allocate("s", Request(model=RTX, count=2)).host == "pairs-0"  # without a class required
    only_unknown = rtx_pair({4, 5, 6, 7}, unknown={"pairs-0", "pairs-1"})
    with pytest.raises(AllocationRefused) as unknown:
        only_unknown.allocate("s", Request(model=RTX, count=2))
    # No host is known to have such a set, but none is known not to: "could not find out"
    # is not "never", so the request may wait (its node's next report may say the links).
    assert unknown.value.reason is Refusal.NOT_LINKED_NOW and unknown.value.retry
    assert only_unknown.nearest_host(Request(model=RTX, count=2)) is None


def test_a_host_kept_for_the_line_or_short_of_cpu_is_told_as_before():
    """A set that meets the class on a host kept for those ahead in line: that is what
    the refusal says."""
    alloc = rtx_pair({1, 3, 5, 7})  # pairs-0: 0, 2 free (across); pairs-1: 4, 6 free (across)
    alloc.release("b1")  # pairs-0: 0-1 free
    with pytest.raises(AllocationRefused) as refused:
        alloc.allocate("s", Request(model=RTX, count=2, avoid=frozenset({"pairs-0"})))
    assert refused.value.reason is Refusal.HELD_FOR_LINE and "pairs-0" in refused.value.message


def test_all_gpus_of_a_host_are_held_to_the_class_for_that_many():
    alloc = rtx_pair(set(), parse_link_required({RTX: {4: "nvlink"}}))
    with pytest.raises(AllocationRefused) as refused:
        alloc.allocate("s", Request(model=RTX, count="all"))
    assert refused.value.reason is Refusal.NEVER_LINKED
    assert alloc.nearest_host(Request(model=RTX, count="all")) is None
    pairs = rtx_pair(set(), parse_link_required({RTX: {2: "cpu"}}))
    assert pairs.allocate("s", Request(model=RTX, count="all")).host == "pairs-0"  # 4: no class required


def test_a_request_for_one_of_several_models_goes_where_its_class_is_met():
    """Any of two models: the V100s must be NVLinked in fours, the A6000s need nothing."""
    alloc = Allocator([g for g in GPUS if g.host in ("dgx1-0", "pairs-0")], "pack")
    alloc.set_host_topology("dgx1-0", TOPOLOGIES["dgx1-0"])
    alloc.set_link_required(parse_link_required({"Tesla V100-SXM2-32GB": {4: "nvlink"}}))
    v100 = "Tesla V100-SXM2-32GB"
    for i in (0, 4):  # neither quad of the cube-mesh whole
        alloc.adopt(f"b{i}", "x", "dgx1-0", [f"GPU-00000000-0000-4000-8000-{i:012d}"])
    got = alloc.allocate("s", Request(models=(v100, RTX), count=4))
    assert got.host == "pairs-0"
    with pytest.raises(AllocationRefused) as refused:
        alloc.allocate("t", Request(models=(v100, RTX), count=4))
    assert "4 × Tesla V100-SXM2-32GB are given only as GPUs joined by NVLink" in refused.value.message
