"""Fair share: who has used GPUs recently, as the line's order counts it (pure).

A user's *recent use* is their GPU-hours with each moment weighted by
2^(−age / half-life): an hour of one GPU held right now counts 1, a week ago
(with a 7-day half-life) 0.5, two weeks ago 0.25. Shares count as their
fraction (0.25 of a GPU for an hour: 0.25). Each holding adds the exact
integral of that weight over the time it held its GPUs, so the figure does
not depend on how often it is computed.

Among waiters of equal priority, the one with less recent use goes first. To
keep a heavy user from waiting for ever behind lighter ones who keep coming,
a waiter that has waited ``max_wait`` goes by arrival from then on: nobody who
came after it is served before it (see :func:`gpuspawner.core.line_order.ordered`).

By group (``by_group``), a waiter's figure is that of the most-used of its
JupyterHub groups: the recent use of all the group's members together (a waiter
in no group: its own). Being also in a lighter group does not lift a heavy
group's member ahead (:func:`by_group`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["FairShare", "by_group", "decayed_gpu_hours"]

HORIZON_HALF_LIVES = 10  # older use weighs under 0.1 %: not read


@dataclass(frozen=True)
class FairShare:
    half_life: timedelta
    max_wait: timedelta
    by_group: bool = False  # a waiter's figure is its most-used group's (all members together)

    def __post_init__(self) -> None:
        if self.half_life <= timedelta(0):
            raise ValueError(f"the fair share's half-life must be positive, got {self.half_life}")
        if self.max_wait <= timedelta(0):
            raise ValueError(f"the fair share's longest wait must be positive, got {self.max_wait}")

    def horizon(self, now: datetime) -> datetime:
        """Use before this counts for (almost) nothing and is not read."""
        return now - HORIZON_HALF_LIVES * self.half_life

    def recent_use(self, spans: Iterable[tuple[datetime, datetime | None, float]], now: datetime) -> float:
        return decayed_gpu_hours(spans, now, self.half_life)

    def describe(self) -> str:
        whose = ", by group" if self.by_group else ""
        return f"half-life {_days(self.half_life)}{whose}, by arrival after {_hours(self.max_wait)} in line"


def decayed_gpu_hours(
    spans: Iterable[tuple[datetime, datetime | None, float]], now: datetime, half_life: timedelta
) -> float:
    """Σ GPUs × ∫ 2^(−(now − t) / half-life) dt over each (started, ended or
    None while held, GPUs) span, in hours. The part of a span after ``now`` counts
    nothing."""
    h = half_life.total_seconds() / 3600
    k = math.log(2) / h
    total = 0.0
    for started, ended, gpus in spans:
        end = now if ended is None or ended > now else ended
        if end <= started or gpus <= 0:
            continue
        a = (now - started).total_seconds() / 3600  # age of the span's start, hours
        b = (now - end).total_seconds() / 3600  # age of its end
        total += gpus * (math.exp(-k * b) - math.exp(-k * a)) / k
    return total


def by_group(
    waiters: Iterable[str],
    groups: Mapping[str, Iterable[str]],
    members: Mapping[str, Iterable[str]],
    use: Mapping[str, float],
) -> tuple[dict[str, float], dict[str, str]]:
    """Each waiter's figure when fair share goes by group, and the group it is of:
    of ``groups[waiter]``, the one whose ``members`` (group -> users) used most
    together (``use``: user -> recent use); a waiter in no group, its own (no group
    named). Ties between groups go to the name first in order."""
    waiters = list(waiters)
    users: dict[str, set[str]] = {}  # group -> its members, the waiters in it included
    for user in waiters:
        for g in groups.get(user, ()):
            users.setdefault(g, set(members.get(g, ()))).add(user)
    totals = {g: sum(use.get(m, 0.0) for m in us) for g, us in users.items()}
    figures: dict[str, float] = {}
    whose: dict[str, str] = {}
    for user in waiters:
        best: tuple[float, str] | None = None
        for g in sorted(set(groups.get(user, ()))):
            if best is None or totals[g] > best[0]:
                best = (totals[g], g)
        if best is None:
            figures[user] = use.get(user, 0.0)
        else:
            figures[user], whose[user] = best
    return figures, whose


def _days(d: timedelta) -> str:
    days = d.total_seconds() / 86400
    return f"{days:g} day" + ("" if days == 1 else "s")


def _hours(d: timedelta) -> str:
    hours = d.total_seconds() / 3600
    return f"{hours:g} h"
