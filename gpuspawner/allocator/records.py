"""What comes out of the allocator (allocations, the rule that placed a share)
and the policies that pick a host (pure). Requests are gpuspawner.core.requests'."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction

from ..core.inventory import GPU
from ..core.requests import ALL, Request
from ..core.sharing import UNIT, fraction

__all__ = ["ALL", "EVEN_SPLIT", "ONE_DEVICE", "POLICIES", "UNEVEN_SPLIT", "Allocation", "Policy", "Request"]

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
    # The share of each device in thousandths, aligned with ``devices``;
    # None when every device is held whole (also a share that came out as
    # whole devices, e.g. 2 split as 1 + 1).
    milli: tuple[int, ...] | None = None
    # Which rule placed a share (ONE_DEVICE, EVEN_SPLIT, UNEVEN_SPLIT); None
    # for whole GPUs and for holdings adopted from the cluster.
    rule: str | None = None

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)

    @property
    def model(self) -> str:
        return ", ".join(sorted({d.model for d in self.devices}))

    @property
    def shared(self) -> bool:
        return self.milli is not None

    @property
    def shares(self) -> tuple[Fraction, ...]:
        """Per device, aligned with ``devices``: 1 when held whole."""
        if self.milli is None:
            return (Fraction(1),) * len(self.devices)
        return tuple(fraction(m) for m in self.milli)

    @property
    def total_milli(self) -> int:
        """Milli-shares held in all (1000 per device held whole)."""
        return len(self.devices) * UNIT if self.milli is None else sum(self.milli)

    def booking(self) -> dict[GPU, int]:
        """Device -> milli-shares held (1000: whole), whatever the order."""
        return dict(zip(self.devices, self.milli or (UNIT,) * len(self.devices)))


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
}
