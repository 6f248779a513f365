"""Weekly GPU-hour budgets: how much of one user's budget the last 7 days
used, and when enough of it is back. Pure: the ledger's spans go in.

A span is (started, ended or None while still held, GPUs): whole GPUs count
1 each, shares as their fraction. An open span counts up to now.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import NamedTuple

__all__ = ["WEEK", "Budget", "Span", "refusal", "summary", "weekly_budget"]

WEEK = timedelta(days=7)
Span = tuple[datetime, datetime | None, float]


class Budget(NamedTuple):
    hours: float  # the budget
    used: float  # GPU-hours within the window up to now
    frees_at: datetime | None  # over budget: when use falls below it, if nothing more is held
    holding: bool  # the user still holds GPUs (their use goes on)

    @property
    def left(self) -> float:
        return max(0.0, self.hours - self.used)

    @property
    def over(self) -> bool:
        return self.used >= self.hours


def _used_after(spans: list[tuple[datetime, datetime, float]], since: datetime) -> float:
    """GPU-hours of ``spans`` (closed) after ``since``."""
    return sum(max(0.0, (end - max(start, since)).total_seconds()) * gpus for start, end, gpus in spans) / 3600


def weekly_budget(spans: Iterable[Span], hours: float, now: datetime, window: timedelta = WEEK) -> Budget:
    """``hours`` of budget against ``spans`` within [now - window, now].

    Over budget, ``frees_at`` is the first time t at which the use within
    [t - window, t] is back below the budget if no GPU is held after now,
    that is, when enough of the oldest use has aged out of the window."""
    closed = [(s, e if e is not None and e < now else now, g) for s, e, g in spans if g > 0]
    holding = any(e is None or e > now for _, e, _ in spans)
    since = now - window
    used = _used_after(closed, since)
    if used < hours:
        return Budget(hours, used, None, holding)
    # Use after L falls as L (= t - window) moves on, linearly between the
    # spans' starts and ends: find the segment where it crosses the budget.
    points = sorted({p for s, e, _ in closed for p in (s, e) if p > since} | {since})
    lo = since
    for point in points:
        at = _used_after(closed, point)
        if at < hours:
            before = _used_after(closed, lo)
            frac = 0.0 if before == at else (before - hours) / (before - at)
            crossing = lo + (point - lo) * frac
            crossing = datetime.fromtimestamp(math.ceil(crossing.timestamp()), tz=crossing.tzinfo)
            return Budget(hours, used, crossing + window, holding)
        lo = point
    return Budget(hours, used, None, holding)  # unreachable for hours > 0: all use ends by now


def refusal(budget: Budget) -> str | None:
    """Why a GPU request is refused over ``budget`` (None: it is not over)."""
    if not budget.over:
        return None
    message = (
        f"Your weekly GPU budget of {budget.hours:g} GPU-hours is used up "
        f"({budget.used:.1f} GPU-hours in the last 7 days); CPU-only servers can start now."
    )
    if budget.frees_at is not None:
        message += f" GPUs can be had again from {budget.frees_at:%Y-%m-%d %H:%M} UTC"
        message += ", once your running GPU servers stop." if budget.holding else "."
    return message


def summary(budget: Budget) -> str:
    """What the form and the home page say of ``budget``."""
    return refusal(budget) or (
        f"Your weekly GPU budget: {budget.left:.1f} of {budget.hours:g} GPU-hours left (over the last 7 days)."
    )
