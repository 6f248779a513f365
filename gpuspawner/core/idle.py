"""When a holder's GPUs count as idle, and when a server is warned and then stopped.

Pure: readings and a clock in, decisions out (no JupyterHub, no Docker). Per holder
(one server's holding), from each report of the devices it holds:

* On a device it holds alone, its activity is the device's: busy when utilization is
  above the threshold, or when one of its processes uses more memory than the
  threshold allows (when the threshold sets a memory limit).
* On a shared device, only its own processes count: it is busy there when it has a
  process on the device and the device is busy, or when one of its own processes is
  over the memory limit. NVML gives utilization per device, not per process: two
  holders with processes on a busy shared device are both busy.

A holder idle for ``idle_timeout`` is warned ``idle_warning`` before its stop; a
reading that shows activity cancels the warning. A holding held for ``max_held`` is
warned ``max_held_warning`` before its stop; activity does not cancel that. A warning
always lasts at least its full period, also when it starts late (a setting changed,
a hub restart). Without fresh readings nothing is stopped for being idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["DeviceSample", "IdleTimers", "Limits", "Notice", "is_active"]

# The end reasons, as the ledger records them; BUDGET: the time a weekly budget allowed.
IDLE, MAX_HOURS, BUDGET = "idle", "max_hours", "budget"


@dataclass(frozen=True)
class Limits:
    """A holder's reclaim limits, in seconds; None: that limit is off."""

    idle_timeout: float | None = None
    idle_warning: float = 900.0
    idle_utilization: float = 5.0  # percent: at or below is idle
    idle_memory_mib: int | None = None  # a process using more is activity; None: memory does not count
    max_held: float | None = None
    max_held_warning: float = 900.0
    max_held_reason: str = MAX_HOURS  # or BUDGET, when the budget set max_held


@dataclass(frozen=True)
class DeviceSample:
    """One device a holder holds, as one report saw it."""

    utilization: int | None  # percent; None: the device did not say
    own: tuple[int | None, ...]  # memory (MiB) of each of the holder's processes on it
    shared: bool  # other holders hold shares of it too


@dataclass(frozen=True)
class Notice:
    """A warning shown to the user: their server stops at ``stop_at`` (clock time)."""

    reason: str  # IDLE, MAX_HOURS or BUDGET
    since: float
    stop_at: float


def is_active(sample: DeviceSample, limits: Limits) -> bool | None:
    """Whether the holder is busy on this device; None when the reading cannot tell."""
    cap = limits.idle_memory_mib
    if cap is not None and any(m is not None and m > cap for m in sample.own):
        return True
    if sample.utilization is None:
        return None
    busy = sample.utilization > limits.idle_utilization
    return busy and bool(sample.own) if sample.shared else busy


@dataclass
class _Timer:
    held_since: float
    idle_since: float | None = None
    last_active: float | None = None
    last_reading: float | None = None
    notices: dict[str, Notice] = field(default_factory=dict)


class IdleTimers:
    """Each holder's idle time and warnings. ``stale`` is how old the last reading
    may be for an idle holder to be stopped."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, stale: float = 60.0):
        self.clock = clock
        self.stale = stale
        self._timers: dict[str, _Timer] = {}

    def hold(self, holder: str, since: float | None = None) -> None:
        """Start timing a holder (again: no change) from ``since`` (default: now)."""
        if holder not in self._timers:
            self._timers[holder] = _Timer(self.clock() if since is None else since)

    def forget(self, holder: str) -> None:
        self._timers.pop(holder, None)

    def holders(self) -> list[str]:
        return sorted(self._timers)

    def observe(
        self, holder: str, samples: Iterable[DeviceSample], limits: Limits, now: float | None = None
    ) -> bool | None:
        """Take one report's readings of the holder's devices: whether it was busy
        on them (None: they cannot tell)."""
        now = self.clock() if now is None else now
        self.hold(holder, now)
        t = self._timers[holder]
        verdicts = [is_active(s, limits) for s in samples]
        if not verdicts or all(v is None for v in verdicts):
            return None  # nothing known: neither idle nor active
        t.last_reading = now
        if any(verdicts):
            t.idle_since = None
            t.last_active = now
            t.notices.pop(IDLE, None)  # activity in the warning cancels it
            return True
        if t.idle_since is None:
            t.idle_since = now
        return False

    def idle_for(self, holder: str, now: float | None = None) -> float | None:
        """Seconds the holder has been idle; None when it is not (or not known)."""
        t = self._timers.get(holder)
        if t is None or t.idle_since is None:
            return None
        return (self.clock() if now is None else now) - t.idle_since

    def read(self, holder: str) -> bool:
        """Whether any reading of the holder's devices has told idle from busy."""
        t = self._timers.get(holder)
        return t is not None and t.last_reading is not None

    def held_for(self, holder: str, now: float | None = None) -> float | None:
        """Seconds since the holder's timing began (its GPUs were first held); None: not timed."""
        t = self._timers.get(holder)
        return None if t is None else (self.clock() if now is None else now) - t.held_since

    def last_active(self, holder: str) -> float | None:
        t = self._timers.get(holder)
        return None if t is None else t.last_active

    def notices(self, holder: str) -> list[Notice]:
        t = self._timers.get(holder)
        return [] if t is None else sorted(t.notices.values(), key=lambda n: n.stop_at)

    def decide(self, holder: str, limits: Limits, now: float | None = None) -> str | None:
        """Warn where a limit comes near; the end reason when the holder's server
        must stop now (its warning has run out), else None."""
        now = self.clock() if now is None else now
        t = self._timers.get(holder)
        if t is None:
            return None
        for reason in (MAX_HOURS, BUDGET):
            if limits.max_held is None or reason != limits.max_held_reason:
                t.notices.pop(reason, None)
        if limits.max_held is not None:
            reason = limits.max_held_reason
            if self._warn(t, reason, t.held_since + limits.max_held, limits.max_held_warning, now):
                return reason
        fresh = t.last_reading is not None and now - t.last_reading <= self.stale
        if limits.idle_timeout is None or t.idle_since is None:
            t.notices.pop(IDLE, None)
        elif self._warn(t, IDLE, t.idle_since + limits.idle_timeout, limits.idle_warning, now) and fresh:
            return IDLE
        return None

    @staticmethod
    def _warn(t: _Timer, reason: str, deadline: float, warning: float, now: float) -> bool:
        """Warn once ``now`` is within ``warning`` of ``deadline``; True when the warning has run out."""
        notice = t.notices.get(reason)
        if notice is None:
            if now < deadline - warning:
                return False
            notice = t.notices[reason] = Notice(reason, now, max(deadline, now + warning))
        return now >= notice.stop_at
