"""The frag policy (gpuspawner.allocator.fragment), pure: the fragment's arithmetic,
the admin's mix, and the choice against brute force over every placement."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuspawner.allocator import fragment
from gpuspawner.allocator.allocator import AllocationRefused, Allocator, Request
from gpuspawner.allocator.fragment import Mix, Placed, Shape
from gpuspawner.core.inventory import GPU
from gpuspawner.core.sharing import UNIT

INF = math.inf


def test_the_fragment_is_the_free_gpu_each_shape_could_not_use_weighted():
    mix = Mix([Shape(1, 500, weight=1), Shape(2, UNIT, weight=1)])
    # 0.3 + 1 + 1 free: the half-GPU share cannot use the 0.3, two whole GPUs cannot either.
    assert fragment.fragment(mix, "M", [300, UNIT, UNIT], INF, INF) == 0.5 * 300 + 0.5 * 300
    # One untouched device: two whole GPUs can use none of the 1.3 free.
    assert fragment.fragment(mix, "M", [300, UNIT], INF, INF) == 0.5 * 300 + 0.5 * 1300
    # A shape needing more CPU than is left, or another model, can use nothing there
    # (besides, the CPU left serves less than the free GPU: below).
    cpu_bound = Mix([Shape(1, 500, cpu_milli=4000, weight=1)])
    assert fragment.fragment(cpu_bound, "M", [UNIT], 3999, INF) == UNIT + fragment.SHORT_WEIGHT * (UNIT - 3999 / 8)
    assert fragment.fragment(cpu_bound, "M", [UNIT], 8000, INF) == 0
    other = Mix([Shape(1, UNIT, models=frozenset({"N"}))])
    assert fragment.fragment(other, "M", [UNIT], INF, INF) == UNIT
    # A request without GPUs uses none of it anywhere.
    assert fragment.fragment(Mix([Shape(0, UNIT)]), "M", [200, UNIT], INF, INF) == 1200
    assert fragment.fragment(mix, "M", [0, 0], INF, INF) == 0


def test_free_gpu_that_the_cpu_or_memory_left_cannot_serve_at_the_mixs_rate_counts_a_tenth():
    """The mix asks 4 cores and 8 GiB per GPU on average (half a GPU with 2 cores and a
    GPU with 4 cores and 12 GiB, weighted alike: 6 cores and 12 GiB per 1.5 GPU)."""
    mix = Mix([Shape(1, 500, cpu_milli=2000, weight=1), Shape(1, UNIT, cpu_milli=4000, memory_mib=12288, weight=1)])
    assert mix.cpu_per_milli == pytest.approx(6000 / 1500) and mix.mem_per_milli == pytest.approx(12288 / 1500)
    # Two free GPUs and 8 cores: enough for both at the mix's rate, nothing short.
    assert fragment.fragment(mix, "M", [UNIT, UNIT], 8000, 65536) == 0
    # 6 cores serve 1.5 of the 2 GPUs: the other half counts a tenth (both shapes still fit).
    assert fragment.SHORT_WEIGHT == 0.1
    assert fragment.fragment(mix, "M", [UNIT, UNIT], 6000, 65536) == pytest.approx(0.1 * 500)
    # Memory as short as the CPU: counted once, not twice.
    assert fragment.fragment(mix, "M", [UNIT, UNIT], 6000, 12288) == pytest.approx(0.1 * (2000 - 1500))
    # 8 GiB: the GPU shape cannot run there at all (half of 2 GPUs), and 1 GPU is short.
    assert fragment.fragment(mix, "M", [UNIT, UNIT], 6000, 8192) == pytest.approx(0.5 * 2000 + 0.1 * (2000 - 1000))
    # Not known (a host whose resources were never told) or a mix without CPU: nothing short.
    assert fragment.fragment(mix, "M", [UNIT, UNIT], INF, INF) == 0
    assert fragment.fragment(Mix([Shape(1, UNIT)]), "M", [UNIT, UNIT], 0, 0) == 0
    # Others reserve more than the host has (its CPU left is below 0): at most all of it.
    assert fragment.fragment(mix, "M", [UNIT, UNIT], -4000, 65536) == pytest.approx(2000 + 0.1 * 2000)


@pytest.mark.parametrize(
    "entries, says",
    [
        ([], "non-empty list"),
        ([{"gpus": -1}], "gpu_placement_mix[0]: gpus must be a whole number from 0 to 64, got -1"),
        ([{"gpus": 10**400}], "got a number of about 400 digits"),
        ([{"share": 1.5}], "share must be above 0 and below 1"),
        ([{"gpus": 1, "share": 0.5}], "without gpus"),
        ([{"gpu": 1}], "gpu_placement_mix[0] must be a dict with some of cpu, gpus, memory_mib, models, share, weight"),
        ([{"cpu": math.nan}], "cpu must be 0 to 100000 cores"),
        ([{"cpu": 10**400}], "cpu must be 0 to 100000 cores and weight above 0, got a number of about 400 digits"),
        ([{"share": -(10**400)}], "share must be above 0 and below 1, without gpus, got a number of about 400 digits"),
        ([{"weight": 0}], "weight above 0"),
        ([{"memory_mib": 1.5}], "memory_mib must be a whole number of MiB"),
        ([{}, {"models": "A100"}], "gpu_placement_mix[1]: models must be a non-empty list of model names"),
    ],
)
def test_a_bad_mix_is_refused_naming_the_entry(entries, says):
    with pytest.raises(ValueError) as refused:
        Mix.parse(entries)
    assert says in str(refused.value)


def test_the_mix_is_parsed_into_shapes_with_weights_that_sum_to_one():
    mix = Mix.parse(
        [{"share": 0.25, "cpu": 4, "memory_mib": 8192, "weight": 3}, {"gpus": 2, "models": ["A"]}, {"gpus": 0}]
    )
    assert mix.shapes == (
        Shape(1, 250, 4000, 8192, None, 0.6),
        Shape(2, UNIT, 0, 0, frozenset({"A"}), 0.2),
        Shape(0, UNIT, 0, 0, None, 0.2),
    )
    assert mix.no_gpu == pytest.approx(0.2)


# -- the choice, against brute force ------------------------------------------------


def oracle_fragment(mix: Mix, model: str, rooms: list[int], cpu: float, mem: float) -> float:
    """The fragment as the definition reads, device by device (no sorting, no bisection)."""
    total = sum(rooms)
    out = 0.0
    for s in mix.shapes:
        if s.count == 0 or s.cpu_milli > cpu or s.memory_mib > mem or (s.models and model not in s.models):
            out += s.weight * total
        elif s.milli < UNIT:
            usable = [r for r in rooms if r >= s.milli]
            out += s.weight * (sum(r for r in rooms if r < s.milli) if usable else total)
        else:
            untouched = [r for r in rooms if r == UNIT]
            out += s.weight * (total - UNIT * len(untouched) if len(untouched) >= s.count else total)
    # and a tenth of the free GPU beyond what the CPU (or memory) left serves at the mix's rate
    gpu = sum(s.weight * s.count * s.milli for s in mix.shapes)
    served = [total]
    for need, left in (
        (sum(s.weight * s.cpu_milli for s in mix.shapes), cpu),
        (sum(s.weight * s.memory_mib for s in mix.shapes), mem),
    ):
        if gpu and need and left != INF:
            served.append(max(0.0, left * gpu / need))
    return out + 0.1 * (total - min(served))


def state(alloc: Allocator, gpus: list[GPU], host: str) -> tuple[list[int], float, float]:
    rooms = [UNIT - sum(alloc.booked_on(g.uuid).values()) for g in gpus if g.host == host]
    free = alloc.resources.free(host)
    return rooms, *(free if free is not None else (INF, INF))


def growth_of(mix, gpus, alloc, host, taken: dict[int, int], asked) -> float:
    rooms, cpu, mem = state(alloc, gpus, host)
    after = [r - taken.get(i, 0) for i, r in enumerate(rooms)]
    return oracle_fragment(mix, "M", after, cpu - asked[0], mem - asked[1]) - oracle_fragment(mix, "M", rooms, cpu, mem)


shapes = st.builds(
    Shape,
    st.integers(0, 3),
    st.sampled_from([100, 250, 500, 750, UNIT]),
    st.sampled_from([0, 2000, 8000]),
    st.sampled_from([0, 4096]),
    st.just(None),
    st.floats(0.1, 5),
).map(lambda s: Shape(s.count, UNIT if s.count != 1 else s.milli, s.cpu_milli, s.memory_mib, None, s.weight))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=5),
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from([200, 500, 700, UNIT])), max_size=8),
    st.lists(shapes, min_size=1, max_size=5),
    st.lists(st.sampled_from([4000, 8000, 16000]), min_size=5, max_size=5),
    st.tuples(st.integers(0, 3), st.sampled_from([250, 500, UNIT]), st.sampled_from([0, 3000])),
)
def test_frag_takes_the_placement_where_the_fragment_grows_least_of_all(
    monkeypatch, devices, before, mix_shapes, cpus, request
):
    """With every candidate looked at, frag's choice makes the fragment grow by the
    least that any placement of the request would (computed here from the bookings,
    placement by placement). (The same patch for every example.)"""
    monkeypatch.setattr(fragment, "CANDIDATES", 10**6)
    gpus = [GPU(f"h{h}", i, f"h{h}-{i}", "M", 0) for h, n in enumerate(devices) for i in range(n)]
    hosts = sorted({g.host for g in gpus})
    alloc = Allocator(gpus, "frag", {"M": {"quantum": 0.05}})
    for h, cpu in zip(hosts, cpus):
        alloc.set_host_resources(h, cpu, 65536)
    for i, (count, milli) in enumerate(before):
        try:
            alloc.allocate(f"b{i}", Request(count=count) if milli == UNIT else Request(milli=milli, cpu_milli=1000))
        except AllocationRefused:
            pass
    mix = Mix(mix_shapes)
    alloc.set_mix(mix)
    count, milli, cpu = request
    asked = (cpu, 0)
    options = []  # (growth, host) of every placement the request could have
    for h in hosts:
        rooms, free_cpu, _ = state(alloc, gpus, h)
        if cpu > free_cpu:
            continue
        if milli == UNIT and count > 0:
            if sum(r == UNIT for r in rooms) >= count:
                first = [i for i, r in enumerate(rooms) if r == UNIT][:count]
                options.append((growth_of(mix, gpus, alloc, h, dict.fromkeys(first, UNIT), asked), h))
        elif milli < UNIT:
            for i, r in enumerate(rooms):
                if r >= milli:
                    options.append((growth_of(mix, gpus, alloc, h, {i: milli}, asked), h))
    asking = Request(milli=milli, cpu_milli=cpu) if milli < UNIT else Request(count=max(count, 1), cpu_milli=cpu)
    if milli == UNIT and count == 0:
        return  # (servers without GPUs: test_a_server_without_gpus_goes_where_the_fragment_grows_least)
    try:
        got = alloc.allocate("new", asking)
    except AllocationRefused:
        assert options == [], options
        return
    best = min(g for g, _ in options)
    alloc.release("new")
    mine = growth_of(mix, gpus, alloc, got.host, placed_on(gpus, got), asked)
    assert mine == pytest.approx(best, abs=1e-6), (got, options)


def placed_on(gpus: list[GPU], got) -> dict[int, int]:
    on_host = [g for g in gpus if g.host == got.host]
    return {on_host.index(d): m for d, m in zip(got.devices, got.milli)}


def test_a_server_without_gpus_goes_where_the_fragment_grows_least():
    """Two hosts with one free GPU each; the mix's 1-GPU requests need 6 cores. A
    server without GPUs taking 4 cores leaves h0 (8 cores) unable to take one and h1
    (16) able: frag puts it on h1, where pack's order (by name) would say h0."""
    gpus = [GPU(h, 0, f"{h}-0", "M", 0) for h in ("h0", "h1")]
    alloc = Allocator(gpus, "frag")
    alloc.set_host_resources("h0", 8000, 65536)
    alloc.set_host_resources("h1", 16000, 65536)
    alloc.set_mix(Mix([Shape(1, UNIT, cpu_milli=6000)]))
    assert alloc.allocate("cpu", Request(count=0, cpu_milli=4000)).host == "h1"
    packed = Allocator(gpus, "pack")
    packed.set_host_resources("h0", 8000, 65536)
    packed.set_host_resources("h1", 16000, 65536)
    assert packed.allocate("cpu", Request(count=0, cpu_milli=4000)).host == "h0"


def test_with_cpu_in_the_mix_frag_keeps_a_hosts_cpu_in_step_with_its_free_gpus():
    """docs/configuration.md#gpu_placement_mix: two hosts with two free GPUs each, 10 and
    40 cores; the mix asks 4 cores per GPU. A server without GPUs taking 4 cores would
    leave h0 6 cores for its 2 GPUs (every request of the mix still fits there, but not
    twice): frag puts it on h1. A mix without CPU (as learned from the ledger) says
    nothing of it, and frag goes as pack, to h0."""
    gpus = [GPU(h, i, f"{h}-{i}", "M", 0) for h in ("h0", "h1") for i in (0, 1)]
    chosen = []
    for mix in ([{"gpus": 1, "cpu": 4}], [{"gpus": 1}]):
        alloc = Allocator(gpus, "frag")
        alloc.set_host_resources("h0", 10000, 65536)
        alloc.set_host_resources("h1", 40000, 65536)
        alloc.set_mix(Mix.parse(mix))
        chosen.append(alloc.allocate("cpu", Request(count=0, cpu_milli=4000)).host)
    assert chosen == ["h1", "h0"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([250, 500, UNIT]), st.booleans()), max_size=30))
def test_without_a_mix_frag_decides_as_pack(ops):
    gpus = [GPU(f"h{h}", i, f"h{h}-{i}", "M", 0) for h, n in enumerate([2, 4, 3]) for i in range(n)]
    packed, frag = Allocator(gpus, "pack", {"M": {"quantum": 0.05}}), Allocator(gpus, "frag", {"M": {"quantum": 0.05}})
    for i, (count, milli, release) in enumerate(ops):
        request = Request(milli=milli) if milli < UNIT else Request(count=max(count, 1))
        results = []
        for a in (packed, frag):
            try:
                results.append(a.allocate(f"r{i}", request))
            except AllocationRefused as exc:
                results.append(exc.reason)
        assert results[0] == results[1]
        if release and hasattr(results[0], "host"):
            packed.release(f"r{i}")
            frag.release(f"r{i}")


# -- the setting --------------------------------------------------------------------


def test_frag_without_a_mix_starts_learning_and_with_one_the_allocator_gets_it(tmp_path):
    from traitlets.config import Config

    from gpuspawner.hub.app import GPUHub
    from gpuspawner.hub.settings import validate_config
    from gpuspawner.spawn.spawner import GPUSwarmSpawner
    from tests.unit.test_access_spawn import INVENTORY

    c = Config()
    c.GPUSwarmSpawner.gpu_inventory = INVENTORY
    c.GPUSwarmSpawner.gpu_db_url = f"sqlite:///{tmp_path}/ledger.sqlite"
    c.GPUSwarmSpawner.allocation_policy = "frag"
    validate_config(c)  # no mix: learned from the ledger (test_a_hub_learns_its_mix_from_what_servers_held)
    assert GPUHub.from_config(c, GPUSwarmSpawner).holdings.allocator.mix is None  # nothing held yet: as pack
    c.GPUSwarmSpawner.gpu_placement_mix = [{"share": 0.5, "cpu": 2, "weight": 3}, {"gpus": 2}]
    validate_config(c)
    mix = GPUHub.from_config(c, GPUSwarmSpawner).holdings.allocator.mix
    assert mix is not None and mix.shapes == (Shape(1, 500, 2000, 0, None, 0.75), Shape(2, UNIT, 0, 0, None, 0.25))
    c.GPUSwarmSpawner.allocation_policy = "pack"  # the mix is for frag only
    assert GPUHub.from_config(c, GPUSwarmSpawner).holdings.allocator.mix is None
    with pytest.raises(Exception, match=r"gpu_placement_mix\[0\]: share must be above 0 and below 1"):
        GPUSwarmSpawner(gpu_placement_mix=[{"share": 2}])


def test_a_share_no_one_device_takes_is_split_as_pack_splits_it():
    gpus = [GPU("a", i, f"a-{i}", "M", 0) for i in range(2)]
    sharing = {"M": {"split": True, "split_small": True, "quantum": 0.05}}
    allocs = {p: Allocator(gpus, p, sharing) for p in ("pack", "frag")}
    allocs["frag"].set_mix(Mix.parse([{"share": 0.5}]))
    for a in allocs.values():
        a.allocate("x", Request(milli=600))
        a.allocate("y", Request(milli=600))
    assert (
        allocs["frag"].allocate("z", Request(milli=700)).milli == allocs["pack"].allocate("z", Request(milli=700)).milli
    )


def test_on_a_host_with_two_models_what_a_request_takes_from_the_other_counts():
    """Host a has 1 M and 4 N, host b 1 M, both 10 cores; the mix's requests need 8.
    An M request taking 4 cores on a would leave a's four N unusable: frag puts it on b."""
    gpus = [GPU("a", 0, "a-m", "M", 0)] + [GPU("a", i, f"a-n{i}", "N", 0) for i in (1, 2, 3, 4)]
    gpus.append(GPU("b", 0, "b-m", "M", 0))
    alloc = Allocator(gpus, "frag")
    for h in ("a", "b"):
        alloc.set_host_resources(h, 10000, 65536)
    alloc.set_mix(Mix.parse([{"gpus": 1, "cpu": 8}]))
    assert alloc.allocate("m", Request(model="M", cpu_milli=4000)).host == "b"
    assert alloc.allocate("n", Request(model="N", cpu_milli=8000)).host == "a"


def test_between_equal_growths_a_share_goes_as_pack_sends_it():
    """The fewest free on the host for an untouched device, then the lowest index."""
    gpus = [GPU("a", i, f"a-{i}", "M", 0) for i in range(3)] + [GPU("b", 0, "b-0", "M", 0)]
    allocs = {p: Allocator(gpus, p, {"M": {"quantum": 0.05}}) for p in ("pack", "frag")}
    allocs["frag"].set_mix(Mix.parse([{"share": 0.05}]))  # any device takes it: growth 0 everywhere
    got = {p: a.allocate("x", Request(milli=250)) for p, a in allocs.items()}
    assert got["frag"].devices == got["pack"].devices == (gpus[3],)  # b: 1 free, a: 3
    for a in allocs.values():
        a.allocate("y", Request(milli=750))  # b-0 is full now
        a.allocate("z", Request(milli=750, host="a"))
        a.allocate("w", Request(milli=750, host="a"))
    assert (
        allocs["frag"].allocate("v", Request(milli=250)).devices
        == allocs["pack"].allocate("v", Request(milli=250)).devices
    )


def test_a_bad_mix_stops_the_hub_whatever_the_policy_and_models_go_through_the_aliases(tmp_path):
    from traitlets.config import Config

    from gpuspawner.hub.app import GPUHub
    from gpuspawner.hub.settings import validate_config
    from gpuspawner.spawn.spawner import GPUSwarmSpawner
    from tests.unit.test_access_spawn import INVENTORY

    c = Config()
    c.GPUSwarmSpawner.gpu_inventory = INVENTORY
    c.GPUSwarmSpawner.gpu_db_url = f"sqlite:///{tmp_path}/ledger.sqlite"
    c.GPUSwarmSpawner.gpu_placement_mix = [{"gpu": 1}]  # under pack
    with pytest.raises(SystemExit) as stopped:
        validate_config(c)
    assert "gpu_placement_mix[0] must be a dict with some of" in str(stopped.value.code)
    c.GPUSwarmSpawner.allocation_policy = "frag"
    c.GPUSwarmSpawner.gpu_model_aliases = {"NVIDIA A100-SXM4-80GB": "A100"}
    c.GPUSwarmSpawner.gpu_placement_mix = [{"gpus": 1, "models": ["NVIDIA A100-SXM4-80GB"]}]
    validate_config(c)
    [shape] = GPUHub.from_config(c, GPUSwarmSpawner).holdings.allocator.mix.shapes
    assert shape.models == frozenset({"A100"})


# -- the mix learned --------------------------------------------------------------------


def test_a_learned_mix_has_a_shape_per_kind_weighted_by_how_many_held_it():
    """Rows without CPU or memory (written before migration 0008): each kind without them."""
    held = [
        Placed("A100", (1000,)),
        Placed("A100", (1000,)),
        Placed("A100", (500,)),
        Placed("T4", (1000, 1000)),
        Placed("A100", ()),  # nothing held: not a kind
        Placed("A100", (600, 300)),
    ]
    mix = Mix.learned(held)
    assert mix is not None
    assert sorted(mix.shapes, key=lambda s: (s.count, s.milli)) == [
        Shape(1, 500, 0, 0, None, 1 / 5),
        Shape(1, 600, 0, 0, None, 1 / 5),  # a split share: its largest piece
        Shape(1, UNIT, 0, 0, None, 2 / 5),
        Shape(2, UNIT, 0, 0, None, 1 / 5),
    ]
    assert Mix.learned([]) is None


def test_a_learned_mix_keeps_each_kinds_cpu_and_memory_and_every_kind_takes_any_model():
    """What the ledger records since migration 0008: a kind is also the CPU and memory
    reserved beside the GPUs, so the mix asks CPU and memory per thousandth of GPU as the
    servers did; whichever models the requests accepted, each kind takes any."""
    held = [
        Placed("A100", (1000,), 8000, 32768, ()),
        Placed("T4", (1000,), 8000, 32768, ("T4",)),  # pinned to a model: the same kind
        Placed("A100", (500,), 2000, 8192, ("A100", "T4")),
        Placed("A100", (500,), 4000, 8192, ("A100", "T4")),  # more CPU: a kind of its own
        Placed("T4", (1000,), None, None, None),  # not recorded: no CPU or memory
    ]
    mix = Mix.learned(held)
    assert mix is not None
    assert sorted(mix.shapes, key=lambda s: (s.milli, s.cpu_milli)) == [
        Shape(1, 500, 2000, 8192, None, 1 / 5),
        Shape(1, 500, 4000, 8192, None, 1 / 5),
        Shape(1, UNIT, 0, 0, None, 1 / 5),
        Shape(1, UNIT, 8000, 32768, None, 2 / 5),
    ]
    asked = 2 * 500 / 5 + 3 * UNIT / 5  # thousandths of GPU per server, on average
    assert mix.cpu_per_milli == pytest.approx((2 * 8000 + 2000 + 4000) / 5 / asked)
    assert mix.mem_per_milli == pytest.approx((2 * 32768 + 2 * 8192) / 5 / asked)


def test_with_a_learned_mix_a_request_for_any_model_leaves_the_one_gpu_of_a_model_that_others_are_pinned_to():
    """One N on z, two M on b and c; half the servers took any model, 3 in 10 only M, 2 in
    10 only N. Had the mix kept the pins, the free N would count as lost to the M-only
    kind and frag would fill it with a request for any model (the next N-only one then
    finds no room); learned, every kind takes any model, and frag goes as pack, to b."""
    gpus = [GPU("b", 0, "b-0", "M", 0), GPU("c", 0, "c-0", "M", 0), GPU("z", 0, "z-0", "N", 0)]
    held = [Placed("M", (UNIT,), accepts=())] * 5 + [Placed("M", (UNIT,), accepts=("M",))] * 3
    held += [Placed("N", (UNIT,), accepts=("N",))] * 2
    pinned = Mix(
        [
            Shape(1, UNIT, weight=5),
            Shape(1, UNIT, models=frozenset({"M"}), weight=3),
            Shape(1, UNIT, models=frozenset({"N"}), weight=2),
        ]
    )
    hosts = []
    for mix in (Mix.learned(held), pinned):
        alloc = Allocator(gpus, "frag")
        alloc.set_mix(mix)
        hosts.append(alloc.allocate("any", Request()).host)
        if mix is not pinned:
            assert alloc.allocate("n", Request(model="N")).host == "z"
    assert hosts == ["b", "z"]


def test_frag_with_a_learned_mix_keeps_a_hosts_cpu_in_step_with_its_free_gpus():
    """As test_with_cpu_in_the_mix_frag_keeps_a_hosts_cpu_in_step_with_its_free_gpus, with
    the mix learned from what servers held: learned with their CPU (4 cores per GPU), frag
    puts a server without GPUs taking 4 cores on h1; learned without it (as before the
    ledger recorded CPU), frag says nothing of it and goes as pack, to h0."""
    gpus = [GPU(h, i, f"{h}-{i}", "M", 0) for h in ("h0", "h1") for i in (0, 1)]
    chosen = []
    for cpu in (4000, None):
        alloc = Allocator(gpus, "frag")
        alloc.set_host_resources("h0", 10000, 65536)
        alloc.set_host_resources("h1", 40000, 65536)
        alloc.set_mix(Mix.learned([Placed("M", (UNIT,), cpu, 0, ())] * 3))
        chosen.append(alloc.allocate("cpu", Request(count=0, cpu_milli=4000)).host)
    assert chosen == ["h1", "h0"]


async def test_a_hub_learns_its_mix_from_what_servers_held_and_keeps_it_while_the_ledger_is_down(tmp_path, monkeypatch):
    from gpuspawner.ledger.ledger import Ledger, LedgerError
    from tests.unit.test_holdings import A100, World

    world = World(tmp_path, allocation_policy="frag")
    hub = world.hub
    ledger = Ledger(world.db_url)
    for i, milli in enumerate([(1000,), (1000,), (250,)]):
        ledger.open(f"old-{i}", f"u{i}", "", "gpu-b", A100, ["GPU-b0"], list(milli))
        ledger.close(f"old-{i}")
    await hub._learn_mix(world.owner)
    mix = world.owner.allocator.mix
    assert mix is not None and {(s.count, s.milli, s.weight) for s in mix.shapes} == {(1, UNIT, 2 / 3), (1, 250, 1 / 3)}

    async def down(call):
        raise LedgerError("the ledger is down")

    hub._mix_read = None  # due again
    monkeypatch.setattr(world.owner, "ledger_call", down)
    await hub._learn_mix(world.owner)
    assert world.owner.allocator.mix is mix  # the mix last learned stays


async def test_a_servers_cpu_memory_and_accepted_models_go_to_the_ledger_and_into_the_mix_the_hub_learns(tmp_path):
    """Through the real spawner over the fake swarm: alice's server reserves 2 cores and 4 GiB
    (``cpu_guarantee``, ``mem_guarantee``) with an A100 she chose; the ledger records them
    with her allocation, a hub restarted over her running service keeps them, and the mix
    the hub learns asks for them."""
    from gpuspawner.ledger.ledger import Ledger
    from tests.unit.test_holdings import A100, World

    world = World(tmp_path, allocation_policy="frag", cpu_guarantee=2.0, mem_guarantee=4 * 2**30)
    world.fake.set_node_resources("gpu-b", cpus=8, memory_gib=32)
    await world.started(world.spawner("alice", {"gpu_model": A100}))
    [row] = Ledger(world.db_url).open_allocations()
    assert (row.cpu_milli, row.memory_mib, row.accepts, row.milli) == (2000, 4096, (A100,), (UNIT,))
    world.restart()  # adopts her service: the row it finds open stays as written
    await world.owner.reconcile()
    [again] = Ledger(world.db_url).open_allocations()
    assert (again.id, again.cpu_milli, again.memory_mib, again.accepts) == (row.id, 2000, 4096, (A100,))
    await world.hub._learn_mix(world.owner)
    mix = world.owner.allocator.mix
    assert mix is not None and mix.shapes == (Shape(1, UNIT, 2000, 4096, None, 1.0),)


async def test_a_young_hub_learns_its_mix_again_once_as_many_servers_were_granted_as_it_learned_from(tmp_path):
    """Guards docs/benchmarks.md, "`frag`: the fragmentation-aware policy": the mix is learned
    again every hour "and sooner while the ledger is young: once as many servers were
    granted since as it was learned from"."""
    from gpuspawner.ledger.ledger import Ledger
    from tests.unit.test_holdings import A100, World

    two = {"gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920} for i in range(2)]}
    world = World(tmp_path, inventory=two, allocation_policy="frag")
    hub, ledger = world.hub, Ledger(world.db_url)
    for i in range(2):
        ledger.open(f"old-{i}", f"u{i}", "", "gpu-b", A100, ["GPU-b0"], [250])
        ledger.close(f"old-{i}")
    await hub._learn_mix(world.owner)
    assert {(s.milli, s.weight) for s in world.owner.allocator.mix.shapes} == {(250, 1.0)}
    ledger.open("old-2", "u2", "", "gpu-b", A100, ["GPU-b0"], [1000])  # in the ledger, granted by no hub
    ledger.close("old-2")
    await hub._learn_mix(world.owner)
    assert {s.milli for s in world.owner.allocator.mix.shapes} == {250}  # within the hour, nothing granted: kept
    await world.started(world.spawner("alice", {"gpu_model": A100}))
    await hub._learn_mix(world.owner)
    assert {s.milli for s in world.owner.allocator.mix.shapes} == {250}  # 1 granted since, learned from 2
    await world.started(world.spawner("bob", {"gpu_model": A100}))
    await hub._learn_mix(world.owner)
    assert {s.milli for s in world.owner.allocator.mix.shapes} == {250, 1000}  # 2 since: learned again
