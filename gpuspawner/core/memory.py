"""A share's GPU memory: what each holder uses against what its share entitles it to,
and when one that stays above it is warned and stopped.

Pure: readings and a clock in, decisions out (no JupyterHub, no Docker). A holder's
entitlement on a device is its share of the device's memory (a whole GPU: all of it).
What it uses there is the memory of its own processes on that device (the agent traces
each process to the service that started it); a process nobody holds is nobody's, and
a neighbour's use never counts against a holder. A holder is *over* when, on some
device, it uses more than its entitlement plus ``tolerance`` of it.

Per model (``gpu_sharing[MODEL]["memory"]``): ``report`` shows the figures only; ``warn``
also tells the user at once; ``stop`` tells them, and stops the server once it has been
over for ``grace`` seconds, on a fresh reading that still says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .numbers import finite

__all__ = ["MEMORY", "ACTIONS", "DeviceMemory", "MemoryPolicy", "MemoryWatch", "over", "parse_policy"]

MEMORY = "memory"  # the end reason, as the ledger records it
ACTIONS = ("report", "warn", "stop")


@dataclass(frozen=True)
class MemoryPolicy:
    action: str = "report"  # one of ACTIONS
    tolerance: float = 0.05  # a fraction of the entitlement allowed above it
    grace: float = 300.0  # seconds over before a stop (under "stop")


@dataclass(frozen=True)
class DeviceMemory:
    """One device a holder holds, as one report saw it."""

    uuid: str
    used_mib: int | None  # its own processes' memory; None: NVML did not give one of them
    entitled_mib: int


KEYS = ("memory", "memory_tolerance", "memory_grace")  # in a gpu_sharing entry
MAX_GRACE = 7 * 24 * 3600.0


def parse_policy(entry: Mapping, where: str) -> MemoryPolicy:
    """The memory keys of a ``gpu_sharing`` entry; ValueError naming the bad one."""
    action = entry.get("memory", "report")
    if action not in ACTIONS:
        raise ValueError(f"{where}: memory must be one of {', '.join(map(repr, ACTIONS))}, got {action!r}")
    tolerance = finite(entry.get("memory_tolerance", MemoryPolicy.tolerance))
    if tolerance is None or not 0 <= tolerance <= 1:
        raise ValueError(f"{where}: memory_tolerance must be a fraction from 0 to 1 (0.05: 5 % above the share)")
    grace = finite(entry.get("memory_grace", MemoryPolicy.grace))
    if grace is None or not 0 <= grace <= MAX_GRACE:
        raise ValueError(f"{where}: memory_grace must be seconds from 0 to {MAX_GRACE:.0f} (7 days)")
    return MemoryPolicy(action, tolerance, grace)


def over(devices: Iterable[DeviceMemory], tolerance: float) -> list[DeviceMemory]:
    """The devices where the holder uses more than its entitlement allows (unknown use is not over)."""
    return [d for d in devices if d.used_mib is not None and d.used_mib > d.entitled_mib * (1 + tolerance)]


@dataclass
class _Watch:
    last_reading: float
    devices: tuple[DeviceMemory, ...] = ()
    over: tuple[DeviceMemory, ...] = ()
    over_since: float | None = None


class MemoryWatch:
    """Each holder's memory against its entitlement, from report to report. ``stale``:
    how old the last reading may be for a stop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, stale: float = 60.0):
        self.clock = clock
        self.stale = stale
        self._watches: dict[str, _Watch] = {}

    def observe(self, holder: str, devices: Iterable[DeviceMemory], policy: MemoryPolicy) -> None:
        """One report's readings of the holder's devices."""
        now, devices = self.clock(), tuple(devices)
        found = tuple(over(devices, policy.tolerance))
        w = self._watches.setdefault(holder, _Watch(now))
        w.last_reading, w.devices, w.over = now, devices, found
        if not found:
            w.over_since = None
        elif w.over_since is None:
            w.over_since = now

    def forget(self, holder: str) -> None:
        self._watches.pop(holder, None)

    def holders(self) -> list[str]:
        return sorted(self._watches)

    def reading(self, holder: str, uuid: str) -> DeviceMemory | None:
        """The holder's last reading of one device; None: none yet."""
        w = self._watches.get(holder)
        return next((d for d in w.devices if d.uuid == uuid), None) if w else None

    def over_devices(self, holder: str) -> tuple[DeviceMemory, ...]:
        """Where the holder was over at its last reading."""
        w = self._watches.get(holder)
        return () if w is None else w.over

    def stop_at(self, holder: str, policy: MemoryPolicy) -> float | None:
        """When the holder's server is stopped if it stays over (clock time); None: it is not over."""
        w = self._watches.get(holder)
        if w is None or w.over_since is None or policy.action != "stop":
            return None
        return w.over_since + policy.grace

    def due(self, holder: str, policy: MemoryPolicy) -> bool:
        """Whether the holder's server must stop now: over for the grace period, as a fresh reading says."""
        w = self._watches.get(holder)
        at = self.stop_at(holder, policy)
        now = self.clock()
        return w is not None and at is not None and now >= at and now - w.last_reading <= self.stale
