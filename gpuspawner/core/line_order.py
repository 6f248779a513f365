"""The line per GPU model: who waits, in which order, and who may be served.

Pure rules (the standard library only); the line's rows live in the ledger
(:mod:`gpuspawner.ledger.line`) and the waiting spawns in
:mod:`gpuspawner.line.wait`.

Order: higher priority first, then first come, first served (the row's id,
given by the database in arrival order, breaks ties of equal ``since``). With
fair share (:mod:`gpuspawner.core.fairshare`, a :class:`Standing`), among equal
priority: first those who have waited ``max_wait`` or more, by arrival; then the
others, least recent use first, then by arrival.

Only the first waiter of a model is ever served, and while anyone waits for a
model a new request for it is not granted: it goes to the back of the line
(with fair share, where its recent use puts it; or is refused, without ``gpu_wait``). So a large request is never starved by
smaller ones that would fit in what is free now: the devices that free up
stay free until the first waiter's request fits.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from .fairshare import FairShare

__all__ = [
    "Standing",
    "Waiter",
    "by_model",
    "estimate",
    "fmt_duration",
    "held_now",
    "order_reason",
    "ordered",
    "position",
]


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


@dataclass(frozen=True)
class Standing:
    """A fair-share line's order at one moment: each user's recent use (decayed
    GPU-hours; a user not in ``used``: none) and the time waits are measured at."""

    fair: FairShare
    used: Mapping[str, float]
    now: datetime
    whose: Mapping[str, str] = field(default_factory=dict)  # by group: user -> the group its figure is of

    def by_arrival(self, w: Waiter) -> bool:
        """``w`` has waited long enough to go by arrival (the starvation bound)."""
        return self.now - w.since >= self.fair.max_wait

    def key(self, w: Waiter) -> tuple:
        if self.by_arrival(w):
            return (-w.priority, 0, 0.0, w.since, w.id)
        # Rounded: a few seconds of decay between two reads never reorders equals.
        return (-w.priority, 1, round(self.used.get(w.user, 0.0), 3), w.since, w.id)


def ordered(waiters: Iterable[Waiter], standing: Standing | None = None) -> list[Waiter]:
    """``waiters`` in the order they are served."""
    return sorted(waiters, key=lambda w: w.key if standing is None else standing.key(w))


def order_reason(w: Waiter, standing: Standing | None) -> str:
    """Why ``w`` stands where it does, for the queue API and the waiting page."""
    parts = [f"priority {w.priority}"] if w.priority else []
    if standing is None:
        parts.append("first come, first served")
    elif standing.by_arrival(w):
        parts.append(f"in line for {fmt_duration((standing.now - w.since).total_seconds())}: by arrival")
    else:
        group = standing.whose.get(w.user)
        of = f" of group {group}" if group else ""
        parts.append(f"recent use{of} {standing.used.get(w.user, 0.0):.1f} GPU-hours")
    return ", ".join(parts)


def by_model(waiters: Iterable[Waiter], standing: Standing | None = None) -> dict[str, list[Waiter]]:
    """Each model's line, in order."""
    lines: dict[str, list[Waiter]] = {}
    for w in ordered(waiters, standing):
        lines.setdefault(w.model, []).append(w)
    return lines


def position(waiters: Iterable[Waiter], service: str, standing: Standing | None = None) -> tuple[str, int] | None:
    """(model, 1-based place in that model's line) of ``service``, or None."""
    for model, line in by_model(waiters, standing).items():
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


def kept_text(host: str | None, needs: int, free: int, start: str, kept_out: bool) -> str:
    """What a waiter is told of what it waits for, from its line's last plan: the host
    kept for it (``host``) and how much of what it asked for is free there now (``free``
    of ``needs`` devices; ``needs`` 0: a share, with ``free`` devices with room for it),
    and when it starts there (``start``: "about 14:20 UTC, when a server there reaches its
    time limit"; "": nobody can say, as a server there has no time limit); or, without a
    host, that every host that could take it is kept for requests ahead (``kept_out``)."""
    if host is None:
        return "Every host that could take your request is kept for a request ahead of yours" if kept_out else ""
    if needs:
        have = f"{free} of the {needs} GPU{'s' if needs != 1 else ''} you asked for {'is' if free == 1 else 'are'} free now"
    else:
        have = "a device there has room for your share now" if free else "no device there has room for your share yet"
    when = f"planned start {start}" if start else "no estimate of when: a server there has no time limit"
    return f"Kept for you: {host}, where {have}; {when}"
