"""Backfill: the hosts kept for those ahead in line (``Request.avoid``), the planned
host of a waiter (``Allocator.nearest_host``, checked against brute force) and one
serving of a line (``gpuspawner.plan.backfill.Round``), all pure.

Guards docs/line.md, "Backfill": "the host where it would fit first is kept for it"
and "A request behind it, or a new one, that fits on another host is served at once"."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuspawner.allocator.allocator import AllocationRefused, Allocator, Request
from gpuspawner.allocator.refusals import Refusal
from gpuspawner.core.inventory import GPU
from gpuspawner.core.sharing import UNIT
from gpuspawner.plan.backfill import Round, StartsCache, planned_start

A100 = "NVIDIA A100 80GB PCIe"
T4 = "NVIDIA Tesla T4"


def _share(milli: int) -> Request:
    return Request(milli=milli)


def cluster(sizes: dict[str, int], model: str = A100) -> Allocator:
    return Allocator([GPU(h, i, f"GPU-{h}-{i}", model, 81920) for h, n in sizes.items() for i in range(n)])


def hold(alloc: Allocator, host: str, n: int) -> None:
    """``n`` servers of one A100 each on ``host``, named HOST-0 .. HOST-(n-1)."""
    for i in range(n):
        alloc.allocate(f"{host}-{i}", Request(model=A100, count=1, host=host))


def test_a_request_is_never_placed_on_a_host_kept_for_those_ahead():
    alloc = cluster({"gpu-a": 4, "gpu-b": 4})
    got = alloc.allocate("s1", Request(model=A100, count=2, avoid=frozenset({"gpu-a"})))
    assert got.host == "gpu-b"  # pack would take gpu-a (ties by name)


def test_what_fits_only_on_a_kept_host_is_refused_with_a_retry_naming_it():
    alloc = cluster({"gpu-a": 4, "gpu-b": 4})
    alloc.allocate("held", Request(model=A100, count=4, avoid=frozenset({"gpu-a"})))  # all of gpu-b
    with pytest.raises(AllocationRefused) as exc:
        alloc.allocate("s1", Request(model=A100, count=1, avoid=frozenset({"gpu-a"})))
    assert exc.value.reason is Refusal.HELD_FOR_LINE and exc.value.retry
    assert (
        exc.value.message
        == "4 NVIDIA A100 80GB PCIe free on gpu-a, but that host is kept for requests ahead of this one in line"
    )
    assert alloc.holding("s1") is None


def test_a_share_is_never_placed_on_a_kept_host():
    alloc = Allocator(
        [GPU(h, 0, f"GPU-{h}", A100, 81920) for h in ("gpu-a", "gpu-b")], sharing={A100: {"quantum": 0.05}}
    )
    got = alloc.allocate("s1", Request(model=A100, milli=250, avoid=frozenset({"gpu-a"})))
    assert got.host == "gpu-b"
    alloc.allocate("s2", Request(model=A100, milli=750, avoid=frozenset({"gpu-a"})))
    with pytest.raises(AllocationRefused) as exc:
        alloc.allocate("s3", Request(model=A100, milli=250, avoid=frozenset({"gpu-a"})))
    assert exc.value.reason is Refusal.HELD_FOR_LINE and "on gpu-a" in exc.value.message


def test_the_planned_host_is_the_one_that_lacks_least_and_could_ever_take_it():
    alloc = cluster({"gpu-a": 8, "gpu-b": 8, "gpu-c": 4})
    hold(alloc, "gpu-a", 6)  # 2 free
    hold(alloc, "gpu-b", 3)  # 5 free
    # gpu-c has all 4 free, but never 8: it could not take the request at all.
    assert alloc.nearest_host(Request(model=A100, count=8)) == "gpu-b"
    assert alloc.nearest_host(Request(model=A100, count=8), frozenset({"gpu-b"})) == "gpu-a"
    assert alloc.nearest_host(Request(model=A100, count=8), frozenset({"gpu-a", "gpu-b"})) is None
    assert alloc.nearest_host(Request(model=T4, count=1)) is None  # not in the inventory


def test_the_planned_host_has_the_cpu_and_memory_the_request_asks_for_in_all():
    alloc = cluster({"gpu-a": 2, "gpu-b": 2})
    alloc.set_host_resources("gpu-a", 8_000, 65536)
    alloc.set_host_resources("gpu-b", 64_000, 65536)
    alloc.allocate("b0", Request(model=A100, count=1, host="gpu-b"))
    # gpu-a has both GPUs free but only 8 CPUs: 16 could never fit there.
    assert alloc.nearest_host(Request(model=A100, count=2, cpu_milli=16_000)) == "gpu-b"
    assert alloc.nearest_host(Request(model=A100, count=2)) == "gpu-a"


@st.composite
def busy_clusters(draw):
    hosts = draw(st.lists(st.sampled_from(["n1", "n02", "gpu-b", "gpu-a", "x", "A"]), min_size=1, unique=True))
    sizes = {h: draw(st.integers(1, 8)) for h in hosts}
    held = {h: draw(st.integers(0, n)) for h, n in sizes.items()}
    cpus = {h: draw(st.sampled_from([None, 4_000, 16_000, 64_000])) for h in hosts}
    used = {h: draw(st.sampled_from([0, 2_000, 12_000])) for h in hosts}
    count = draw(st.integers(1, 8))
    cpu = draw(st.sampled_from([0, 1_000, 8_000, 20_000]))
    exclude = frozenset(draw(st.lists(st.sampled_from(hosts), unique=True)))
    return sizes, held, cpus, used, count, cpu, exclude


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(busy_clusters())
def test_the_planned_host_of_whole_gpus_is_what_brute_force_finds(case):
    """Brute force over every host: the least missing of the request, then free CPU now,
    then pack's order (fewest free that are enough; among those that lack, by name)."""
    sizes, held, cpus, used, count, cpu, exclude = case
    alloc = cluster(sizes)
    for h in sizes:
        if cpus[h] is not None:
            alloc.set_host_resources(h, cpus[h], 1 << 20)
            alloc.set_host_reserved(h, {f"other-{h}": (min(used[h], cpus[h]), 0)})
        hold(alloc, h, held[h])

    def key(h: str):
        free = sizes[h] - held[h]
        missing = max(0, count - free) / count
        has = cpus[h]
        fits_now = has is None or cpu <= has - min(used[h], has)
        return (missing, not fits_now, free if missing == 0 else 0, h)

    could = [h for h in sizes if h not in exclude and sizes[h] >= count and (cpus[h] is None or cpu <= cpus[h])]
    want = min(could, key=key) if could else None
    assert alloc.nearest_host(Request(model=A100, count=count, cpu_milli=cpu), exclude) == want


def test_strict_serves_nobody_after_the_first_that_is_not_served():
    plan = Round(lambda request, kept: "gpu-a", backfill=False)
    assert plan.avoid() == frozenset()
    assert plan.wait("bob", Request(model=A100, count=8)) is None
    assert plan.avoid() is None


def test_each_waiter_keeps_its_own_host_and_one_whose_hosts_are_all_kept_keeps_none():
    alloc = cluster({"gpu-a": 8, "gpu-b": 8})
    plan = Round(alloc.nearest_host)
    assert plan.wait("bob", Request(model=A100, count=8)) == "gpu-a"
    assert plan.wait("carol", Request(model=A100, count=8)) == "gpu-b"
    assert plan.wait("dave", Request(model=A100, count=8)) is None
    assert plan.avoid() == {"gpu-a", "gpu-b"}
    assert plan.planned == {"bob": "gpu-a", "carol": "gpu-b", "dave": None}


def test_a_row_without_a_request_to_plan_holds_everyone_behind_it():
    plan = Round(cluster({"gpu-a": 1}).nearest_host)
    plan.wait("resumed", None)
    assert plan.avoid() is None


def serve(alloc: Allocator, line: list[tuple[str, Request]], backfill: bool) -> tuple[list[str], Round]:
    """One serving of ``line`` as the hub's line does it: in order, on the hosts not kept
    (a request that could never fit leaves the line); nobody is given a kept host."""
    plan, served = Round(alloc.nearest_host, backfill), []
    for who, request in line:
        avoid = plan.avoid()
        if avoid is None:
            break
        try:
            got = alloc.allocate(who, replace(request, avoid=avoid))
        except AllocationRefused as exc:
            if exc.retry:
                plan.wait(who, request)
            continue
        assert got.host not in plan.kept, (who, got.host, plan.kept)
        served.append(who)
    return served, plan


def test_a_small_request_behind_a_large_one_is_served_on_another_host_never_on_the_large_ones():
    alloc = cluster({"gpu-a": 8, "gpu-b": 8})
    hold(alloc, "gpu-a", 2)  # 6 free
    hold(alloc, "gpu-b", 7)  # 1 free
    line = [("big", Request(model=A100, count=8)), ("small", Request(model=A100, count=1))]
    assert serve(alloc, line, backfill=False)[0] == []
    served, plan = serve(alloc, line, backfill=True)
    assert served == ["small"] and plan.planned == {"big": "gpu-a"}
    assert alloc.holding("small").host == "gpu-b"  # gpu-a's 6 free stay for big


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(0, 10**6))
def test_backfill_never_takes_a_device_of_a_host_kept_for_someone_ahead_and_serves_whom_strict_serves(seed):
    """Random clusters and lines: what each waiter is given lies on no host kept for an
    earlier one when it was served; strict order serves a prefix of the line, and every
    waiter of that prefix is served by backfill too."""
    rng = random.Random(seed)
    sizes = {f"n{i}": rng.choice([1, 2, 4, 8]) for i in range(rng.randint(1, 6))}
    busy = [(f"h{i}", Request(model=A100, count=rng.choice([1, 1, 2]))) for i in range(rng.randint(0, 12))]
    line = [(f"w{i}", Request(model=A100, count=rng.choice([1, 1, 2, 4, 8]))) for i in range(rng.randint(1, 8))]
    results = {}
    for backfill in (False, True):
        alloc = cluster(sizes)
        for who, request in busy:
            try:
                alloc.allocate(who, request)
            except AllocationRefused:
                pass
        served, _ = serve(alloc, line, backfill)
        results[backfill] = served
    strict, backfilled = results[False], results[True]
    assert backfilled[: len(strict)] == strict  # the same, up to the first that strict order leaves waiting


def test_a_share_waiter_is_planned_on_the_host_with_the_most_room_on_one_device():
    alloc = Allocator(
        [GPU(h, 0, f"GPU-{h}", A100, 81920) for h in ("gpu-a", "gpu-b")], sharing={A100: {"quantum": 0.05}}
    )
    alloc.allocate("a", Request(model=A100, milli=800, host="gpu-a"))  # 0.2 left
    alloc.allocate("b", Request(model=A100, milli=600, host="gpu-b"))  # 0.4 left
    assert alloc.nearest_host(Request(model=A100, milli=500)) == "gpu-b"
    assert alloc.nearest_host(Request(model=A100, milli=500), frozenset({"gpu-b"})) == "gpu-a"
    # A whole GPU: neither has one untouched, both have one that will be: by name.
    assert alloc.nearest_host(Request(model=A100, milli=UNIT)) == "gpu-a"


# -- planned starts, where the holders' ends are bounded ---------------------------------


def test_whole_gpus_start_when_enough_devices_have_all_their_holders_ended():
    devices = {"d0": {}, "d1": {"a": UNIT}, "d2": {"b": 500, "c": 500}, "d3": {"u": UNIT}}
    ends = {"a": 3600.0, "b": 600.0, "c": 7200.0, "u": None}.get
    assert planned_start(Request(count=1), devices, ends) == (0.0, None)  # d0 is free now
    assert planned_start(Request(count=2), devices, ends) == (3600.0, "a")
    assert planned_start(Request(count=3), devices, ends) == (7200.0, "c")  # d2 frees when both have ended
    assert planned_start(Request(count=4), devices, ends) is None  # d3's holder has no limit


def test_a_share_starts_when_one_device_has_room_for_it():
    devices = {"d0": {"a": 600, "b": 300}, "d1": {"c": 800}}
    ends = {"a": 3600.0, "b": 60.0, "c": 1800.0}.get
    assert planned_start(Request(milli=100), devices, ends) == (0.0, None)
    assert planned_start(Request(milli=400), devices, ends) == (60.0, "b")
    assert planned_start(Request(milli=500), devices, ends) == (1800.0, "c")


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.lists(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([250, 500, UNIT])), max_size=3), max_size=5),
    st.lists(st.one_of(st.none(), st.integers(0, 10)), min_size=6, max_size=6),
    st.one_of(st.integers(1, 5).map(lambda n: Request(count=n)), st.sampled_from([250, 500, 750]).map(_share)),
)
def test_the_planned_start_is_the_first_moment_it_fits_as_holders_end_one_by_one(held, ends, request):
    """Brute force: step through the holders' ends in time and try the request at each."""
    devices: dict[str, dict[str, int]] = {}
    for i, pieces in enumerate(held):
        booked: dict[str, int] = {}
        for holder, milli in pieces:
            if sum(booked.values()) + milli <= UNIT and f"h{holder}" not in booked:
                booked[f"h{holder}"] = milli
        devices[f"d{i}"] = booked
    end_of = {f"h{i}": (None if t is None else float(t)) for i, t in enumerate(ends)}

    def fits(gone: set[str]) -> bool:
        rooms = [UNIT - sum(m for h, m in b.items() if h not in gone) for b in devices.values()]
        if request.milli is not None:
            return any(r >= request.milli for r in rooms)
        return sum(r == UNIT for r in rooms) >= int(request.count)

    want = None
    for t in sorted({0.0} | {e for e in end_of.values() if e is not None}):
        if fits({h for h, e in end_of.items() if e is not None and e <= t}):
            want = t
            break
    got = planned_start(request, devices, end_of.get)
    if want is None:
        assert got is None
    else:
        assert got is not None and got[0] == want
    if got is not None and got[1] is not None:
        assert end_of[got[1]] == got[0]  # it names the holder whose end it waits for


def test_a_request_that_ends_before_the_planned_start_may_use_the_kept_host_too():
    """The EASY rule: what it takes there is back before the waiter starts."""
    plan = Round(lambda request, kept: "gpu-a", starts=lambda request, host: (3600.0, "alice"))
    plan.wait("bob", Request(model=A100, count=8))
    assert plan.avoid() == {"gpu-a"}  # no bound on its end
    assert plan.avoid(7200.0) == {"gpu-a"}  # it would still hold it when bob starts
    assert plan.avoid(1800.0) == frozenset()  # back by then
    unknown = Round(lambda request, kept: "gpu-a", starts=lambda request, host: None)
    unknown.wait("bob", Request(model=A100, count=8))
    assert unknown.avoid(60.0) == {"gpu-a"}  # bob's start is not known: kept


def test_a_kept_start_is_worked_out_again_once_its_host_changes_or_it_is_a_minute_old():
    calls, version, clock = [], {"gpu-a": 1}, [100.0]

    def compute(request, host):
        calls.append(host)
        return (600.0, "alice")

    cache = StartsCache(compute, version.get, lambda: clock[0])
    bob = Request(model=A100, count=2)
    assert cache.starts(100.0)(bob, "gpu-a") == (600.0, "alice")
    clock[0] = 130.0  # half a minute on, in a plan made then: the same moment, 30 s nearer
    assert cache.starts(130.0)(bob, "gpu-a") == (570.0, "alice") and calls == ["gpu-a"]
    version["gpu-a"] = 2  # a booking on gpu-a changed
    assert cache.starts(130.0)(bob, "gpu-a") == (600.0, "alice") and len(calls) == 2
    clock[0] = 200.0  # more than a minute after it was worked out
    cache.starts(200.0)(bob, "gpu-a")
    assert len(calls) == 3
    cache.starts(200.0)(Request(model=A100, count=1), "gpu-a")  # another shape: its own
    assert len(calls) == 4
    cache.starts(200.0)(Request(model=A100, count=1, cpu_milli=4000, memory_mib=8192), "gpu-a")  # more room
    assert len(calls) == 5


def test_a_share_waiter_where_every_device_is_held_is_planned_on_a_host_all_the_same():
    alloc = Allocator([GPU("gpu-a", 0, "GPU-a", A100, 81920)], sharing={A100: {"quantum": 0.05}})
    alloc.allocate("whole", Request(model=A100, count=1))
    assert alloc.nearest_host(Request(model=A100, milli=250)) == "gpu-a"
    alloc.release("whole")
    alloc.allocate("full", Request(model=A100, milli=UNIT, host="gpu-a"))
    assert alloc.nearest_host(Request(model=A100, milli=250)) == "gpu-a"


def test_the_plan_follows_the_cluster_a_host_that_frees_up_sooner_becomes_the_plan():
    """Guards docs/line.md: "when another host frees up sooner than the one kept, the plan moves there"."""
    alloc = cluster({"gpu-a": 8, "gpu-b": 8})
    hold(alloc, "gpu-a", 6)  # 2 free
    hold(alloc, "gpu-b", 3)  # 5 free
    big = Request(model=A100, count=8)
    assert Round(alloc.nearest_host).wait("big", big) == "gpu-b"
    for i in range(6):
        alloc.release(f"gpu-a-{i}")  # gpu-a's servers end first
    assert Round(alloc.nearest_host).wait("big", big) == "gpu-a"


@st.composite
def lines_to_plan(draw):
    """A cluster of two models, some of it held (whole GPUs and shares), CPU known on
    some hosts, and a line of requests of a few kinds (so kinds repeat), with a booking
    or a release at some places in it."""
    hosts = draw(st.lists(st.sampled_from(["n1", "n02", "gpu-b", "gpu-a", "x", "A", "b7"]), min_size=1, unique=True))
    model = {h: draw(st.sampled_from([A100, T4])) for h in hosts}
    sizes = {h: draw(st.integers(1, 8)) for h in hosts}
    held = {h: draw(st.integers(0, n)) for h, n in sizes.items()}
    cpus = {h: draw(st.sampled_from([None, 4_000, 16_000])) for h in hosts}
    kinds = st.builds(
        Request,
        model=st.sampled_from([A100, T4, None]),
        count=st.integers(1, 8),
        cpu_milli=st.sampled_from([0, 2_000, 8_000]),
    ) | st.builds(Request, model=st.sampled_from([A100, T4]), milli=st.sampled_from([250, 500]))
    shapes = draw(st.lists(kinds, min_size=1, max_size=4))
    line = draw(st.lists(st.sampled_from(shapes), min_size=1, max_size=12))
    changes = draw(st.lists(st.integers(0, len(line) - 1), max_size=2))
    return hosts, model, sizes, held, cpus, line, changes


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines_to_plan())
def test_a_plans_walks_kept_between_waiters_give_what_nearest_host_gives_afresh(case):
    """Allocator.planner (walks resumed waiter after waiter, made anew when the cluster
    changes) against nearest_host worked out afresh for each waiter of a line."""
    hosts, model, sizes, held, cpus, line, changes = case
    alloc = Allocator(
        [GPU(h, i, f"GPU-{h}-{i}", model[h], 81920) for h in hosts for i in range(sizes[h])],
        sharing={A100: {"quantum": 0.05}, T4: {"quantum": 0.05}},
    )
    for h in hosts:
        if cpus[h] is not None:
            alloc.set_host_resources(h, cpus[h], 1 << 20)
        for i in range(held[h]):
            try:
                alloc.allocate(f"{h}-{i}", Request(model=model[h], count=1, host=h, cpu_milli=1_000))
            except AllocationRefused:  # the host's CPU is all reserved
                break
    planner, kept = alloc.planner(), {}
    for i, request in enumerate(line):
        if i in changes:  # a server ends, or a share is granted, between two waiters
            gone = next(iter(alloc.holdings()), None)
            if gone is not None and i % 2:
                alloc.release(gone)
            else:
                try:
                    alloc.allocate(f"new-{i}", Request(milli=250))
                except AllocationRefused:
                    pass
        want = alloc.nearest_host(request, frozenset(kept))
        assert planner(request, kept.keys()) == want
        if want is not None:
            kept[want] = i


def test_where_starts_are_known_a_waiter_keeps_its_last_plans_host_unless_another_starts_it_sooner():
    """ "Lacks least" alone would move the plan to a host that starts it later (a server
    ending elsewhere changes which host lacks least), and its planned start with it.

    Guards docs/line.md, "Backfill": "A waiter with a planned start keeps its host from one
    serving to the next unless another host would start it sooner"."""
    alloc = cluster({"gpu-a": 4, "gpu-b": 4})
    hold(alloc, "gpu-a", 1)
    hold(alloc, "gpu-b", 2)
    big = Request(model=A100, count=4)

    def plan(ends: dict[str, float], before: dict[str, str]) -> Round:
        starts = lambda request, host: planned_start(request, alloc.host_devices(host), ends.get)  # noqa: E731
        return Round(alloc.planner(), starts=starts, before=before, could=alloc.could_take)

    b_sooner = {"gpu-a-0": 100.0, "gpu-b-0": 5.0, "gpu-b-1": 10.0}
    assert plan(b_sooner, {}).wait("big", big) == "gpu-a"  # lacks least: 1 GPU, not 2
    kept = plan(b_sooner, {"big": "gpu-b"})
    assert kept.wait("big", big) == "gpu-b" and kept.start_of("big") == (10.0, "gpu-b-1")
    a_sooner = {"gpu-a-0": 10.0, "gpu-b-0": 5.0, "gpu-b-1": 100.0}
    moved = plan(a_sooner, {"big": "gpu-b"})
    assert moved.wait("big", big) == "gpu-a" and moved.start_of("big") == (10.0, "gpu-a-0")
    tied = {"gpu-a-0": 10.0, "gpu-b-0": 10.0, "gpu-b-1": 10.0}
    assert plan(tied, {"big": "gpu-b"}).wait("big", big) == "gpu-b"  # no sooner elsewhere: it stays
    # Not a host now kept for a waiter ahead, nor one that could no longer take it.
    ahead = plan(b_sooner, {"first": "gpu-b", "big": "gpu-b"})
    assert ahead.wait("first", big) == "gpu-b" and ahead.wait("big", big) == "gpu-a"
    alloc.set_available_hosts(["gpu-a"])  # gpu-b drained
    assert plan(b_sooner, {"big": "gpu-b"}).wait("big", big) == "gpu-a"
    # Without known starts (servers without a time limit) the plan follows "lacks least".
    assert Round(alloc.planner(), before={"big": "gpu-b"}, could=alloc.could_take).wait("big", big) == "gpu-a"
