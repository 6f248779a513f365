"""The packing figure of benchmarks/bench_shares.py: what it compares with is
the most any allocator can place, and with uneven and split_small the
allocator places that much on one node."""

from __future__ import annotations

import pytest

from benchmarks import bench_shares
from benchmarks.bench_shares import MODEL, fill, most


@pytest.mark.parametrize("mix", ["uniform", "70/30"])
def test_one_node_places_all_that_fits_with_uneven_and_split_small(monkeypatch, mix):
    monkeypatch.setitem(
        bench_shares.SHARING, MODEL, {"quantum": 0.01, "split": True, "uneven": True, "split_small": True}
    )
    for seed in range(30):
        assert fill(1, mix, "pack", seed)[1] == most(mix, seed), seed


@pytest.mark.parametrize("mix", ["uniform", "70/30"])
def test_no_allocator_places_more_than_the_bound(mix):
    placed = [fill(1, mix, "pack", seed)[1] for seed in range(30)]  # even splits, a share ≤ 1 on one device
    bounds = [most(mix, seed) for seed in range(30)]
    assert all(p <= b for p, b in zip(placed, bounds))
    assert sum(placed) < sum(bounds)  # those rules refuse some requests that the room in all would take


def test_the_ab_least_times_are_at_least_as_fast_as_every_round(monkeypatch):
    from benchmarks import bench_shares_ab
    from benchmarks.impl import THIS

    monkeypatch.setattr(
        bench_shares_ab, "CASES", [("2 nodes", 2, "uniform", "pack", False), ("1 node", 1, "70/30", "pack", False)]
    )
    runs = bench_shares_ab.compare(THIS, rounds=3, ops=300, seed=1)
    for key, least in zip(("before", "after"), runs["least_per_s"]):
        for name in ("2 nodes", "1 node"):
            rates = [r[name]["per_s"] for r in runs[key]]
            assert len(rates) == 3 and least[name] >= max(rates) * (1 - 1e-9), (key, name, least[name], rates)
    assert "least times" in bench_shares_ab.table(runs, "other")


def test_bytecodes_per_decision_are_the_same_every_run_and_fewer_for_whole_gpus():
    from benchmarks.bench_bytecodes import per_decision

    shares = [per_decision(2, "uniform", "pack", False, 200) for _ in range(2)]
    whole = per_decision(2, "uniform", "pack", True, 200)
    assert shares[0] == shares[1] > whole > 50
