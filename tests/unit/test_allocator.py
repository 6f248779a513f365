"""Table-driven tests of gpuspawner.allocator.allocator: policies, pinning, limits, refusals, adopt.

The edge cases at the end were bugs once; they stay as regression tests.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

import pytest

from gpuspawner.allocator.allocator import (
    ALL,
    POLICIES,
    AdoptReason,
    Allocation,
    AllocationRefused,
    Allocator,
    Refusal,
    Request,
)
from gpuspawner.core.inventory import GPU
from gpuspawner.core.inventory_files import load_inventory
from gpuspawner.core.sharing import UNIT

GTX = "NVIDIA GeForce GTX 1070"
A100 = "NVIDIA A100 80GB PCIe"
T4 = "NVIDIA Tesla T4"
MEMORY = {GTX: 8192, A100: 81920, T4: 15360}


def gpus(spec: dict) -> list[GPU]:
    """``{host: n}`` (n GTX 1070s) or ``{host: [(model, n), ...]}`` -> GPUs.

    Indices run 0.. per host in the order given; UUIDs are ``GPU-<host>-<index>``."""
    out = []
    for host, devs in spec.items():
        if isinstance(devs, int):
            devs = [(GTX, devs)]
        index = 0
        for model, n in devs:
            for _ in range(n):
                out.append(GPU(host, index, f"GPU-{host}-{index}", model, MEMORY[model]))
                index += 1
    return out


def hold(alloc: Allocator, held: dict[str, int | list[tuple[str, int]]]) -> None:
    """Pin allocations on hosts: ``{host: n}`` (GTX) or ``{host: [(model, n), ...]}``."""
    for host, spec in held.items():
        if isinstance(spec, int):
            spec = [(GTX, spec)]
        for model, n in spec:
            if n:
                alloc.allocate(f"pre-{host}-{model}", Request(model=model, count=n, host=host, owner="pre"))


def refusal(alloc: Allocator, request: Request, **kw) -> AllocationRefused:
    before = alloc.holdings()
    with pytest.raises(AllocationRefused) as info:
        alloc.allocate("refused-holder", request, **kw)
    assert alloc.holdings() == before, "a refused request must not change the holdings"
    return info.value


def free_of(alloc: Allocator, model: str) -> int:
    return {s.model: s.free for s in alloc.summary()}[model]


def placed(a: Allocation) -> tuple[str, str, list[int]]:
    return a.host, a.model, [d.index for d in a.devices]


# --------------------------------------------------------------------------
# Which host each policy picks
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    name: str
    inventory: dict
    request: Request
    pack: tuple[str, str, list[int]]  # host, model, device indices
    spread: tuple[str, str, list[int]]
    held: dict = field(default_factory=dict)


CHOICES = [
    Choice(
        "1 of sizes 8/4/2: pack the smallest, spread the largest",
        {"a": 8, "b": 4, "c": 2},
        Request(GTX, 1),
        pack=("c", GTX, [0]),
        spread=("a", GTX, [0]),
    ),
    Choice(
        "3 of sizes 8/4/2: pack skips hosts too small",
        {"a": 8, "b": 4, "c": 2},
        Request(GTX, 3),
        pack=("b", GTX, [0, 1, 2]),
        spread=("a", GTX, [0, 1, 2]),
    ),
    Choice(
        "2 with 2/4/1 free: pack the exact fit",
        {"a": 4, "b": 4, "c": 4},
        Request(GTX, 2),
        held={"a": 2, "c": 3},
        pack=("a", GTX, [2, 3]),
        spread=("b", GTX, [0, 1]),
    ),
    Choice(
        "1 with 2/4/1 free: pack the host with one left",
        {"a": 4, "b": 4, "c": 4},
        Request(GTX, 1),
        held={"a": 2, "c": 3},
        pack=("c", GTX, [3]),
        spread=("b", GTX, [0]),
    ),
    Choice(
        "equal hosts: tie broken by hostname, not inventory order",
        {"gpu-c": 4, "gpu-a": 4, "gpu-b": 4},
        Request(GTX, 1),
        pack=("gpu-a", GTX, [0]),
        spread=("gpu-a", GTX, [0]),
    ),
    Choice(
        "3 with 3/3/2 free: tie between a and b goes to a",
        {"b": 4, "a": 4, "c": 2},
        Request(GTX, 3),
        held={"b": 1, "a": 1},
        pack=("a", GTX, [1, 2, 3]),
        spread=("a", GTX, [1, 2, 3]),
    ),
    Choice(
        "2 with 3/3/2 free",
        {"b": 4, "a": 4, "c": 2},
        Request(GTX, 2),
        held={"b": 1, "a": 1},
        pack=("c", GTX, [0, 1]),
        spread=("a", GTX, [1, 2]),
    ),
    Choice(
        "a request for a whole host",
        {"a": 8, "b": 2},
        Request(GTX, 8),
        pack=("a", GTX, [0, 1, 2, 3, 4, 5, 6, 7]),
        spread=("a", GTX, [0, 1, 2, 3, 4, 5, 6, 7]),
    ),
    Choice(
        "any model, 1: pack the model/host with least room",
        {"a": [(A100, 2)], "b": [(GTX, 4)], "c": [(T4, 1)]},
        Request(None, 1),
        pack=("c", T4, [0]),
        spread=("b", GTX, [0]),
    ),
    Choice(
        "any model, 2: T4 host too small",
        {"a": [(A100, 2)], "b": [(GTX, 4)], "c": [(T4, 1)]},
        Request(None, 2),
        pack=("a", A100, [0, 1]),
        spread=("b", GTX, [0, 1]),
    ),
    Choice(
        "any model, cross-model tie with hostname and model order agreeing",
        {"a": [(A100, 2)], "b": [(GTX, 2)]},
        Request(None, 1),
        pack=("a", A100, [0]),
        spread=("a", A100, [0]),
    ),
    Choice(
        "a named model is never substituted",
        {"a": [(A100, 2)], "b": [(GTX, 4)], "c": [(T4, 1)]},
        Request(GTX, 1),
        pack=("b", GTX, [0]),
        spread=("b", GTX, [0]),
    ),
    Choice(
        "mixed host: only the requested model's free devices count",
        {"a": [(GTX, 2), (A100, 2)], "b": [(A100, 4)]},
        Request(A100, 2),
        pack=("a", A100, [2, 3]),
        spread=("b", A100, [0, 1]),
    ),
    Choice(
        "mixed host: the other model on it is ignored",
        {"a": [(GTX, 2), (A100, 2)], "b": [(A100, 4)]},
        Request(GTX, 1),
        pack=("a", GTX, [0]),
        spread=("a", GTX, [0]),
    ),
    Choice(
        "pinned host wins over the policy",
        {"a": 2, "b": 4, "c": 8},
        Request(GTX, 1, host="b"),
        pack=("b", GTX, [0]),
        spread=("b", GTX, [0]),
    ),
    Choice(
        "ALL: only hosts with every device free; pack the smallest",
        {"a": 4, "b": 2, "c": 8},
        Request(GTX, ALL),
        held={"a": 1},
        pack=("b", GTX, [0, 1]),
        spread=("c", GTX, list(range(8))),
    ),
    Choice(
        "ALL of a model on a mixed host takes that model only",
        {"a": [(GTX, 2), (A100, 2)], "b": [(A100, 4)]},
        Request(A100, ALL),
        pack=("a", A100, [2, 3]),
        spread=("b", A100, [0, 1, 2, 3]),
    ),
    Choice(
        "ALL of any model: one model's devices, never a mix",
        {"a": [(GTX, 2), (A100, 2)]},
        Request(None, ALL),
        held={"a": [(A100, 1)]},
        pack=("a", GTX, [0, 1]),
        spread=("a", GTX, [0, 1]),
    ),
    Choice(
        "ALL pinned to a whole-free host",
        {"a": 4, "b": 2},
        Request(GTX, ALL, host="a"),
        pack=("a", GTX, [0, 1, 2, 3]),
        spread=("a", GTX, [0, 1, 2, 3]),
    ),
]


@pytest.mark.parametrize("policy", ["pack", "spread"])
@pytest.mark.parametrize("case", CHOICES, ids=[c.name for c in CHOICES])
def test_policy_choice(case: Choice, policy: str):
    alloc = Allocator(gpus(case.inventory), policy=policy)
    hold(alloc, case.held)
    got = alloc.allocate("s", Request(case.request.model, case.request.count, case.request.host, "alice"))
    assert placed(got) == getattr(case, policy)
    assert got.owner == "alice" and got.holder == "s"
    assert got.uuids == tuple(f"GPU-{got.host}-{i}" for i in getattr(case, policy)[2])
    assert all(alloc.booked_on(u) == {"s": UNIT} for u in got.uuids)


def test_pack_keeps_whole_hosts_free_and_spread_does_not():
    """Eight 1-GPU requests on two 8-GPU hosts: pack fills one host, spread alternates."""
    packed, spread = Allocator(gpus({"a": 8, "b": 8}), "pack"), Allocator(gpus({"a": 8, "b": 8}), "spread")
    hosts = {"pack": [], "spread": []}
    for i in range(8):
        hosts["pack"].append(packed.allocate(f"p{i}", Request(GTX, 1)).host)
        hosts["spread"].append(spread.allocate(f"s{i}", Request(GTX, 1)).host)
    assert hosts["pack"] == ["a"] * 8
    assert hosts["spread"] == ["a", "b"] * 4
    # ...so an 8-GPU request still fits after packing, but not after spreading.
    assert packed.allocate("big", Request(GTX, 8)).host == "b"
    assert refusal(spread, Request(GTX, 8)).message == (
        f"8 × {GTX} requested, at most 4 free on any single host (8 free in total)"
    )


def test_devices_are_taken_lowest_index_first_after_releases():
    alloc = Allocator(gpus({"a": 4}))
    for h in ("h0", "h1", "h2"):
        alloc.allocate(h, Request(GTX, 1))
    assert alloc.booked_on("GPU-a-1") == {"h1": UNIT}
    alloc.release("h0")
    alloc.release("h2")
    assert [d.index for d in alloc.allocate("h3", Request(GTX, 3)).devices] == [0, 2, 3]


def test_devices_ordered_by_declared_index_not_list_order():
    inventory = load_inventory(
        {
            "a": [
                {"uuid": "GPU-x7", "model": GTX, "memory_mib": 8192, "index": 7},
                {"uuid": "GPU-x2", "model": GTX, "memory_mib": 8192, "index": 2},
                {"uuid": "GPU-x5", "model": GTX, "memory_mib": 8192, "index": 5},
            ]
        }
    )
    alloc = Allocator(reversed(inventory))
    assert alloc.allocate("s", Request(GTX, 2)).uuids == ("GPU-x2", "GPU-x5")


def test_decisions_do_not_depend_on_inventory_order():
    inventory = gpus({"a": [(GTX, 4), (A100, 2)], "b": 8, "c": [(A100, 4)], "d": [(T4, 3)]})
    rng = random.Random(7)
    requests = [Request(rng.choice([GTX, A100, T4, None]), rng.choice([1, 1, 2, 3, ALL])) for _ in range(40)]
    outcomes = []
    for order in range(3):
        shuffled = list(inventory)
        random.Random(order).shuffle(shuffled)
        alloc, trace = Allocator(shuffled, "pack"), []
        for i, r in enumerate(requests):
            try:
                trace.append(alloc.allocate(f"s{i}", r).uuids)
            except AllocationRefused as e:
                trace.append(e.message)
            if i % 3 == 2:
                alloc.release(f"s{i - 2}")
        outcomes.append(trace)
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert any(isinstance(t, tuple) for t in outcomes[0]) and any(isinstance(t, str) for t in outcomes[0])


# --------------------------------------------------------------------------
# One host, one model per request
# --------------------------------------------------------------------------


def test_never_splits_a_request_across_hosts():
    alloc = Allocator(gpus({"a": 2, "b": 2}))
    hold(alloc, {"a": 1, "b": 1})
    e = refusal(alloc, Request(GTX, 2))
    assert e.message == f"2 × {GTX} requested, at most 1 free on any single host (2 free in total)"
    assert e.reason is Refusal.NOT_ON_ONE_HOST
    assert e.retry is True and e.status == 409


def test_never_mixes_models_on_one_host():
    alloc = Allocator(gpus({"a": [(GTX, 2), (A100, 2)]}))
    e = refusal(alloc, Request(None, 3))
    assert e.message == "3 × GPU requested, but no host has more than 2 of one model"
    assert e.reason is Refusal.NO_HOST_BIG_ENOUGH
    assert e.retry is False and e.status == 400


# --------------------------------------------------------------------------
# ALL
# --------------------------------------------------------------------------


def test_all_refused_while_every_host_has_some_in_use():
    alloc = Allocator(gpus({"a": 4, "b": 2}))
    hold(alloc, {"a": 1, "b": 1})
    e = refusal(alloc, Request(GTX, ALL))
    assert e.message == (f"All GPUs of one host requested ({GTX}), but every host has some in use right now")
    assert e.reason is Refusal.NOT_ON_ONE_HOST
    assert e.status == 409


def test_all_pinned_to_a_partly_used_host():
    alloc = Allocator(gpus({"a": 4, "b": 2}))
    hold(alloc, {"a": 1})
    e = refusal(alloc, Request(GTX, ALL, host="a"))
    assert e.message == "All GPUs of one host requested on a, 3 free there"
    assert e.reason is Refusal.HOST_BUSY
    assert e.status == 409
    assert alloc.allocate("s", Request(GTX, ALL, host="b")).host == "b"


def test_all_bounded_by_max_per_owner():
    alloc = Allocator(gpus({"a": 4}))
    e = refusal(alloc, Request(GTX, ALL, owner="alice"), max_per_owner=2)
    assert e.message == "All GPUs of one host requested (at least 4), but the limit is 2 per user"
    assert e.reason is Refusal.OVER_LIMIT
    assert e.status == 400
    assert len(alloc.allocate("s", Request(GTX, ALL, owner="alice"), max_per_owner=4).devices) == 4


# --------------------------------------------------------------------------
# Pinning to a host
# --------------------------------------------------------------------------


def test_pinned_unknown_host_is_never_satisfiable():
    alloc = Allocator(gpus({"gpu-b": 2, "gpu-a": 2}))
    e = refusal(alloc, Request(GTX, 1, host="gpu-z"))
    assert e.message == "gpu-z is not a GPU host; choose one of: gpu-a, gpu-b"
    assert e.reason is Refusal.UNKNOWN_HOST
    assert e.retry is False and e.status == 400


def test_pinned_unavailable_host_may_come_back():
    alloc = Allocator(gpus({"a": 2, "b": 2}))
    alloc.set_available_hosts(["b"])
    e = refusal(alloc, Request(GTX, 1, host="a"))
    assert e.message == "a is not available right now (it is down, drained or paused)"
    assert e.reason is Refusal.HOST_UNAVAILABLE
    assert e.retry is True and e.status == 409
    alloc.set_available_hosts(None)
    assert alloc.allocate("s", Request(GTX, 1, host="a")).host == "a"


def test_pinned_host_without_enough_free():
    alloc = Allocator(gpus({"a": 2, "b": 4}))
    hold(alloc, {"b": 3})
    e = refusal(alloc, Request(GTX, 2, host="b"))
    assert e.message == f"2 × {GTX} requested on b, 1 free there"
    assert e.reason is Refusal.HOST_BUSY
    assert e.status == 409


# --------------------------------------------------------------------------
# Unavailable hosts
# --------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["pack", "spread"])
def test_unavailable_hosts_are_never_chosen_and_come_back(policy):
    alloc = Allocator(gpus({"a": 2, "b": 4, "c": 8}), policy)
    alloc.set_available_hosts(["b"])
    got = [alloc.allocate(f"s{i}", Request(GTX, 1)).host for i in range(4)]
    assert got == ["b"] * 4
    e = refusal(alloc, Request(GTX, 1))
    assert e.message.startswith(f"No {GTX} is free right now (0 of 14 free)")
    assert e.reason is Refusal.NONE_FREE
    assert e.status == 409
    (s,) = alloc.summary()
    assert (s.free, s.unavailable, s.largest_block) == (0, 10, 0)

    alloc.set_available_hosts(None)
    assert alloc.allocate("back", Request(GTX, 1)).host == ("a" if policy == "pack" else "c")
    (s,) = alloc.summary()
    assert (s.free, s.unavailable, s.largest_block) == ((9, 0, 8) if policy == "pack" else (9, 0, 7))


def test_no_available_hosts_at_all():
    alloc = Allocator(gpus({"a": 2}))
    alloc.set_available_hosts([])
    assert refusal(alloc, Request(GTX, 1)).status == 409
    assert refusal(alloc, Request(None, ALL)).status == 409


def test_release_on_an_unavailable_host_is_free_when_it_returns():
    alloc = Allocator(gpus({"a": 2, "b": 2}))
    alloc.allocate("s", Request(GTX, 2, host="a"))
    alloc.set_available_hosts(["b"])
    alloc.release("s")
    assert free_of(alloc, GTX) == 2  # a's devices do not count while a is away
    alloc.set_available_hosts(["a", "b"])
    assert free_of(alloc, GTX) == 4
    assert alloc.allocate("t", Request(GTX, 2, host="a")).uuids == ("GPU-a-0", "GPU-a-1")


# --------------------------------------------------------------------------
# max_per_owner
# --------------------------------------------------------------------------


def test_max_per_owner_counts_across_the_owners_servers():
    alloc = Allocator(gpus({"a": 4, "b": 4}), "spread")
    alloc.allocate("alice-1", Request(GTX, 1, owner="alice"), max_per_owner=3)
    alloc.allocate("alice-2", Request(GTX, 1, owner="alice"), max_per_owner=3)
    assert {alloc.holdings()[h].host for h in ("alice-1", "alice-2")} == {"a", "b"}

    e = refusal(alloc, Request(GTX, 2, owner="alice"), max_per_owner=3)
    assert e.message == "2 GPU(s) requested, but the limit is 3 per user and you already hold 2 on other servers"
    assert e.reason is Refusal.LIMIT_REACHED
    assert e.retry is True and e.status == 409

    assert len(alloc.allocate("bob-1", Request(GTX, 2, owner="bob"), max_per_owner=3).devices) == 2
    alloc.allocate("alice-3", Request(GTX, 1, owner="alice"), max_per_owner=3)
    assert alloc.milli_held_by("alice") == 3000
    alloc.release("alice-1")
    alloc.release("alice-3")
    assert len(alloc.allocate("alice-4", Request(GTX, 2, owner="alice"), max_per_owner=3).devices) == 2


def test_max_per_owner_request_over_the_limit_is_never_satisfiable():
    alloc = Allocator(gpus({"a": 4}))
    e = refusal(alloc, Request(GTX, 2, owner="alice"), max_per_owner=1)
    assert e.message == "2 GPUs requested, but the limit is 1 per user"
    assert e.reason is Refusal.OVER_LIMIT
    assert e.retry is False and e.status == 400


def test_max_per_owner_counts_adopted_holdings():
    alloc = Allocator(gpus({"a": 4}))
    alloc.adopt("alice-old", "alice", "a", ["GPU-a-0", "GPU-a-1"])
    e = refusal(alloc, Request(GTX, 1, owner="alice"), max_per_owner=2)
    assert "you already hold 2 on other servers" in e.message
    assert alloc.allocate("s", Request(GTX, 1, owner="alice")).uuids == ("GPU-a-2",)  # no limit given


# --------------------------------------------------------------------------
# release
# --------------------------------------------------------------------------


def test_release_is_idempotent_and_returns_devices():
    alloc = Allocator(gpus({"a": 4}))
    first = alloc.allocate("s", Request(GTX, 3))
    assert free_of(alloc, GTX) == 1
    assert alloc.release("s") == first
    assert alloc.release("s") is None
    assert alloc.release("never-held") is None
    assert free_of(alloc, GTX) == 4
    assert alloc.holdings() == {}
    assert all(alloc.booked_on(u) == {} for u in first.uuids)
    assert alloc.allocate("s", Request(GTX, 3)).uuids == first.uuids


def test_a_holder_holds_one_allocation():
    alloc = Allocator(gpus({"a": 4}))
    alloc.allocate("s", Request(GTX, 1))
    with pytest.raises(ValueError, match="s already holds an allocation; release it first"):
        alloc.allocate("s", Request(GTX, 1))
    assert len(alloc.holdings()["s"].devices) == 1


def test_concurrent_allocations_never_share_a_device():
    alloc = Allocator(gpus({f"n{i}": 8 for i in range(8)}), "spread")
    granted: list[Allocation] = []
    barrier = threading.Barrier(16)

    def worker(t: int):
        barrier.wait()
        for i in range(10):
            try:
                granted.append(alloc.allocate(f"t{t}-{i}", Request(GTX, 1 + (t + i) % 2)))
            except AllocationRefused:
                pass

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    uuids = [u for a in granted for u in a.uuids]
    assert len(uuids) == len(set(uuids)) == 64
    assert free_of(alloc, GTX) == 0


# --------------------------------------------------------------------------
# adopt
# --------------------------------------------------------------------------


def test_adopt_records_and_reports_problems():
    alloc = Allocator(gpus({"a": 4, "b": 4}))
    alloc.allocate("s1", Request(GTX, 2, host="a"))
    got, problems = alloc.adopt("s2", "bob", "a", ["GPU-a-1", "GPU-a-2", "GPU-nope", "GPU-b-0"])
    assert [p.message for p in problems] == [
        "GPU-a-1 is also held by s1",
        "GPU-nope is not in the inventory",
        "GPU-b-0 is on b, not on a",
    ]
    reasons = [p.reason for p in problems]
    assert reasons == [AdoptReason.HELD_BY_ANOTHER, AdoptReason.NOT_IN_INVENTORY, AdoptReason.ON_ANOTHER_HOST]
    assert [r.double_booking for r in reasons] == [True, False, False]
    assert got.uuids == ("GPU-a-2",) and got.owner == "bob" and got.host == "a"
    assert alloc.booked_on("GPU-a-1") == {"s1": UNIT}
    assert alloc.booked_on("GPU-a-2") == {"s2": UNIT}
    assert alloc.booked_on("GPU-b-0") == {}
    assert alloc.milli_held_by("bob") == 1000


def test_adopted_devices_are_not_handed_out_again():
    """A hub restart: a fresh allocator learns what the swarm runs, then allocates."""
    alloc = Allocator(gpus({"a": 4, "b": 2}), "pack")
    alloc.adopt("alice-srv", "alice", "b", ["GPU-b-1"])
    alloc.adopt("bob-srv", "bob", "a", ["GPU-a-0", "GPU-a-3"])
    assert free_of(alloc, GTX) == 3
    assert alloc.allocate("n1", Request(GTX, 1)).uuids == ("GPU-b-0",)  # pack: b has 1 free
    assert alloc.allocate("n2", Request(GTX, 2)).uuids == ("GPU-a-1", "GPU-a-2")
    assert refusal(alloc, Request(GTX, 1)).message.startswith(f"No {GTX} is free right now (0 of 6 free)")
    alloc.release("bob-srv")
    assert alloc.allocate("n3", Request(GTX, 2)).uuids == ("GPU-a-0", "GPU-a-3")


def test_adopt_is_idempotent_and_replaces_a_holding():
    alloc = Allocator(gpus({"a": 4}))
    first, problems = alloc.adopt("s", "alice", "a", ["GPU-a-0", "GPU-a-1"])
    again, problems_again = alloc.adopt("s", "alice", "a", ["GPU-a-1", "GPU-a-0"])
    assert problems == problems_again == []
    assert again is first
    assert free_of(alloc, GTX) == 2

    moved, _ = alloc.adopt("s", "alice", "a", ["GPU-a-3"])
    assert moved.uuids == ("GPU-a-3",)
    assert alloc.booked_on("GPU-a-0") == {} and alloc.booked_on("GPU-a-3") == {"s": UNIT}
    assert free_of(alloc, GTX) == 3
    assert alloc.allocate("t", Request(GTX, 3)).uuids == ("GPU-a-0", "GPU-a-1", "GPU-a-2")


# --------------------------------------------------------------------------
# Refusal messages and status
# --------------------------------------------------------------------------


def test_no_device_of_the_model_free_names_the_others():
    alloc = Allocator(gpus({"a": [(A100, 2), (T4, 1)], "b": [(A100, 2)], "c": [(GTX, 4)]}))
    hold(alloc, {"a": [(A100, 2), (T4, 1)], "b": [(A100, 2)], "c": [(GTX, 1)]})
    e = refusal(alloc, Request(A100, 1))
    # T4 has none free either, so it is not offered.
    assert e.message == f"No {A100} is free right now (0 of 4 free); {GTX}: 3 free"
    assert e.retry is True and e.status == 409


def test_nothing_free_at_all():
    alloc = Allocator(gpus({"a": [(A100, 1)], "b": [(GTX, 1)]}))
    hold(alloc, {"a": [(A100, 1)], "b": [(GTX, 1)]})
    assert refusal(alloc, Request(A100, 1)).message == (
        f"No {A100} is free right now (0 of 1 free); no other GPU model is free either"
    )
    assert refusal(alloc, Request(None, 1)).message == (
        "No GPU is free right now (0 of 2 free); no other GPU model is free either"
    )


def test_more_than_any_host_has():
    alloc = Allocator(gpus({"a": 4, "b": 2}))
    e = refusal(alloc, Request(GTX, 8))
    assert e.message == f"8 × {GTX} requested, but no host has more than 4"
    assert e.retry is False and e.status == 400


def test_unknown_model():
    alloc = Allocator(gpus({"a": [(GTX, 1)], "b": [(A100, 1)]}))
    e = refusal(alloc, Request("NVIDIA H100 80GB HBM3", 1))
    assert e.message.startswith("Unknown GPU model 'NVIDIA H100 80GB HBM3'; choose one of: ")
    assert GTX in e.message and A100 in e.message
    assert e.retry is False and e.status == 400


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError) as info:
        Allocator(gpus({"a": 1}), policy="best-fit")
    assert str(info.value) == "unknown allocation policy 'best-fit'; choose one of: pack, spread, frag"
    assert set(POLICIES) == {"pack", "spread", "frag"}


def test_summary_fields():
    alloc = Allocator(gpus({"a": [(GTX, 2), (A100, 2)], "b": [(A100, 4)], "c": [(A100, 1)]}))
    hold(alloc, {"b": [(A100, 1)]})
    alloc.set_available_hosts(["a", "b"])
    by_model = {s.model: s for s in alloc.summary()}
    assert [s.model for s in alloc.summary()] == sorted(by_model)
    a100, gtx = by_model[A100], by_model[GTX]
    assert (a100.total, a100.free, a100.largest_block, a100.unavailable, a100.memory_mib) == (7, 5, 3, 1, 81920)
    assert (gtx.total, gtx.free, gtx.largest_block, gtx.unavailable, gtx.memory_mib) == (2, 2, 2, 0, 8192)


# --------------------------------------------------------------------------
# Edge cases: each of these was a bug once
# --------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["pack", "spread"])
def test_any_model_tie_broken_by_hostname_then_model(policy):
    alloc = Allocator(gpus({"a": [(GTX, 2)], "b": [(A100, 2)]}), policy)
    # Both candidates have 2 free: the documented tie-break picks host a (GTX);
    # the allocator picks b because "NVIDIA A100..." < "NVIDIA GeForce...".
    assert alloc.allocate("s", Request(None, 1)).host == "a"


def test_count_zero_is_refused():
    alloc = Allocator(gpus({"a": 2}))
    try:
        got = alloc.allocate("s", Request(GTX, 0))
    except (ValueError, AllocationRefused):
        got = None
    assert got is None


def test_negative_count_is_refused_and_cannot_bypass_the_limit():
    alloc = Allocator(gpus({"a": 8}))
    try:
        got = alloc.allocate("s", Request(GTX, -1, owner="alice"), max_per_owner=1)
    except (ValueError, AllocationRefused):
        got = None
    assert alloc.milli_held_by("alice") <= 1000
    assert got is None


@pytest.mark.parametrize(
    "request_",
    [
        Request(A100, 1, host="a"),  # a has no A100 at all
        Request(GTX, 3, host="a"),  # a has only 2 GTX
        Request(None, 3, host="a"),  # a has only 2 devices
    ],
    ids=["model-not-on-host", "more-than-host-has", "any-model-more-than-host-has"],
)
def test_pinned_never_satisfiable_is_400(request_):
    alloc = Allocator(gpus({"a": [(GTX, 2)], "b": [(A100, 4)]}))
    e = refusal(alloc, request_)
    assert e.retry is False and e.status == 400


def test_more_than_any_host_has_is_400_even_when_none_free():
    alloc = Allocator(gpus({"a": 4}))
    hold(alloc, {"a": 4})
    e = refusal(alloc, Request(GTX, 8))
    assert e.retry is False and e.status == 400


def test_count_over_the_limit_is_400_even_when_the_owner_holds_some():
    alloc = Allocator(gpus({"a": 4}))
    alloc.allocate("alice-1", Request(GTX, 1, owner="alice"))
    e = refusal(alloc, Request(GTX, 3, owner="alice"), max_per_owner=2)
    # "3 GPU(s) requested, but the limit is 2 per user and you already hold 1 on other servers"
    assert e.retry is False and e.status == 400


def test_all_with_limit_uses_a_host_within_the_limit():
    alloc = Allocator(gpus({"big": 8, "small": 2}), "spread")
    try:
        host = alloc.allocate("s", Request(GTX, ALL, owner="alice"), max_per_owner=2).host
    except AllocationRefused as e:
        host = e.message
    assert host == "small"


def test_adopt_duplicate_uuid():
    alloc = Allocator(gpus({"a": 4}))
    got, problems = alloc.adopt("s", "alice", "a", ["GPU-a-0", "GPU-a-0"])
    assert len(got.devices) == len(set(got.devices)) and alloc.milli_held_by("alice") == 1000


def test_release_of_an_adopted_holding_without_devices():
    alloc = Allocator(gpus({"a": 2}))
    got, problems = alloc.adopt("alice-old", "alice", "a", ["GPU-gone"])
    assert got.devices == () and [p.message for p in problems] == ["GPU-gone is not in the inventory"]
    alloc.allocate("alice-new", Request(GTX, 1, owner="alice"))
    alloc.release("alice-new")
    assert alloc.release("alice-old") == got
    assert alloc.milli_held_by("alice") == 0


def test_all_with_a_limit_waits_when_only_other_servers_are_in_the_way():
    alloc = Allocator(gpus({"a": 1, "b": 1, "c": 1}))
    alloc.allocate("alice-1", Request(GTX, 1, owner="alice"))
    e = refusal(alloc, Request(GTX, ALL, owner="alice"), max_per_owner=1)
    assert e.retry is True and "you already hold 1 on other servers" in e.message
    alloc.release("alice-1")
    assert len(alloc.allocate("alice-2", Request(GTX, ALL, owner="alice"), max_per_owner=1).devices) == 1


def test_pinned_all_over_the_limit_is_never():
    alloc = Allocator(gpus({"a": 2, "b": 1}))
    e = refusal(alloc, Request(GTX, ALL, host="a", owner="carol"), max_per_owner=1)
    assert e.retry is False and e.message == "All 2 GPUs of a requested, but the limit is 1 per user"


def test_summary_follows_availability_changes_incrementally():
    alloc = Allocator(gpus({"a": 2, "b": 3}))
    alloc.allocate("s", Request(GTX, 1))  # pack: a
    alloc.set_available_hosts(["a"])
    (s,) = alloc.summary()
    assert (s.total, s.free, s.largest_block, s.unavailable) == (5, 1, 1, 3)
    alloc.set_available_hosts(None)
    (s,) = alloc.summary()
    assert (s.total, s.free, s.largest_block, s.unavailable) == (5, 4, 3, 0)


def test_policy_can_be_chosen_per_request_on_one_shared_allocator():
    # Spawners with different policies share one allocator, so one booking.
    alloc = Allocator(gpus({"a": 2, "b": 4}), "pack")
    assert alloc.allocate("s1", Request(GTX, 1), policy="spread").host == "b"
    assert alloc.allocate("s2", Request(GTX, 1)).host == "a"
    assert alloc.booked_on("GPU-b-0") == {"s1": UNIT}
