"""Fractional GPU shares in the allocator: table-driven vectors (in the style of
Backend.AI's FractionAllocMap tests), refusals, adopt, release and the views.

Device state in a vector is written per host as a list, one entry per device
(index 0, 1, ...): a number is the share already booked on it (0: untouched),
"W" a device held whole. UUIDs are ``GPU-<host>-<index>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

import pytest

from gpuspawner.allocator.allocator import ALL, AdoptReason, AllocationRefused, Allocator, Refusal, Request
from gpuspawner.core.inventory import GPU
from gpuspawner.core.sharing import UNIT, fmt, to_milli

A100 = "NVIDIA A100 80GB PCIe"
T4 = "NVIDIA Tesla T4"
GTX = "NVIDIA GeForce GTX 1070"
MEMORY = {A100: 81920, T4: 15360, GTX: 8192}
SPLIT = {"*": {"quantum": 0.05, "split": True}}
UNEVEN = {"*": {"quantum": 0.05, "split": True, "uneven": True}}
NO_SPLIT = {"*": {"quantum": 0.05}}
SPLIT_SMALL = {"*": {"quantum": 0.05, "split": True, "split_small": True}}  # shares of at most 1 GPU split too
UNEVEN_SMALL = {"*": {"quantum": 0.05, "split": True, "uneven": True, "split_small": True}}


def inventory(state: dict, model: str = A100) -> list[GPU]:
    out = []
    for host, devices in state.items():
        entries = devices if isinstance(devices, list) else [(model, devices)]
        index = 0
        for entry in entries:
            m, used = entry if isinstance(entry, tuple) else (model, entry)
            out.append(GPU(host, index, f"GPU-{host}-{index}", m, MEMORY[m]))
            index += 1
    return out


def booked(state: dict, sharing: dict, policy: str = "pack") -> Allocator:
    """An allocator with the state's shares and whole devices already held."""
    alloc = Allocator(inventory(state), policy=policy, sharing=sharing)
    for host, devices in state.items():
        for index, entry in enumerate(devices):
            used = entry[1] if isinstance(entry, tuple) else entry
            uuid = f"GPU-{host}-{index}"
            if used == "W":
                assert alloc.adopt(f"pre-{uuid}", "pre", host, [uuid])[1] == []
            elif used:
                assert alloc.adopt(f"pre-{uuid}", "pre", host, [uuid], [to_milli(used)])[1] == []
    return alloc


def placement(a) -> dict[str, str]:
    return {d.uuid: fmt(m) for d, m in zip(a.devices, a.milli)}


def bookings(alloc: Allocator) -> dict[str, dict[str, int]]:
    """Every inventory device, by host and index, with who holds how much of it."""
    return {g.uuid: alloc.booked_on(g.uuid) for g in sorted(alloc._index.gpus.values())}


def allocated(alloc: Allocator) -> dict[str, str]:
    """Each device's booked total, as the allocation map sums its holders."""
    return {uuid: fmt(sum(booked.values())) for uuid, booked in bookings(alloc).items()}


def refusal(alloc: Allocator, request: Request, **kw) -> AllocationRefused:
    before = (alloc.holdings(), bookings(alloc), alloc.summary())
    with pytest.raises(AllocationRefused) as info:
        alloc.allocate("refused", request, **kw)
    assert (alloc.holdings(), bookings(alloc), alloc.summary()) == before, "a refused request must change nothing"
    return info.value


@dataclass(frozen=True)
class Vector:
    name: str
    state: dict
    share: object
    expect: dict  # uuid -> piece, as text
    sharing: dict = field(default_factory=lambda: SPLIT)
    model: str | None = A100
    host: str | None = None
    policy: str = "pack"


VECTORS = [
    # Fits on one device: the device with the least room that still fits.
    Vector("untouched devices: lowest index", {"a": [0, 0]}, 0.5, {"GPU-a-0": "0.5"}),
    Vector("least room that fits", {"a": [0.3, 0.6, 0]}, 0.3, {"GPU-a-1": "0.3"}),
    Vector("an exact fit fills the device", {"a": [0.5, 0]}, 0.5, {"GPU-a-0": "0.5"}),
    Vector("too little room on the shared one: an untouched one", {"a": [0.7, 0]}, 0.5, {"GPU-a-1": "0.5"}),
    Vector("least room across hosts", {"a": [0.2, 0], "b": [0.6, 0]}, 0.4, {"GPU-b-0": "0.4"}),
    Vector("equal room: hostname, then index", {"b": [0.5, 0.5], "a": [0, 0.5, 0.5]}, 0.25, {"GPU-a-1": "0.25"}),
    Vector("never on a device held whole", {"a": ["W", 0]}, 0.5, {"GPU-a-1": "0.5"}),
    Vector(
        "pack: the untouched device on the host with fewest untouched",
        {"a": [0, 0, 0], "b": ["W", 0]},
        0.5,
        {"GPU-b-1": "0.5"},
    ),
    Vector(
        "spread: the untouched device on the host with most untouched",
        {"a": [0, 0, 0], "b": ["W", 0]},
        0.5,
        {"GPU-a-0": "0.5"},
        policy="spread",
    ),
    Vector("pinned host: least room there", {"a": [0.6, 0], "b": [0.1, 0.2]}, 0.3, {"GPU-b-1": "0.3"}, host="b"),
    Vector(
        "pinned host, any model, all untouched: ranked as whole GPUs (pack: fewest free)",
        {"a": [(A100, 0), (A100, 0), (T4, 0)]},
        0.5,
        {"GPU-a-2": "0.5"},
        model=None,
        host="a",
    ),
    # More than one device has free: split evenly over the fewest devices of one host.
    Vector("1.2 -> 0.6 + 0.6", {"a": [0, 0]}, 1.2, {"GPU-a-0": "0.6", "GPU-a-1": "0.6"}),
    Vector("1.3 -> 0.65 + 0.65 (quantum 0.05)", {"a": [0, 0]}, 1.3, {"GPU-a-0": "0.65", "GPU-a-1": "0.65"}),
    Vector(
        "1.3 -> 0.7 + 0.6 (quantum 0.1): the larger piece where least room fits it",
        {"a": [0.2, 0.3]},
        1.3,
        {"GPU-a-0": "0.6", "GPU-a-1": "0.7"},
        sharing={"*": {"quantum": 0.1, "split": True}},
    ),
    Vector("seed: 1.2 next to a 0.2 share", {"a": [0.2, 0]}, 1.2, {"GPU-a-0": "0.6", "GPU-a-1": "0.6"}),
    Vector("split_small: 0.8 -> 0.4 + 0.4", {"a": [0.6, 0.6]}, 0.8, {"GPU-a-0": "0.4", "GPU-a-1": "0.4"}, SPLIT_SMALL),
    Vector(
        "fewest devices wins over least room",
        {"a": [0.5, 0.5, 0.5], "b": [0, 0]},
        1.2,
        {"GPU-b-0": "0.6", "GPU-b-1": "0.6"},
    ),
    Vector(
        "same number of devices: least room", {"a": [0, 0], "b": [0.3, 0, 0]}, 1.2, {"GPU-b-0": "0.6", "GPU-b-1": "0.6"}
    ),
    Vector(
        "2.5 over three devices", {"a": [0, 0, 0, 0]}, 2.5, {"GPU-a-0": "0.85", "GPU-a-1": "0.85", "GPU-a-2": "0.8"}
    ),
    Vector("2 -> two whole devices", {"a": [0.5, 0, 0]}, 2, {"GPU-a-1": "1", "GPU-a-2": "1"}),
    Vector(
        "one model only on a mixed host",
        {"a": [(GTX, 0), (A100, 0.5), (A100, 0)]},
        1.1,
        {"GPU-a-1": "0.5", "GPU-a-2": "0.6"},
        sharing={"*": {"quantum": 0.1, "split": True}},
    ),
    Vector(
        "any model: only shareable models",
        {"a": [(GTX, 0), (A100, 0)]},
        0.5,
        {"GPU-a-1": "0.5"},
        sharing={A100: {"quantum": 0.5}},
        model=None,
    ),
    Vector("allowed list", {"a": [0.5, 0]}, 0.5, {"GPU-a-0": "0.5"}, sharing={"*": {"shares": [0.25, 0.5]}}),
    Vector("exact values from floats, Decimals and Fractions", {"a": [0.1, 0]}, Decimal("0.9"), {"GPU-a-0": "0.9"}),
    Vector(
        "split: past devices on hosts without a second one that fits",
        {**{f"b{i}": [0.4, "W"] for i in range(6)}, "y": [0.2, 0.35], "z": [0.3, 0.3]},
        1.2,
        {"GPU-y-0": "0.6", "GPU-y-1": "0.6"},
    ),
    # Uneven splits, where the admin allows them and no even split fits: the
    # freest devices first. The seed case stays even (0.2, then 1.2 -> 0.80, 0.60).
    Vector(
        "uneven, split_small: 0.6 on 0.2 and 0.4 free",
        {"a": [0.8, 0.6]},
        0.6,
        {"GPU-a-0": "0.2", "GPU-a-1": "0.4"},
        sharing=UNEVEN_SMALL,
    ),
    Vector(
        "uneven: an even split still comes first",
        {"a": [0.2, 0]},
        1.2,
        {"GPU-a-0": "0.6", "GPU-a-1": "0.6"},
        sharing=UNEVEN,
    ),
    Vector("uneven: 1.1 as 0.9 + 0.2", {"a": [0.1, 0.75]}, 1.1, {"GPU-a-0": "0.9", "GPU-a-1": "0.2"}, sharing=UNEVEN),
    Vector(
        "uneven: the host with the least room in all",
        {"a": [0.1, 0.75, 0.5], "b": [0.1, 0.75]},
        1.1,
        {"GPU-b-0": "0.9", "GPU-b-1": "0.2"},
        sharing=UNEVEN,
    ),
]


@pytest.mark.parametrize("v", VECTORS, ids=[v.name for v in VECTORS])
def test_vectors(v: Vector):
    alloc = booked(v.state, v.sharing, v.policy)
    before = allocated(alloc)
    got = alloc.allocate("s", Request(v.model, host=v.host, owner="alice", milli=to_milli(v.share)))
    assert placement(got) == v.expect
    assert got.holder == "s" and got.owner == "alice"
    assert len({d.host for d in got.devices}) == 1
    assert sum(got.milli) == got.total_milli == to_milli(v.share)
    after = allocated(alloc)
    for uuid, piece in v.expect.items():
        assert to_milli(Decimal(after[uuid])) == to_milli(Decimal(before[uuid])) + to_milli(Decimal(piece))
    assert alloc.milli_held_by("alice") == to_milli(v.share)


def test_the_seed_example():
    """Two GPUs of one model; 0.2, then 1.2: both start; the map shows 0.80 and 0.60."""
    alloc = Allocator(inventory({"gpu-a": [0, 0]}), sharing=SPLIT)
    first = alloc.allocate("alice", Request(A100, owner="alice", milli=200))
    second = alloc.allocate("bob", Request(A100, owner="bob", milli=1200))
    assert (first.uuids, first.milli) == (("GPU-gpu-a-0",), (200,))
    assert (second.uuids, second.milli) == (("GPU-gpu-a-0", "GPU-gpu-a-1"), (600, 600))
    assert allocated(alloc) == {"GPU-gpu-a-0": "0.8", "GPU-gpu-a-1": "0.6"}


# --------------------------------------------------------------------------
# Refusals: never as asked (400) apart from not now (409)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state, sharing, request_, kw, retry, message",
    [
        (
            {"a": [0, 0]},
            NO_SPLIT,
            Request(A100, milli=1200),
            {},
            False,
            f"1.2 of a GPU requested, but shares of {A100} are at most 1 GPU (splitting over several devices is not enabled)",
        ),
        (
            {"a": [0.6, 0.6]},
            NO_SPLIT,
            Request(A100, milli=500),
            {},
            True,
            f"0.5 × {A100} requested, but not that much is free on one device right now (at most 0.4 on one device)",
        ),
        (
            {"a": [0.6, 0.6]},
            SPLIT_SMALL,
            Request(A100, milli=1000),
            {},
            True,
            f"1 × {A100} requested, but not that much is free on one device or one host right now (at most 0.4 on one device)",
        ),
        (
            {"a": [0.8, 0.6]},
            SPLIT_SMALL,
            Request(A100, milli=600),
            {},
            True,
            f"0.6 × {A100} requested, but no even split fits right now: a has 0.6 free in all, on devices with 0.4, "
            f"0.2 free (at most 0.4 on one device); uneven splits are not enabled for {A100}",
        ),
        (
            {"a": [0.8, 0.7]},
            NO_SPLIT,
            Request(A100, milli=600),
            {},
            True,
            f"0.6 × {A100} requested, but only 0.5 is free in all right now (at most 0.3 on one device)",
        ),
        (
            {"a": [0], "b": [0]},
            SPLIT,
            Request(A100, milli=1200),
            {},
            False,
            f"1.2 × {A100} requested, but no host has more than 1 to split it over",
        ),
        (
            {"a": [0, 0]},
            None,
            Request(A100, milli=500),
            {},
            False,
            f"{A100} is not shared on this hub; ask for whole GPUs (gpu_count) instead",
        ),
        (
            {"a": [0, 0]},
            None,
            Request(None, milli=500),
            {},
            False,
            "GPU sharing is not enabled on this hub; ask for whole GPUs (gpu_count) instead",
        ),
        (
            {"a": [0, 0]},
            SPLIT,
            Request(A100, milli=330),
            {},
            False,
            f"0.33 of a GPU is not offered for {A100}; choose a multiple of 0.05",
        ),
        (
            {"a": [0, 0]},
            {"*": {"shares": [0.25, 0.5]}},
            Request(A100, milli=300),
            {},
            False,
            f"0.3 of a GPU is not offered for {A100}; choose one of: 0.25, 0.5",
        ),
        ({"a": [0, 0]}, SPLIT, Request(A100, milli=0), {}, False, "gpu_share must be more than 0"),
        (
            {"a": [0, 0]},
            SPLIT,
            Request(A100, milli=0.5),  # type: ignore[arg-type]
            {},
            False,
            "a share must be whole thousandths of a GPU, got 0.5",
        ),
        (
            {"a": [0, 0]},
            SPLIT,
            Request(A100, milli=True),
            {},
            False,
            "a share must be whole thousandths of a GPU, got True",
        ),
        (
            {"a": [0, 0]},
            SPLIT,
            Request(A100, milli="500"),  # type: ignore[arg-type]
            {},
            False,
            "a share must be whole thousandths of a GPU, got '500'",
        ),
        ({"a": [0, 0]}, SPLIT, Request("NVIDIA H100 80GB HBM3", milli=500), {}, False, "Unknown GPU model"),
        (
            {"a": [0, 0]},
            SPLIT,
            Request(A100, milli=1500, owner="alice"),
            {"max_per_owner": 1},
            False,
            f"1.5 × {A100} requested, but the limit is 1 per user",
        ),
        ({"a": [0, 0]}, SPLIT, Request(A100, milli=500, host="z"), {}, False, "z is not a GPU host; choose one of: a"),
        (
            {"a": [0, 0], "b": [0]},
            SPLIT,
            Request(A100, milli=1500, host="b"),
            {},
            False,
            f"1.5 × {A100} requested on b, which has 1 of that model",
        ),
        (
            {"a": [0.9, 0.9], "b": [0]},
            SPLIT,
            Request(A100, milli=500, host="a"),
            {},
            True,
            f"0.5 × {A100} requested on a, not enough free there right now",
        ),
    ],
    ids=lambda x: x if isinstance(x, str) and len(x) < 40 else None,
)
def test_refusals(state, sharing, request_, kw, retry, message):
    e = refusal(booked(state, sharing), request_, **kw)
    assert message in e.message
    assert e.retry is retry and e.status == (409 if retry else 400)


def test_unavailable_pinned_host_may_come_back():
    alloc = booked({"a": [0], "b": [0]}, SPLIT)
    alloc.set_available_hosts(["b"])
    e = refusal(alloc, Request(A100, milli=500, host="a"))
    assert e.retry is True and "a is not available right now" in e.message
    assert placement(alloc.allocate("s", Request(A100, milli=500))) == {"GPU-b-0": "0.5"}
    alloc.set_available_hosts(None)
    assert placement(alloc.allocate("t", Request(A100, milli=250, host="a"))) == {"GPU-a-0": "0.25"}


def test_shared_devices_on_unavailable_hosts_are_not_offered():
    alloc = booked({"a": [0.5], "b": [0.2]}, SPLIT)
    alloc.set_available_hosts(["b"])
    assert placement(alloc.allocate("s", Request(A100, milli=500))) == {"GPU-b-0": "0.5"}
    assert refusal(alloc, Request(A100, milli=400)).retry is True
    alloc.set_available_hosts(None)
    assert placement(alloc.allocate("t", Request(A100, milli=400))) == {"GPU-a-0": "0.4"}


# --------------------------------------------------------------------------
# Whole GPUs and shares side by side
# --------------------------------------------------------------------------


def test_whole_requests_take_only_untouched_devices():
    alloc = booked({"a": [0.2, 0, 0]}, SPLIT)
    assert alloc.allocate("w", Request(A100, 2)).uuids == ("GPU-a-1", "GPU-a-2")
    assert refusal(alloc, Request(A100, 1)).retry is True
    assert refusal(alloc, Request(A100, ALL)).retry is True
    alloc.release("pre-GPU-a-0")
    assert alloc.allocate("w2", Request(A100, 1)).uuids == ("GPU-a-0",)


def test_per_owner_limit_counts_shares():
    alloc = booked({"a": [0, 0, 0]}, SPLIT)
    alloc.allocate("alice-1", Request(A100, owner="alice", milli=500), max_per_owner=2)
    assert alloc.milli_held_by("alice") == 500
    e = refusal(alloc, Request(A100, 2, owner="alice"), max_per_owner=2)
    assert e.retry is True and e.message.endswith("the limit is 2 per user and you already hold 0.5 on other servers")
    e = refusal(alloc, Request(A100, owner="alice", milli=1600), max_per_owner=2)
    assert e.retry is True and "you already hold 0.5 on other servers" in e.message
    alloc.allocate("alice-2", Request(A100, owner="alice", milli=1500), max_per_owner=2)
    assert alloc.milli_held_by("alice") == 2000
    alloc.release("alice-1")
    assert alloc.milli_held_by("alice") == 1500
    assert alloc.allocate("alice-3", Request(A100, owner="alice", milli=500), max_per_owner=2)


def test_release_is_idempotent_and_frees_the_share_only():
    alloc = booked({"a": [0, 0]}, SPLIT)
    alloc.allocate("x", Request(A100, milli=200))
    y = alloc.allocate("y", Request(A100, milli=1200))
    assert allocated(alloc) == {"GPU-a-0": "0.8", "GPU-a-1": "0.6"}
    assert alloc.release("y") == y
    assert alloc.release("y") is None
    assert allocated(alloc) == {"GPU-a-0": "0.2", "GPU-a-1": "0"}
    (s,) = alloc.summary()
    assert (s.free, s.largest_block, s.largest_milli) == (1, 1, 1000)
    alloc.release("x")
    (s,) = alloc.summary()
    assert (s.free, s.largest_block) == (2, 2)
    assert alloc.allocate("w", Request(A100, 2)).uuids == ("GPU-a-0", "GPU-a-1")


def test_a_share_that_comes_out_whole_is_held_whole():
    alloc = booked({"a": [0, 0]}, SPLIT)
    got = alloc.allocate("s", Request(A100, milli=2000))
    assert got.milli == (1000, 1000) and not got.shared
    assert alloc.booked_on("GPU-a-0") == {"s": UNIT}
    alloc.release("s")
    assert allocated(alloc) == {"GPU-a-0": "0", "GPU-a-1": "0"}


def test_set_inventory_keeps_shares():
    alloc = booked({"a": [0.5, 0]}, SPLIT)
    alloc.set_inventory(inventory({"a": [0, 0], "b": [0]}))
    assert allocated(alloc) == {"GPU-a-0": "0.5", "GPU-a-1": "0", "GPU-b-0": "0"}
    assert placement(alloc.allocate("s", Request(A100, milli=500))) == {"GPU-a-0": "0.5"}
    alloc.set_inventory(inventory({"b": [0]}))  # a's devices leave while shared
    alloc.release("s")
    alloc.release("pre-GPU-a-0")
    assert alloc.holdings() == {} and alloc.booked_on("GPU-a-0") == {}


def test_policy_change_keeps_holdings():
    alloc = booked({"a": [0.5, 0]}, SPLIT)
    alloc.set_sharing(None)
    assert allocated(alloc)["GPU-a-0"] == "0.5"
    assert refusal(alloc, Request(A100, milli=500)).retry is False
    assert alloc.allocate("w", Request(A100, 1)).uuids == ("GPU-a-1",)
    with pytest.raises(ValueError, match="quantum must divide 1 GPU evenly"):
        alloc.set_sharing({"*": {"quantum": 0.3}})


# --------------------------------------------------------------------------
# adopt: shares from labels, over-booking found
# --------------------------------------------------------------------------


def test_adopt_shares_and_report_over_booking():
    alloc = booked({"a": [0, 0, 0]}, SPLIT)
    got, problems = alloc.adopt("s1", "alice", "a", ["GPU-a-0", "GPU-a-1"], [600, 0.6])
    assert [p.message for p in problems] == [
        "GPU-a-1: share 0.6 is not a share of one GPU in thousandths; booked whole"
    ]
    assert problems[0].reason is AdoptReason.UNREADABLE_SHARE and not problems[0].reason.double_booking
    assert got.milli == (1000, 1000) and not got.shared  # a share it cannot read books the devices whole
    alloc.release("s1")

    got, problems = alloc.adopt("s1", "alice", "a", ["GPU-a-0", "GPU-a-1"], [600, 600])
    assert problems == [] and got.milli == (600, 600)
    got, problems = alloc.adopt("s2", "bob", "a", ["GPU-a-0", "GPU-a-2"], [500, 500])
    assert [p.message for p in problems] == ["GPU-a-0 would be booked to 1.1 of 1 (0.6 by s1, 0.5 here)"]
    assert problems[0].reason is AdoptReason.OVERBOOKED and problems[0].reason.double_booking
    assert got.uuids == ("GPU-a-2",) and got.milli == (500,)
    got, problems = alloc.adopt("s3", "carol", "a", ["GPU-a-1"])
    assert [p.message for p in problems] == ["GPU-a-1 is shared (0.6 by s1); it cannot also be held whole"]
    assert problems[0].reason is AdoptReason.SHARED_BY_OTHERS and problems[0].reason.double_booking
    assert got.devices == ()
    got, problems = alloc.adopt("s4", "erin", "a", ["GPU-a-1"], [400])
    assert problems == [] and allocated(alloc) == {"GPU-a-0": "0.6", "GPU-a-1": "1", "GPU-a-2": "0.5"}
    assert alloc.milli_held_by("bob") == 500 and alloc.milli_held_by("carol") == 0


def test_adopt_share_on_a_device_held_whole():
    alloc = booked({"a": ["W", 0]}, SPLIT)
    got, problems = alloc.adopt("s", "alice", "a", ["GPU-a-0", "GPU-a-1"], [500, 500])
    assert [p.message for p in problems] == ["GPU-a-0 is held whole by pre-GPU-a-0"]
    assert problems[0].reason is AdoptReason.HELD_WHOLE_BY_ANOTHER and problems[0].reason.double_booking
    assert got.uuids == ("GPU-a-1",)


def test_adopt_mismatched_shares_book_whole():
    alloc = booked({"a": [0, 0]}, SPLIT)
    got, problems = alloc.adopt("s", "alice", "a", ["GPU-a-0", "GPU-a-1"], [500])
    assert [p.message for p in problems] == ["1 shares for 2 devices; booked whole"]
    assert problems[0].reason is AdoptReason.SHARES_MISMATCH and got.milli == (1000, 1000) and len(got.devices) == 2


def test_adopt_is_idempotent_with_shares_and_replaces_them():
    alloc = booked({"a": [0, 0]}, SPLIT)
    first, _ = alloc.adopt("s", "alice", "a", ["GPU-a-0"], [250])
    again, problems = alloc.adopt("s", "alice", "a", ["GPU-a-0"], (250,))
    assert again is first and problems == []
    pair, _ = alloc.adopt("p", "bob", "a", ["GPU-a-0", "GPU-a-1"], [500, 250])
    swapped, _ = alloc.adopt("p", "bob", "a", ["GPU-a-1", "GPU-a-0"], [500, 250])
    assert swapped is not pair and swapped.booking() != pair.booking()
    assert allocated(alloc) == {"GPU-a-0": "0.5", "GPU-a-1": "0.5"}
    assert alloc.adopt("p", "bob", "a", ["GPU-a-0", "GPU-a-1"], [250, 500])[0] is swapped
    alloc.release("p")
    moved, problems = alloc.adopt("s", "alice", "a", ["GPU-a-0"], [750])
    assert problems == [] and moved.milli == (750,)
    assert allocated(alloc)["GPU-a-0"] == "0.75" and alloc.milli_held_by("alice") == 750


def test_adopt_rebuilds_the_same_map():
    """A hub restart: holdings re-adopted from labels give the same allocation map."""
    alloc = booked({"a": [0, 0, 0], "b": [0, 0]}, SPLIT)
    for i, share in enumerate([0.2, 1.2, 0.35, 2, 0.5, 0.15]):
        alloc.allocate(f"s{i}", Request(A100, owner=f"u{i % 2}", milli=to_milli(share)))
    fresh = Allocator(inventory({"a": [0, 0, 0], "b": [0, 0]}), sharing=SPLIT)
    for a in alloc.holdings().values():
        assert fresh.adopt(a.holder, a.owner, a.host, a.uuids, a.milli)[1] == []
    assert bookings(fresh) == bookings(alloc) and fresh.summary() == alloc.summary()


# --------------------------------------------------------------------------
# Views for the allocation map, metrics and the form
# --------------------------------------------------------------------------


def test_booked_on_names_each_holder_and_share():
    alloc = Allocator(inventory({"a": [0, 0, (T4, 0)], "b": [(T4, 0)]}), sharing=SPLIT)
    alloc.allocate("y", Request(A100, owner="bob", milli=1200))
    alloc.allocate("x", Request(A100, owner="alice", milli=200))
    alloc.allocate("w", Request(T4, 1, owner="carol"))
    alloc.set_available_hosts(["a"])
    assert list(alloc.booked_on("GPU-a-0").items()) == [("x", 200), ("y", 600)]  # by holder name
    assert alloc.booked_on("GPU-a-1") == {"y": 600} and alloc.holding("x").owner == "alice"
    assert alloc.device("GPU-a-2") == GPU("a", 2, "GPU-a-2", T4, 15360) and alloc.device("GPU-x") is None
    assert alloc.booked_on("GPU-a-2") == {"w": UNIT} and alloc.booked_on("GPU-b-0") == {}
    counts = {s.model: (s.total, s.free, s.unavailable) for s in alloc.summary()}
    assert counts == {A100: (2, 0, 0), T4: (2, 0, 1)}


def test_summary_tells_the_form_what_may_be_shared():
    alloc = Allocator(
        inventory({"a": [0, 0, (T4, 0)]}), sharing={A100: {"quantum": 0.05, "split": True}, T4: {"shares": [0.25, 0.5]}}
    )
    alloc.allocate("x", Request(A100, milli=1700))
    by = {s.model: s for s in alloc.summary()}
    a100, t4 = by[A100], by[T4]
    assert (a100.shareable, a100.quantum, a100.shares, a100.split, a100.split_small) == (True, 50, None, True, False)
    assert (a100.free, a100.largest_block, a100.largest_milli, a100.largest_share) == (0, 0, 150, 0.15)
    # Whether a share of at most one GPU may span devices (the form cannot tell then whether it fits).
    assert Allocator(inventory({"a": [0]}), sharing=SPLIT_SMALL).summary()[0].split_small
    assert (t4.shareable, t4.quantum, t4.shares, t4.split, t4.largest_milli) == (True, 250, (250, 500), False, 1000)
    plain = Allocator(inventory({"a": [0]})).summary()[0]
    assert (plain.shareable, plain.quantum, plain.shares, plain.split, plain.largest_milli) == (
        False,
        None,
        None,
        False,
        0,
    )


def test_each_share_says_which_rule_placed_it():
    alloc = booked({"a": [0, 0]}, UNEVEN_SMALL)
    rules = [alloc.allocate(f"s{i}", Request(A100, milli=m)).rule for i, m in enumerate([200, 1200, 600])]
    assert rules == ["one device", "even split", "uneven split"]
    assert allocated(alloc) == {"GPU-a-0": "1", "GPU-a-1": "1"}
    assert booked({"a": [0]}, UNEVEN).allocate("w", Request(A100, count=1)).rule is None  # whole GPUs
    adopted, problems = booked({"a": [0]}, UNEVEN).adopt("x", "ann", "a", ["GPU-a-0"], [500])
    assert problems == [] and adopted.milli == (500,) and adopted.rule is None  # rebuilt from the cluster


def test_without_uneven_the_same_request_waits():
    alloc = booked({"a": [0.8, 0.6]}, SPLIT)
    assert refusal(alloc, Request(A100, milli=600)).retry


@pytest.mark.parametrize(
    "state, sharing, share, reason",
    [
        ({"a": [0.6, 0.6]}, NO_SPLIT, 0.5, Refusal.NO_DEVICE_ROOM),
        ({"a": [0.8, 0.7]}, NO_SPLIT, 0.6, Refusal.TOTAL_FREE_BELOW),
        ({"a": [0.8, 0.6]}, SPLIT_SMALL, 0.6, Refusal.NO_EVEN_SPLIT),
        ({"a": [0.6, 0.6]}, SPLIT_SMALL, 1, Refusal.NOT_ON_ONE_HOST),
        ({"a": [0.6, 0.6]}, SPLIT, 0.8, Refusal.NO_DEVICE_ROOM),  # at most 1 GPU: one device unless split_small
        ({"a": [0.8, 0.6]}, UNEVEN, 0.6, Refusal.NO_DEVICE_ROOM),
        ({"a": [0.1, 0.75]}, SPLIT, 1.1, Refusal.NO_EVEN_SPLIT),  # 0.9 + 0.2 only with uneven
    ],
)
def test_share_refusals_name_the_reason(state, sharing, share, reason):
    e = refusal(booked(state, sharing), Request(A100, milli=to_milli(share)))
    assert e.reason is reason and e.retry


def test_uneven_turned_on_later_finds_the_hosts_a_fresh_allocator_would():
    state = {"a": [0.8, 0.6], "b": [0.1, 0.75]}
    alloc = booked(state, SPLIT)
    alloc.set_sharing(UNEVEN)
    assert alloc._index.models[A100] == booked(state, UNEVEN)._index.models[A100]
    assert placement(alloc.allocate("s", Request(A100, milli=1100))) == {"GPU-b-0": "0.9", "GPU-b-1": "0.2"}
    alloc.set_sharing(SPLIT)
    assert alloc._index.models[A100].totals == []  # kept only while some model splits unevenly


@pytest.mark.parametrize("sharing", [SPLIT, UNEVEN], ids=["split", "uneven"])
def test_a_share_of_at_most_one_gpu_stays_on_one_device_unless_split_small(sharing):
    """Without split_small, 0.8 waits for a device with 0.8 free and is told
    what one device has; shares above 1 still split."""
    alloc = booked({"a": [0.6, 0.6]}, sharing)
    e = refusal(alloc, Request(A100, milli=800))
    assert e.reason is Refusal.NO_DEVICE_ROOM and e.retry
    assert e.message == (
        f"0.8 × {A100} requested, but not that much is free on one device right now (at most 0.4 on one device)"
    )
    assert placement(booked({"a": [0.6, 0, 0]}, sharing).allocate("s", Request(A100, milli=1200))) == {
        "GPU-a-1": "0.6",
        "GPU-a-2": "0.6",
    }
    assert placement(
        booked({"a": [0.6, 0.6]}, {"*": {**sharing["*"], "split_small": True}}).allocate("s", Request(A100, milli=800))
    ) == {"GPU-a-0": "0.4", "GPU-a-1": "0.4"}


def test_a_refusal_counts_free_room_only_up_to_the_request():
    """Telling no_device_room from total_free_below needs the total only when it is below the request."""
    from gpuspawner.allocator.refusals import _free_up_to

    alloc = booked({f"h{i}": [0.6, 0.6] for i in range(50)}, SPLIT)
    mi = alloc._index.models[A100]
    assert _free_up_to([mi], 41 * UNIT) == 40 * UNIT  # below the request: exact (50 hosts × 0.8)
    assert 800 <= _free_up_to([mi], 800) < 40 * UNIT  # stops once there is enough
    assert refusal(alloc, Request(A100, milli=800)).reason is Refusal.NO_DEVICE_ROOM


def test_the_models_a_share_may_go_to_follow_policy_and_inventory_changes():
    """What a share was accepted for before is not reused once the policy or the inventory changed."""
    alloc = booked({"a": [0, 0]}, SPLIT)
    assert placement(alloc.allocate("s", Request(milli=500))) == {"GPU-a-0": "0.5"}
    alloc.set_sharing({"*": {"quantum": 0.2}})
    refused = refusal(alloc, Request(milli=500))
    assert refused.reason is Refusal.BAD_SHARE and "multiples of 0.2" in refused.message
    alloc.set_sharing(None)
    assert refusal(alloc, Request(milli=500)).reason is Refusal.BAD_SHARE
    alloc.set_sharing(SPLIT)
    gpus = [GPU("a", i, f"GPU-a-{i}", T4, MEMORY[T4]) for i in range(2)]
    alloc.set_host_devices("a", gpus)  # the A100s leave, T4s come
    assert refusal(alloc, Request(A100, milli=500)).reason is Refusal.UNKNOWN_MODEL
    assert alloc.allocate("t", Request(milli=500)).model == T4
    alloc.set_inventory(inventory({"b": [0]}))
    assert refusal(alloc, Request(T4, milli=500)).reason is Refusal.UNKNOWN_MODEL


@pytest.mark.parametrize("scan_hosts", [1, 0])
def test_a_split_goes_where_the_tightest_partly_booked_device_is_on_hosts_of_one_model(monkeypatch, scan_hosts):
    """Two models, one host each: no split ranks are kept (each host's devices
    are looked at directly), and the answer is the one the ranks give (scan_hosts=0)."""
    from gpuspawner.allocator import index as allocator_index

    monkeypatch.setattr(allocator_index, "SCAN_HOSTS", scan_hosts)
    state = {"a": [(A100, 0.1), (A100, 0.4)], "b": [(T4, 0.3), (T4, 0.3)]}  # rooms 0.9, 0.6 / 0.7, 0.7
    alloc = Allocator(inventory(state), sharing=SPLIT)
    for host, devices in state.items():
        for index, (_, used) in enumerate(devices):
            alloc.adopt(f"pre-{host}{index}", "pre", host, [f"GPU-{host}-{index}"], [to_milli(used)])
    assert all(mi.scan is (scan_hosts == 1) for mi in alloc._index.models.values())
    got = alloc.allocate("s", Request(milli=1200))  # 0.6 + 0.6: the device with 0.6 free is on a
    assert (got.host, got.rule, placement(got)) == ("a", "even split", {"GPU-a-0": "0.6", "GPU-a-1": "0.6"})
    assert placement(alloc.allocate("t", Request(milli=1400))) == {"GPU-b-0": "0.7", "GPU-b-1": "0.7"}
    assert refusal(alloc, Request(milli=1200)).reason is Refusal.NOT_ON_ONE_HOST  # 0.3 left in all
