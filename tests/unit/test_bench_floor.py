"""benchmarks/bench_floor.py: its floor makes the allocator's decisions on one
host (so it is a lower bound on the cost of those decisions, not another rule),
and its table compares the rates it measured."""

from __future__ import annotations

import random

import pytest

from benchmarks.bench_floor import Floor, FloorRefused, compare, table
from benchmarks.bench_shares import SHARING, draw, inventory
from gpuspawner.allocator.allocator import AllocationRefused, Allocator, Request


def outcome(impl, holder, request, refused):
    try:
        a = impl.allocate(holder, request)
    except refused:
        return None
    return [d.uuid for d in a.devices], a.milli, a.total_milli


@pytest.mark.parametrize("mix", ["uniform", "70/30"])
def test_the_floor_decides_as_the_allocator_does_on_one_host(mix):
    rng = random.Random(7)
    alloc, floor = Allocator(inventory(1), "pack", sharing=SHARING), Floor(inventory(1), sharing=SHARING)
    live, kinds = [], set()
    for step in range(4000):
        if live and rng.random() < 0.45:
            holder = live.pop(rng.randrange(len(live)))
            assert alloc.release(holder).total_milli == floor.release(holder).total_milli
        whole = rng.random() < 0.15
        request = Request(count=rng.choice((1, 2))) if whole else Request(milli=draw(rng, mix))
        got = outcome(alloc, f"h{step}", request, AllocationRefused)
        assert outcome(floor, f"h{step}", request, FloorRefused) == got, (step, request)
        if got is not None:
            live.append(f"h{step}")
            kinds.add("whole" if min(got[1]) == 1000 else len(got[0]) > 1)
        else:
            kinds.add("refused")
    assert kinds == {"whole", True, False, "refused"}  # every kind of decision was compared


def test_the_floor_takes_one_host_only():
    with pytest.raises(ValueError, match="one host"):
        Floor(inventory(2), sharing=SHARING)


def test_the_table_gives_each_case_and_both_ratios():
    out = compare(rounds=2, ops=300, seed=1)
    assert {k: len(v) for k, v in out["floor"].items()} == {"uniform": 2, "70/30": 2, "whole GPUs": 2}
    rows = table(out).splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| uniform", "| 70/30", "| whole GPUs"]
    assert rows[-1].endswith("| 1.00 | 1.00 |")  # whole over whole
