"""One serving of a line, in order: who may be booked now, and where nobody may.

The line is served first to last. A waiter that is not served now (nothing it
fits is free) gets a *planned host*: the host where it would fit first as
servers end (:meth:`~gpuspawner.allocator.allocator.Allocator.nearest_host`).
That host is kept for it: nobody behind it in line, and no new request, is
placed there until it is served. Anyone behind it may be served at once on the
other hosts (backfill): what they take is on hosts no earlier waiter's plan
needs, so none of their planned starts moves later. Every earlier waiter keeps
its host, not only the first (conservative backfill): a second large request is
not starved by small ones either. A waiter whose every possible host is kept for
those ahead waits behind them and keeps nothing more.

Without backfill (``strict``) the first waiter that is not served stops the
serving: nobody behind it is tried, and a new request waits behind the line.

Each round is planned afresh from the bookings as they are then, so a plan
follows the cluster: a host that frees up sooner than the one kept becomes the
plan the next time the line is served.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from ..core.requests import Request

__all__ = ["Round"]

Nearest = Callable[[Request, frozenset[str]], "str | None"]  # (request, hosts kept) -> its planned host


class Round:
    """The hosts kept so far in one serving of a line, each for the waiter it is planned for."""

    def __init__(self, nearest: Nearest, backfill: bool = True):
        self.nearest = nearest
        self.backfill = backfill
        self.kept: dict[str, Hashable] = {}  # host -> the waiter it is kept for
        self.planned: dict[Hashable, str | None] = {}  # waiter -> its planned host (None: behind others)
        self.blocked = False  # strict, and someone was not served: nobody more is

    def avoid(self) -> frozenset[str] | None:
        """The hosts the next waiter (or a new request) may not be placed on; None:
        it may not be served at all (strict, or someone ahead keeps the whole line)."""
        return None if self.blocked else frozenset(self.kept)

    def wait(self, who: Hashable, request: Request | None) -> str | None:
        """``who`` (its ``request``) is not served now: keep its planned host for it.
        Without backfill, or without a request to plan (a row a restarted hub has
        not resumed yet), nobody behind it is served."""
        if not self.backfill or request is None:
            self.blocked = True
            self.planned[who] = None
            return None
        host = self.nearest(request, frozenset(self.kept))
        self.planned[who] = host
        if host is not None:
            self.kept[host] = who
        return host
