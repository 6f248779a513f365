"""Weekly GPU-hour budgets: how much of one user's budget the last 7 days
used, and when enough of it is back. Pure: the ledger's spans go in.

A span is (started, ended or None while still held, GPUs): whole GPUs count
1 each, shares as their fraction. An open span counts up to now.

What a request may add: the GPU-hours the user's running servers may still use
up to their time limits (``committed``) count as spoken for, and a new server
may hold its GPUs for at most what is left over, shared among its GPUs
(:func:`hours_allowed`); the reclaim stops it there, warned, with the end reason
``budget``. So a week's use exceeds the budget by no more than the stops' lag.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import NamedTuple

__all__ = [
    "MIN_HOURS",
    "WEEK",
    "Budget",
    "Span",
    "hours_allowed",
    "refusal",
    "request_refusal",
    "summary",
    "weekly_budget",
]

WEEK = timedelta(days=7)
MIN_HOURS = 5 / 60  # a server the budget would give less time than this is refused
Span = tuple[datetime, datetime | None, float]


class Budget(NamedTuple):
    hours: float  # the budget
    used: float  # GPU-hours within the window up to now
    frees_at: datetime | None  # over budget: when use falls below it, if nothing more is held
    holding: bool  # the user still holds GPUs (their use goes on)
    committed: float = 0.0  # GPU-hours the running servers may still use, up to their time limits

    @property
    def left(self) -> float:
        return max(0.0, self.hours - self.used - self.committed)

    @property
    def over(self) -> bool:
        return self.used + self.committed >= self.hours


def _used_after(spans: list[tuple[datetime, datetime, float]], since: datetime) -> float:
    """GPU-hours of ``spans`` (closed) after ``since``."""
    return sum(max(0.0, (end - max(start, since)).total_seconds()) * gpus for start, end, gpus in spans) / 3600


def weekly_budget(
    spans: Iterable[Span], hours: float, now: datetime, window: timedelta = WEEK, committed: float = 0.0
) -> Budget:
    """``hours`` of budget against ``spans`` within [now - window, now], with
    ``committed`` GPU-hours more spoken for by the servers still running.

    Over budget, ``frees_at`` is the first time t at which the use within
    [t - window, t] is back below the budget if no GPU is held after now,
    that is, when enough of the oldest use has aged out of the window."""
    closed = [(s, e if e is not None and e < now else now, g) for s, e, g in spans if g > 0]
    holding = any(e is None or e > now for _, e, _ in spans)
    since = now - window
    used = _used_after(closed, since)
    if used < hours:
        return Budget(hours, used, None, holding, committed)
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
            return Budget(hours, used, crossing + window, holding, committed)
        lo = point
    return Budget(hours, used, None, holding, committed)  # unreachable for hours > 0: all use ends by now


def refusal(budget: Budget) -> str | None:
    """Why a GPU request is refused over ``budget`` (None: it is not over)."""
    if not budget.over:
        return None
    message = f"Your weekly GPU budget of {budget.hours:g} GPU-hours is used up ({_use(budget)}); CPU-only servers can start now."
    if budget.used >= budget.hours and budget.frees_at is not None:
        message += f" GPUs can be had again from {budget.frees_at:%Y-%m-%d %H:%M} UTC"
        message += ", once your running GPU servers stop." if budget.holding else "."
    elif budget.holding:
        message += " GPUs can be had again once your running GPU servers stop."
    return message


def request_refusal(budget: Budget, gpus: float) -> str | None:
    """Why a request for ``gpus`` GPUs is refused within ``budget``: used up, or
    too little left to hold them for MIN_HOURS (None: it may start)."""
    over = refusal(budget)
    if over or budget.left / gpus >= MIN_HOURS:
        return over
    return (
        f"Your weekly GPU budget has {budget.left:.2f} of {budget.hours:g} GPU-hours left ({_use(budget)}): "
        f"too little for {gpus:g} GPU{'s' if gpus != 1 else ''} (under {MIN_HOURS * 60:.0f} minutes each). "
        "Fewer GPUs, or a CPU-only server, can start now."
    )


def _use(budget: Budget) -> str:
    text = f"{budget.used:.1f} GPU-hours in the last 7 days"
    if budget.committed > 0:
        text += f", and {budget.committed:.1f} more that your running GPU servers may use before their time limits"
    return text


def summary(budget: Budget) -> str:
    """What the form and the home page say of ``budget``."""
    counting = ", counting what your running GPU servers may still use" if budget.committed > 0 else ""
    return refusal(budget) or (
        f"Your weekly GPU budget: {budget.left:.1f} of {budget.hours:g} GPU-hours left (over the last 7 days{counting})."
    )


def hours_allowed(budget: Budget, gpus: float, max_hours: float | None) -> float | None:
    """How long a new server of ``gpus`` GPUs may hold them within ``budget``:
    None when its own ``max_hours`` fits in what is left, else what is left
    divided among its GPUs. Only for a budget that is not over."""
    hours = budget.left / gpus
    return None if max_hours is not None and max_hours <= hours else hours
