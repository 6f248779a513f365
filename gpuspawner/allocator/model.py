"""One GPU model's part of the allocator's index (pure): its free devices by
host, hosts bucketed by free count, the room left on its partly booked
devices, and the split ranks (hosts by their k-th largest room). The index
(``allocator_index.DeviceIndex``) keeps them up to date; decisions read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.inventory import GPU
from ..core.sharing import UNIT
from .rooms import Rooms

__all__ = ["ModelIndex", "kth", "total_room"]


def total_room(ranked: tuple[int, tuple[int, ...]]) -> int:
    """A host's room in all, from its entry in ``ModelIndex.ranked``."""
    return ranked[0] * UNIT + sum(ranked[1])


def kth(ranked: tuple[int, tuple[int, ...]], k: int) -> int:
    """The k-th largest room (k from 0) of a host, from its entry in ``ModelIndex.ranked``."""
    free, rooms = ranked
    return UNIT if k < free else rooms[k - free] if k - free < len(rooms) else 0


@dataclass
class ModelIndex:
    """Per model: each host's free devices, hosts bucketed by free count (only
    available hosts), and the counts a summary needs, all kept up to date."""

    free: dict[str, list[GPU]] = field(default_factory=dict)  # host -> free, by index
    total: dict[str, int] = field(default_factory=dict)  # host -> devices
    buckets: list[list[str]] = field(default_factory=lambda: [[]])  # n -> sorted hosts
    block_hint: int = field(default=0, compare=False)  # no bucket above it has hosts (see largest_block)
    memory_mib: int = 0
    devices: int = 0
    smallest_host: int = 0  # fewest devices of this model on one host
    free_available: int = 0  # free devices on available hosts
    unavailable: int = 0  # devices on unavailable hosts
    # Devices holding shares ("partial"): what is booked on each, by host, and
    # those with room left on available hosts by room, then (host, index, uuid).
    used: dict[str, int] = field(default_factory=dict)  # uuid -> milli booked
    partial: dict[str, list[GPU]] = field(default_factory=dict)  # host -> by index
    partial_room: dict[str, int] = field(default_factory=dict)  # host -> room left on its partial devices
    rooms: Rooms = field(default_factory=Rooms)  # keys (host, index, uuid)
    # For splits, hosts by their k-th largest room (k from 1, as a split takes
    # 2 or more devices): ranks[k] holds hosts by room, for available
    # hosts whose k-th largest device room is partly booked (0 < room < 1000;
    # a host whose k-th is untouched is in the free buckets). ranked: each
    # such host's (free devices, rooms of its partly booked devices, largest
    # first), from which its entries in ranks follow.
    ranks: dict[int, Rooms] = field(default_factory=dict)  # keys: hostnames
    ranked: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    # (room in all, host) of the ranked hosts, sorted; kept only while some model splits unevenly
    totals: list[tuple[int, str]] = field(default_factory=list)
    # On at most allocator_index.SCAN_HOSTS hosts: ranks and totals are not kept (empty; ranked is);
    # DeviceIndex.totals() makes them when asked.
    scan: bool = True
    # For updates one host at a time: how many hosts have n devices of this
    # model (n -> hosts), and how many devices have each memory size.
    sizes: dict[int, int] = field(default_factory=dict)
    memories: dict[int, int] = field(default_factory=dict)

    @property
    def biggest_host(self) -> int:  # most devices of this model on one host
        return len(self.buckets) - 1

    def largest_block(self) -> int:
        """Most untouched devices on one available host."""
        buckets = self.buckets
        n = min(self.block_hint, len(buckets) - 1)
        while n and not buckets[n]:
            n -= 1
        self.block_hint = n
        return n

    def entered_bucket(self, n: int) -> None:
        """A host just entered ``buckets[n]`` (keeps ``block_hint`` an upper bound)."""
        if n > self.block_hint:
            self.block_hint = n

    def kth_room(self, host: str, k: int) -> int:
        """The k-th largest room (k from 0) of a host in ``ranked``."""
        return kth(self.ranked[host], k)

    def most_kth_room(self, k: int, block: int) -> int:
        """The largest k-th largest room (k ≥ 1) of any available host;
        ``block``: :meth:`largest_block`. Below a split's smallest piece, no
        host takes k + 1 pieces."""
        if block > k:
            return UNIT
        entries = self.ranks.get(k)
        return entries.largest() if entries is not None else 0  # ranks[k] exists only while it has entries

    def largest_room(self) -> int:  # most milli-shares free on one device of an available host
        if self.free_available:
            return UNIT
        return self.rooms.largest()
