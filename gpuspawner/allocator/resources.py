"""Each host's CPU and memory, as the allocator counts them (pure).

A host's free CPU and memory are what it has, less what the services running
there reserve (as the swarm last said; those the allocator holds are left out),
less what the allocator's own holdings reserve (so a holding is counted once,
whether or not its task is running yet). A host
whose CPU and memory were never given is not limited by them (the allocator
then chooses by GPUs alone, as before). CPU is in thousandths of a core (the
swarm's NanoCPUs / 10^6), memory in MiB.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..core.sharing import fmt
from .records import Allocation

__all__ = ["HostResources", "Room", "checked_amount"]

#: A host's CPU and memory free now (None: not known) and what each holder there reserves.
Room = tuple["tuple[int, int] | None", dict[str, tuple[int, int]]]


def checked_amount(value: object, what: str) -> int:
    """A whole number ≥ 0 of ``what``, or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a whole number ≥ 0, got {value!r}")
    return value


class HostResources:
    def __init__(self, held: Mapping[str, Allocation]):
        self._held = held  # the allocator's holdings, by holder (= service) name
        self._has: dict[str, tuple[int, int]] = {}  # host -> (cpu milli, memory MiB)
        self._running: dict[str, dict[str, tuple[int, int]]] = {}  # host -> service -> what it reserves there
        self._ours: dict[str, tuple[int, int]] = {}  # host -> reserved by the allocator's holdings
        self._holding: dict[str, dict[str, tuple[int, int]]] = {}  # host -> holder -> what it reserves there
        self._sorted: list[str] | None = None  # known(), kept until a host comes or goes
        # free(), kept per host until something on it changes: placement asks it of
        # hundreds of hosts per decision
        self._free: dict[str, tuple[int, int]] = {}

    def set_host(self, host: str, cpu_milli: int | None, memory_mib: int | None) -> None:
        """What ``host`` has (None: not known; the host is then not limited)."""
        self._free.pop(host, None)
        if cpu_milli is None or memory_mib is None:
            if self._has.pop(host, None) is not None:
                self._sorted = None
            return
        has = (checked_amount(cpu_milli, "cpu_milli"), checked_amount(memory_mib, "memory_mib"))
        if host not in self._has:
            self._sorted = None
        self._has[host] = has

    def set_running(self, host: str, by_service: Mapping[str, tuple[int, int]]) -> None:
        """What the services running on ``host`` reserve there: service name ->
        (cpu milli, memory MiB). Replaces what was said before."""
        self._free.pop(host, None)
        self._running[host] = {
            name: (checked_amount(cpu, "cpu_milli"), checked_amount(mem, "memory_mib"))
            for name, (cpu, mem) in by_service.items()
        }

    def forget(self, service: str) -> None:
        """``service`` runs no more (its holding is given back only once its tasks
        have ended): what it reserved is not counted until the swarm says otherwise."""
        for host, running in self._running.items():
            if running.pop(service, None) is not None:
                self._free.pop(host, None)

    def _others(self, host: str) -> tuple[int, int]:
        running = self._running.get(host)
        if not running:
            return 0, 0
        cpu = mem = 0
        for name, (c, m) in running.items():
            held = self._held.get(name)
            if held is None or held.host != host:  # not booked here (e.g. a server the swarm placed)
                cpu, mem = cpu + c, mem + m
        return cpu, mem

    def known(self) -> list[str]:
        """The hosts whose CPU and memory are known, by name."""
        if self._sorted is None:
            self._sorted = sorted(self._has)
        return self._sorted

    def book(self, host: str, holder: str, cpu_milli: int, memory_mib: int, sign: int = 1) -> None:
        """``holder``'s holding on ``host`` comes (sign 1) or goes (-1), after the allocator's
        holdings changed: what services running there count changes with them."""
        self._free.pop(host, None)
        if cpu_milli or memory_mib:
            cpu, mem = self._ours.get(host, (0, 0))
            self._ours[host] = (cpu + sign * cpu_milli, mem + sign * memory_mib)
            holding = self._holding.setdefault(host, {})
            if sign > 0:
                holding[holder] = (cpu_milli, memory_mib)
            else:
                holding.pop(holder, None)

    def held_by(self, host: str) -> dict[str, tuple[int, int]]:
        """What each of the allocator's holders on ``host`` reserves there (cpu milli,
        memory MiB), those that reserve something: what frees up as they end."""
        return dict(self._holding.get(host, {}))

    def free(self, host: str) -> tuple[int, int] | None:
        """(cpu milli, memory MiB) free on ``host``; None when not known."""
        found = self._free.get(host)
        if found is None:
            has = self._has.get(host)
            if has is None:
                return None
            others, ours = self._others(host), self._ours.get(host, (0, 0))
            found = self._free[host] = (has[0] - others[0] - ours[0], has[1] - others[1] - ours[1])
        return found

    def capacity(self, host: str) -> tuple[int, int] | None:
        """(cpu milli, memory MiB) ``host`` has in all; None when not known."""
        return self._has.get(host)

    def fits(self, host: str, cpu_milli: int, memory_mib: int) -> bool:
        free = self.free(host)
        return free is None or (cpu_milli <= free[0] and memory_mib <= free[1])

    def short(self, host: str, cpu_milli: int, memory_mib: int) -> str:
        """What ``host`` lacks for the request, for a sentence ("" when it fits)."""
        free = self.free(host)
        if free is None:
            return ""
        lacks = []
        if cpu_milli > free[0]:
            lacks.append(f"{fmt(max(0, free[0]))} CPUs")
        if memory_mib > free[1]:
            lacks.append(f"{max(0, free[1]) / 1024:.1f} GiB of memory")
        return " and ".join(lacks)
