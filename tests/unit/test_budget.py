"""Weekly GPU-hour budgets: use within the last 7 days, and when enough is back."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuspawner.core.budget import WEEK, refusal, weekly_budget

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)


def span(ago_h: float, hours: float | None, gpus: float = 1.0):
    start = NOW - ago_h * H
    return (start, None if hours is None else start + hours * H, gpus)


@pytest.mark.parametrize(
    "spans, budget, used, frees_at",
    [
        ([], 20, 0.0, None),
        ([span(30, 5)], 20, 5.0, None),
        # only what lies within the window counts: 2 of the 10 h
        ([span(7 * 24 + 8, 10)], 20, 2.0, None),
        # a share counts as its fraction
        ([span(10, 10, 0.25)], 20, 2.5, None),
        # 25 of 20: 5 must age out, from the oldest: 6 days ago + 5 h, a week on
        ([span(6 * 24, 10), span(24, 15)], 20, 25.0, NOW - 6 * 24 * H + 5 * H + WEEK),
        # exactly used up: the first second of its oldest span ages out
        ([span(48, 20)], 20, 20.0, NOW - 48 * H + WEEK),
        # still held (2 GPUs, 25 h so far): counts up to now; 30 must age out
        ([span(25, None, 2.0)], 20, 50.0, NOW - 25 * H + 15 * H + WEEK),
        # two spans at once age out together (2 GPUs' worth): 4 to go takes 2 h
        ([span(100, 10), span(100, 10), span(5, 4)], 20, 24.0, NOW - 100 * H + 2 * H + WEEK),
    ],
)
def test_use_within_the_week_and_when_it_is_back(spans, budget, used, frees_at):
    b = weekly_budget(spans, budget, NOW)
    assert b.used == pytest.approx(used)
    assert b.over == (frees_at is not None)
    assert b.frees_at == frees_at
    assert b.left == pytest.approx(max(0.0, budget - used))


def test_the_refusal_says_when_and_whether_running_servers_count():
    assert refusal(weekly_budget([span(30, 5)], 20, NOW)) is None
    done = refusal(weekly_budget([span(48, 20)], 20, NOW))
    assert done == (
        "Your weekly GPU budget of 20 GPU-hours is used up (20.0 GPU-hours in the last 7 days); "
        "CPU-only servers can start now. GPUs can be had again from 2026-12-06 12:00 UTC."
    )
    held = refusal(weekly_budget([span(25, None, 2.0)], 20, NOW))
    assert held.endswith("from 2026-12-08 02:00 UTC, once your running GPU servers stop.")


@given(
    st.lists(
        st.tuples(st.floats(0, 300), st.floats(0.01, 100), st.sampled_from([0.25, 0.5, 1.0, 2.0])),
        min_size=1,
        max_size=6,
    ),
    st.floats(0.5, 100),
)
def test_at_frees_at_the_use_is_back_at_the_budget_and_not_before(raw, budget):
    spans = [(NOW - ago * H, min(NOW, NOW - ago * H + hours * H), g) for ago, hours, g in raw]
    b = weekly_budget(spans, budget, NOW)
    if not b.over:
        assert b.frees_at is None and b.used < budget
        return
    assert b.frees_at is not None and b.frees_at > NOW
    # Nothing held after now: the use at t is that of [t - week, t].
    at = weekly_budget(spans, budget, b.frees_at)
    assert at.used <= budget + 1e-6
    early = weekly_budget(spans, budget, b.frees_at - timedelta(seconds=2))
    assert early.used >= budget - 2 * sum(g for *_, g in spans) / 3600 - 1e-6
