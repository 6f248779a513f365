"""The line per GPU model: who waits, in which order, and who may be served.

Pure rules (the standard library only); the line's rows live in the ledger
(:mod:`gpuspawner.ledger.line`) and the waiting spawns in
:mod:`gpuspawner.line.wait`.

Order: higher priority first, then first come, first served (the row's id,
given by the database in arrival order, breaks ties of equal ``since``).

Only the first waiter of a model is ever served, and while anyone waits for a
model a new request for it is not granted: it goes to the back of the line
(or is refused, without ``gpu_wait``). So a large request is never starved by
smaller ones that would fit in what is free now: the devices that free up
stay free until the first waiter's request fits.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["Waiter", "by_model", "estimate", "fmt_duration", "held_now", "ordered", "position"]


@dataclass(frozen=True)
class Waiter:
    """One request in a model's line."""

    id: int  # arrival order (the database's row id)
    service: str  # the server's service name: one place in line per server
    user: str
    server: str
    model: str
    priority: int
    since: datetime
    request: dict = field(default_factory=dict, compare=False)  # the user_options it waits with

    @property
    def key(self) -> tuple:
        return (-self.priority, self.since, self.id)


def ordered(waiters: Iterable[Waiter]) -> list[Waiter]:
    """``waiters`` in the order they are served."""
    return sorted(waiters, key=lambda w: w.key)


def by_model(waiters: Iterable[Waiter]) -> dict[str, list[Waiter]]:
    """Each model's line, in order."""
    lines: dict[str, list[Waiter]] = {}
    for w in ordered(waiters):
        lines.setdefault(w.model, []).append(w)
    return lines


def position(waiters: Iterable[Waiter], service: str) -> tuple[str, int] | None:
    """(model, 1-based place in that model's line) of ``service``, or None."""
    for model, line in by_model(waiters).items():
        for i, w in enumerate(line, 1):
            if w.service == service:
                return model, i
    return None


def fmt_duration(seconds: float) -> str:
    """A rough duration for people: "40 min", "2.5 h"."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def estimate(run_seconds: Sequence[float], place: int, devices: int) -> str:
    """What the line's page says about the wait, from how long that model's
    servers ran (``run_seconds``: past servers' durations; ``devices``: how
    many of the model there are). Labelled an estimate; empty without history."""
    if not run_seconds or place < 1:
        return ""
    median = statistics.median(run_seconds)
    # Those ahead are served as servers end; with n devices, about n end per median run.
    rounds = max(1, -(-place // max(1, devices)))
    return f"Estimate: about {fmt_duration(median * rounds)} (servers of this model run {fmt_duration(median)} at the median)"


def held_now(held_seconds: Sequence[float]) -> str:
    """What is known before any server of a model has ended (no estimate yet): how
    many servers hold it now and for how long (``held_seconds``: each one's time)."""
    if not held_seconds:
        return ""
    longest, newest = max(held_seconds), min(held_seconds)
    if len(held_seconds) == 1:
        return f"No server of this model has ended yet; 1 holds it now, for {fmt_duration(longest)}"
    return (
        f"No server of this model has ended yet; {len(held_seconds)} hold it now, "
        f"the longest for {fmt_duration(longest)}, the newest for {fmt_duration(newest)}"
    )
