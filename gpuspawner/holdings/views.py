"""Who holds a device, as the allocation map shows it, from the hub's holdings."""

from __future__ import annotations

from ..core.sharing import UNIT

__all__ = ["holders_of"]


def holders_of(holdings, uuid: str) -> list[dict]:
    """Who holds the device: each holder's user, server, share, the rule that
    placed it (None: whole GPUs, or adopted after a restart) and phase (and why
    a device being removed is still held). ``holdings``: a Holdings."""
    allocator = holdings.allocator
    out = []
    for name, milli in allocator.booked_on(uuid).items():
        h = holdings.get(name)
        alloc = allocator.holding(name)
        holder = {
            "user": h.held.user if h else getattr(alloc, "owner", ""),
            "server": h.held.server if h else "",
            "share": milli / UNIT,
            "rule": getattr(alloc, "rule", None),
            "phase": h.phase.value if h else "running",
        }
        if h is not None and h.problem:
            holder["problem"] = h.problem
        out.append(holder)
    return out
