"""What comes out of the allocator (allocations, the rule that placed a share)
and the policies that pick a host (pure). Requests are gpuspawner.core.requests'."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..core.inventory import GPU
from ..core.requests import ALL, Request
from ..core.sharing import UNIT

__all__ = [
    "ALL",
    "EVEN_SPLIT",
    "ONE_DEVICE",
    "POLICIES",
    "UNEVEN_SPLIT",
    "Allocation",
    "Policy",
    "Request",
    "accepted",
]

#: ``Allocation.rule``: which rule placed a share (see docs/sharing.md).
ONE_DEVICE = "one device"
EVEN_SPLIT = "even split"
UNEVEN_SPLIT = "uneven split"


@dataclass(frozen=True)
class Allocation:
    holder: str
    owner: str
    host: str
    devices: tuple[GPU, ...]
    # Each device's share in thousandths, aligned with ``devices``: 1000 held
    # whole. Left out, every device is held whole.
    milli: tuple[int, ...] = ()
    # Which rule placed a share (ONE_DEVICE, EVEN_SPLIT, UNEVEN_SPLIT); None
    # for whole GPUs and for holdings adopted from the cluster.
    rule: str | None = None
    # The CPU (thousandths) and memory (MiB) it reserves on its host, as asked.
    cpu_milli: int = 0
    memory_mib: int = 0
    # The models the request accepted, sorted (() any model; None: not known, as for a
    # holding adopted from the cluster): what the hub learns its mix from, not part of
    # the booking (two allocations of the same devices are equal whatever it says).
    accepts: tuple[str, ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if len(self.milli) != len(self.devices):
            if self.milli:
                raise ValueError(f"{len(self.milli)} shares for {len(self.devices)} devices")
            object.__setattr__(self, "milli", (UNIT,) * len(self.devices))

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)

    @property
    def model(self) -> str:
        return ", ".join(sorted({d.model for d in self.devices}))

    @property
    def shared(self) -> bool:
        """Some device is held in part: every device is booked as a share (a
        share that came out as whole devices, 2 as 1 + 1, is not shared)."""
        return min(self.milli, default=UNIT) < UNIT

    @property
    def total_milli(self) -> int:
        """Thousandths held in all (1000 per device held whole)."""
        return sum(self.milli)

    def booking(self) -> dict[GPU, int]:
        """Device -> thousandths held (1000: whole), whatever the order."""
        return dict(zip(self.devices, self.milli))


def accepted(request: Request) -> tuple[str, ...]:
    """The models ``request`` accepts, sorted: its ``models``, else its ``model``; () any."""
    if request.models is not None:
        return tuple(sorted(set(request.models)))
    return () if request.model is None else (request.model,)


@dataclass(frozen=True)
class Policy:
    """How to pick a host: the order in which to try 'hosts with n free'
    buckets, and the key that ranks candidates of different models."""

    name: str
    sizes: Callable[[int, int], Iterable[int]]  # (count, largest bucket) -> bucket sizes to try
    rank: Callable[[int], int]  # free count -> sort key (lower wins)


POLICIES: dict[str, Policy] = {
    # The host with the least free room that still fits: keeps whole hosts free
    # for large requests.
    "pack": Policy("pack", lambda count, top: range(count, top + 1), lambda n: n),
    # The host with the most free room: spreads load (and heat) across hosts.
    "spread": Policy("spread", lambda count, top: range(top, count - 1, -1), lambda n: -n),
    # Where the free GPU that the hub's requests could not use grows least
    # (allocator.fragment); pack's order for what it does not score, and without a mix.
    "frag": Policy("frag", lambda count, top: range(count, top + 1), lambda n: n),
}
