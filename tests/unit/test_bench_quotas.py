"""The quotas' week (benchmarks/bench_quotas.py), small: two days, one seed. Its
figures are the product's rules at work, so these assertions fail when a rule breaks.

Guards docs/quotas.md, "What a week looks like": "every request within its group's
quota for one GPU was served within the notice and a minute", "GPU use stays what it is
without quotas", and "without borrowing, the best-effort group gets nothing"."""

from __future__ import annotations

from benchmarks import bench_quotas
from gpuspawner.core.quotas import NOTICE


def test_the_week_uses_the_products_notice():
    assert bench_quotas.NOTICE == NOTICE


def test_within_quota_one_gpu_requests_are_served_within_the_notice_and_use_stays():
    runs = {mode: [] for mode in bench_quotas.MODES}
    for seed in (0, 1):
        asks = bench_quotas.draw(2, seed)
        for mode in bench_quotas.MODES:
            runs[mode].append(bench_quotas.Week(mode, 2).simulate(asks))
    late = [
        h
        for run in runs["borrowing"]
        for h in run.served
        if run.within.get(h.ask.id) and h.ask.gpus == 1 and (h.start - h.ask.at) > NOTICE + NOTICE / 10
    ]
    assert late == []
    result = {mode: bench_quotas.figures(rs, 2) for mode, rs in runs.items()}
    assert result["borrowing"]["use"] > result["none"]["use"] - 0.03
    assert result["no borrowing"][bench_quotas.BEST_EFFORT]["served"] == 0
    assert result["borrowing"]["stops"] > 0  # borrowed servers were taken back
    for lab in bench_quotas.QUOTAS:  # and without quotas, the labs wait longer
        assert result["none"][lab]["wait_p95"] >= result["borrowing"][lab]["wait_p95"]
