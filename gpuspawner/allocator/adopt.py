"""What adopting a holding found in the cluster may book, and the problems
found on the way: a reason code for the program, a sentence for the logs
(pure; nothing is booked here)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..core.sharing import UNIT, fmt

__all__ = ["AdoptProblem", "AdoptReason"]


class AdoptReason(enum.Enum):
    NOT_IN_INVENTORY = "not_in_inventory"
    LISTED_TWICE = "listed_twice"
    ON_ANOTHER_HOST = "on_another_host"
    HELD_BY_ANOTHER = "held_by_another"  # held whole by another holder, asked whole here
    HELD_WHOLE_BY_ANOTHER = "held_whole_by_another"  # held whole by another holder, a share asked here
    SHARED_BY_OTHERS = "shared_by_others"  # others share it, asked whole here
    OVERBOOKED = "overbooked"  # the shares would sum above 1
    SHARES_MISMATCH = "shares_mismatch"  # not one share per device: booked whole
    UNREADABLE_SHARE = "unreadable_share"  # booked whole

    @property
    def double_booking(self) -> bool:
        """Two holders book the device beyond what it has."""
        return self in _DOUBLE_BOOKINGS


_DOUBLE_BOOKINGS = {
    AdoptReason.HELD_BY_ANOTHER,
    AdoptReason.HELD_WHOLE_BY_ANOTHER,
    AdoptReason.SHARED_BY_OTHERS,
    AdoptReason.OVERBOOKED,
}


@dataclass(frozen=True)
class AdoptProblem:
    reason: AdoptReason
    message: str

    def __str__(self) -> str:
        return self.message


def adopted_pieces(uuids: list[str], milli: Iterable[int] | None) -> tuple[list[int | None], list[AdoptProblem]]:
    """Each device's share in thousandths (None: whole, as every device is when
    all are 1000), and the problems found."""
    whole: list[int | None] = [None] * len(uuids)
    if milli is None:
        return whole, []
    shares = list(milli)
    if len(shares) != len(uuids):
        why = f"{len(shares)} shares for {len(uuids)} devices; booked whole"
        return whole, [AdoptProblem(AdoptReason.SHARES_MISMATCH, why)]
    if all(m == UNIT for m in shares):
        return whole, []
    pieces: list[int | None] = []
    problems = []
    for uuid, share in zip(uuids, shares):
        if type(share) is int and 0 < share <= UNIT:
            pieces.append(share)
        else:
            why = f"{uuid}: share {share!r} is not a share of one GPU in thousandths; booked whole"
            problems.append(AdoptProblem(AdoptReason.UNREADABLE_SHARE, why))
            pieces.append(None)
    return (whole if problems else pieces), problems


def conflict(
    uuid: str, holder: str, piece: int | None, whole: str | None, sharers: Mapping[str, int]
) -> AdoptProblem | None:
    """Why ``holder`` may not hold ``piece`` (None: whole) of the device, or None.
    ``whole``: who holds it whole; ``sharers``: who shares it (holder -> milli)."""
    if whole is not None and whole != holder:
        if piece is None:
            return AdoptProblem(AdoptReason.HELD_BY_ANOTHER, f"{uuid} is also held by {whole}")
        return AdoptProblem(AdoptReason.HELD_WHOLE_BY_ANOTHER, f"{uuid} is held whole by {whole}")
    others = {h: m for h, m in sharers.items() if h != holder}
    if not others:
        return None
    booked = ", ".join(f"{fmt(m)} by {h}" for h, m in sorted(others.items()))
    if piece is None:
        return AdoptProblem(AdoptReason.SHARED_BY_OTHERS, f"{uuid} is shared ({booked}); it cannot also be held whole")
    total = sum(others.values()) + piece
    if total > UNIT:
        why = f"{uuid} would be booked to {fmt(total)} of 1 ({booked}, {fmt(piece)} here)"
        return AdoptProblem(AdoptReason.OVERBOOKED, why)
    return None
