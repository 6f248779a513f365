"""Which of a host's free GPUs a multi-GPU request gets, by their links
(gpuspawner.allocator.linked, gpuspawner.core.topology): NVIDIA's device plugin
allocator's published choices on a DGX-1 (Volta and Pascal) and on four RTX 8000s
with NVLink bridges, and every choice against a brute force over every split.

Guards docs/topology.md: "the split whose groups are best linked in all is taken,
and of it the best linked group"."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.allocator import linked
from gpuspawner.allocator.linked import best_set
from gpuspawner.core.topology import Link, Path, Topology

S, H, X, M, C, B = Path.SWITCH, Path.BRIDGE, Path.CROSS_CPU, Path.SWITCHES, Path.CPU, Path.BOARD


def node(nvlinks: dict[tuple[int, int], int], paths: dict[tuple[int, int], Path], n: int = 8) -> Topology:
    """A node of ``n`` GPUs GPU-0 ... by index; pairs not named have no NVLink."""
    links = {}
    for a, b in itertools.combinations(range(n), 2):
        path = paths.get((a, b), paths.get((b, a)))
        links[frozenset((f"GPU-{a}", f"GPU-{b}"))] = Link(path, nvlinks.get((a, b), nvlinks.get((b, a), 0)))
    return Topology(links)


# A DGX-1 with V100s: the hybrid cube-mesh, each GPU with NVLinks to four others (two of
# them doubled), two quads on two CPUs, pairs behind one PCIe switch.
DGX1_VOLTA = node(
    {
        (0, 1): 1,
        (0, 2): 1,
        (0, 3): 2,
        (0, 4): 2,
        (1, 2): 2,
        (1, 3): 1,
        (1, 5): 2,
        (2, 3): 2,
        (2, 6): 1,
        (3, 7): 1,
        (4, 5): 1,
        (4, 6): 1,
        (4, 7): 2,
        (5, 6): 2,
        (5, 7): 1,
        (6, 7): 2,
    },  # fmt: skip
    {
        **{(a, b): X for a in range(4) for b in range(4, 8)},
        (0, 1): S,
        (0, 2): H,
        (0, 3): H,
        (1, 2): H,
        (1, 3): H,
        (2, 3): S,
        (4, 5): S,
        (4, 6): H,
        (4, 7): H,
        (5, 6): H,
        (5, 7): H,
        (6, 7): S,
    },  # fmt: skip
)
# The same with P100s: one NVLink to each of four others.
DGX1_PASCAL = node(
    {
        (0, 1): 1,
        (0, 2): 1,
        (0, 3): 1,
        (0, 4): 1,
        (1, 2): 1,
        (1, 3): 1,
        (1, 5): 1,
        (2, 3): 1,
        (2, 6): 1,
        (3, 7): 1,
        (4, 5): 1,
        (4, 6): 1,
        (4, 7): 1,
        (5, 6): 1,
        (5, 7): 1,
        (6, 7): 1,
    },  # fmt: skip
    {
        **{(a, b): X for a in range(4) for b in range(4, 8)},
        (0, 1): H,
        (0, 2): S,
        (0, 3): H,
        (1, 2): H,
        (1, 3): S,
        (2, 3): H,
        (4, 5): H,
        (4, 6): S,
        (4, 7): H,
        (5, 6): H,
        (5, 7): S,
        (6, 7): H,
    },  # fmt: skip
)
# Four RTX 8000s on two CPUs, NVLink bridges joining 0-3 and 1-2.
RTX8000 = node({(0, 3): 2, (1, 2): 2}, {(0, 1): C, (0, 2): X, (1, 3): X, (2, 3): C, (0, 3): X, (1, 2): X}, n=4)


def take(topology: Topology, free: list[int], n: int) -> list[int]:
    uuids = [f"GPU-{i}" for i in free]
    return [free[p] for p in best_set(len(free), n, lambda a, b: topology.score(uuids[a], uuids[b]))]


@pytest.mark.parametrize(
    ("free", "n", "want"),
    [
        ([0, 2, 4, 5], 2, [4, 5]),  # one NVLink each, 4 and 5 behind one switch; 0 and 2 keep theirs
        ([0, 4, 5, 6], 2, [5, 6]),  # the two NVLinks on one CPU, leaving 0 and 4 their two
        ([0, 1, 3], 2, [0, 3]),  # two NVLinks on one CPU
        ([0, 1, 4], 2, [0, 4]),  # two NVLinks across the CPUs beat one on the same
    ],
)
def test_the_device_plugins_choices_on_a_dgx1(free, n, want):
    assert take(DGX1_VOLTA, free, n) == want


@pytest.mark.parametrize(
    ("topology", "size", "sets"),
    [
        (DGX1_VOLTA, 2, [[0, 3], [1, 2], [4, 7], [5, 6]]),
        (DGX1_VOLTA, 4, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (DGX1_PASCAL, 2, [[0, 2], [1, 3], [4, 6], [5, 7]]),
        (DGX1_PASCAL, 4, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (RTX8000, 2, [[0, 3], [1, 2]]),
    ],
    ids=["volta-2", "volta-4", "pascal-2", "pascal-4", "rtx8000-2"],
)
def test_a_node_handed_out_request_after_request_as_the_device_plugin_hands_it_out(topology, size, sets):
    n = max(max(s) for s in sets) + 1
    free, got = list(range(n)), []
    while len(free) >= size:
        chosen = take(topology, free, size)
        got.append(chosen)
        free = [i for i in free if i not in chosen]
    assert got == sets


def test_without_links_known_the_gpus_go_in_index_order():
    assert take(Topology(), [1, 4, 6, 7], 2) == [1, 4]
    assert take(DGX1_VOLTA, [5, 6, 7], 1) == [5]


def brute(m: int, n: int, score) -> tuple[int, set[tuple[int, ...]]]:
    """Every split of m GPUs (padded) into groups of n, by permutation: the best total,
    and the best group of each split that has it."""
    pad = -m % n
    best, answers = -1, set()
    for perm in itertools.permutations(range(m + pad)):
        groups = [tuple(sorted(perm[i : i + n])) for i in range(0, m + pad, n)]
        if any(0 < sum(x >= m for x in g) < pad for g in groups):
            continue
        real = [g for g in groups if max(g) < m]
        total = sum(linked._set_score(g, score, m) for g in groups)
        top = max(linked._set_score(g, score) for g in real)
        tops = {g for g in real if linked._set_score(g, score) == top}
        if total > best:
            best, answers = total, set(tops)
        elif total == best:
            answers |= tops
    return best, answers


@settings(max_examples=120, deadline=None, database=None, derandomize=True)
@given(
    st.integers(3, 6).flatmap(
        lambda m: st.tuples(
            st.just(m),
            st.integers(2, m - 1).filter(lambda n: m + -m % n <= 6),  # (the brute force's permutations: 720)
            st.lists(st.sampled_from([0, 10, 30, 50, 110, 150, 230]), min_size=m * m, max_size=m * m),
        )
    )
)
def test_the_chosen_set_is_the_best_group_of_a_best_split_against_brute_force(case):
    m, n, raw = case
    score = lambda a, b: raw[min(a, b) * m + max(a, b)]  # noqa: E731  (symmetric)
    chosen = best_set(m, n, score)
    _, answers = brute(m, n, score)
    assert len(chosen) == n and chosen in answers


@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(st.integers(4, 7).flatmap(lambda m: st.tuples(st.just(m), st.integers(2, m - 1), st.randoms())))
def test_with_too_many_splits_the_best_group_alone_by_its_farthest_pair(case):
    m, n, rnd = case
    raw = [rnd.choice([0, 10, 30, 50, 110, 230]) for _ in range(m * m)]
    score = lambda a, b: raw[min(a, b) * m + max(a, b)]  # noqa: E731
    saved = linked.PARTITIONS_MAX
    linked.PARTITIONS_MAX = 0
    try:
        chosen = best_set(m, n, score)
    finally:
        linked.PARTITIONS_MAX = saved
    key = lambda g: (linked._worst(g, score), linked._set_score(g, score))  # noqa: E731
    assert key(chosen) == max(key(g) for g in itertools.combinations(range(m), n))


def test_the_allocator_gives_a_request_for_several_gpus_the_best_linked_set_of_its_host():
    from gpuspawner.allocator.allocator import Allocator, Request
    from gpuspawner.core.inventory import GPU

    v100 = "Tesla V100-SXM2-32GB"
    alloc = Allocator([GPU("dgx", i, f"GPU-{i}", v100, 32768) for i in range(8)])
    alloc.allocate("one", Request(model=v100, count=1))  # GPU-0, as before
    assert alloc.holding("one").uuids == ("GPU-0",)
    alloc.release("one")
    alloc.set_host_topology("dgx", DGX1_VOLTA)
    got = [alloc.allocate(f"s{i}", Request(model=v100, count=2)).uuids for i in range(4)]
    assert got == [("GPU-0", "GPU-3"), ("GPU-1", "GPU-2"), ("GPU-4", "GPU-7"), ("GPU-5", "GPU-6")]
    for i in range(4):
        alloc.release(f"s{i}")
    alloc.set_host_topology("dgx", None)  # not known any more: index order
    assert alloc.allocate("t", Request(model=v100, count=2)).uuids == ("GPU-0", "GPU-1")


@pytest.mark.parametrize("policy", ["pack", "frag"])
def test_of_two_hosts_the_policy_ranks_alike_the_one_with_the_better_linked_group_gets_it(policy):
    """Guards docs/topology.md: "of hosts the placement policy ranks alike, the one whose
    group is better linked". Two DGX-1s with three V100s free each: on dgx-a 0, 1 and 5
    (the best pair one NVLink), on dgx-b 0, 3 and 6 (0 and 3 two NVLinks); by name dgx-a
    would come first."""
    from gpuspawner.allocator.allocator import Allocator, Request
    from gpuspawner.allocator.fragment import Mix, Placed
    from gpuspawner.core.inventory import GPU

    v100 = "Tesla V100-SXM2-32GB"
    alloc = Allocator([GPU(h, i, f"GPU-{i}-{h}", v100, 32768) for h in ("dgx-a", "dgx-b") for i in range(8)], policy)
    if policy == "frag":
        alloc.set_mix(Mix.learned([Placed(v100, (1000, 1000), 0, 0, ())]))
    for host, free in (("dgx-a", {0, 1, 5}), ("dgx-b", {0, 3, 6})):
        for i in range(8):  # one GPU each, in index order
            alloc.allocate(f"{host}-{i}", Request(model=v100, count=1, host=host))
        for i in free:
            alloc.release(f"{host}-{i}")
    topology = {h: node_of(h) for h in ("dgx-a", "dgx-b")}
    assert alloc.allocate("plain", Request(model=v100, count=2)).host == "dgx-a"  # links not known: by name
    alloc.release("plain")
    for h, t in topology.items():
        alloc.set_host_topology(h, t)
    got = alloc.allocate("s", Request(model=v100, count=2))
    assert (got.host, got.uuids) == ("dgx-b", ("GPU-0-dgx-b", "GPU-3-dgx-b"))


def node_of(host: str) -> Topology:
    """DGX1_VOLTA with the GPUs named GPU-i-HOST."""
    return Topology({frozenset(f"{u}-{host}" for u in pair): link for pair, link in DGX1_VOLTA.links.items()})
