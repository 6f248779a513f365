"""Per model, what the spawn form and the refusals say of the inventory:
free and total counts, the largest block on one host, and which shares are
offered (pure)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.sharing import UNIT, SharingPolicy
from .model import ModelIndex

__all__ = ["ModelSummary", "fitting", "summarize"]


@dataclass(frozen=True)
class ModelSummary:
    model: str
    memory_mib: int
    total: int  # devices in the inventory
    free: int  # untouched (neither held nor shared) on available hosts
    largest_block: int  # most untouched on any single available host
    unavailable: int  # devices on hosts that are down, drained or paused
    # Sharing, for the form: whether users may ask for a share of this model,
    # which shares, and the most one device has free right now (thousandths).
    shareable: bool = False
    quantum: int | None = None  # shares are multiples of this
    shares: tuple[int, ...] | None = None  # the only shares offered; None: any multiple of quantum
    split: bool = False  # may a share span several devices of one host
    split_small: bool = False  # may a share of at most one GPU span devices too
    largest_milli: int = 0  # most room on one device of an available host (1000: one is untouched)
    # Untouched devices left out of ``free`` because their host lacks the CPU or memory asked for.
    no_room: int = 0

    @property
    def largest_share(self) -> float:
        """``largest_milli`` in GPUs, for templates."""
        return self.largest_milli / UNIT


def fitting(summary: ModelSummary, mi: ModelIndex, hosts: set[str]) -> ModelSummary:
    """``summary`` counting only the available ``hosts`` (those with the CPU and memory
    asked for): what a server that reserves them can have."""
    blocks = [len(mi.free[h]) for h in hosts if h in mi.free]
    rooms = [UNIT - mi.used[g.uuid] for h in hosts for g in mi.partial.get(h, ()) if mi.used[g.uuid] < UNIT]
    free = sum(blocks)
    return replace(
        summary,
        free=free,
        largest_block=max(blocks, default=0),
        largest_milli=UNIT if free else max(rooms, default=0) if summary.shareable else 0,
        no_room=summary.free - free,
    )


def summarize(model: str, mi: ModelIndex, policy: SharingPolicy) -> ModelSummary:
    sharing = policy.for_model(model)
    largest_block = mi.largest_block()
    if sharing is None:
        return ModelSummary(model, mi.memory_mib, mi.devices, mi.free_available, largest_block, mi.unavailable)
    return ModelSummary(
        model=model,
        memory_mib=mi.memory_mib,
        total=mi.devices,
        free=mi.free_available,
        largest_block=largest_block,
        unavailable=mi.unavailable,
        shareable=True,
        quantum=sharing.quantum,
        shares=sharing.allowed,
        split=sharing.split,
        split_small=sharing.split_small,
        largest_milli=mi.largest_room(),
    )
