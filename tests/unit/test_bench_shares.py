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
