"""Ports for servers on host networking: one per server of the hub, handed out
in turn through the admin's range (pure)."""

from __future__ import annotations

import random

__all__ = ["PortPool"]


class NoPortFree(Exception):
    """Every port of the range is held by a server of this hub."""


class PortPool:
    """The ports the hub's servers hold, by service name."""

    def __init__(self) -> None:
        self.held: dict[str, int] = {}
        self._next: int | None = None

    def pick(self, name: str, first: int, last: int) -> int | None:
        """A port no other server of this hub uses (the one ``name`` holds, if
        any), or None when all are taken. Ports are handed out in turn through
        the range, so a port freed by a stopped server (whose process may still
        be exiting) is not reused at once."""
        if name in self.held:
            return self.held[name]
        taken = set(self.held.values())
        size = last - first + 1
        if self._next is None or not first <= self._next <= last:
            # A restarted hub starts somewhere else in the range than the last
            # one did, away from ports its stopped servers may still hold.
            self._next = random.randint(first, last)
        start = self._next
        for i in range(size):
            port = first + (start - first + i) % size
            if port not in taken:
                self.held[name] = port
                self._next = port + 1 if port < last else first
                return port
        return None

    def hold(self, name: str, port: int) -> None:
        """A server found running holds this port (its labels say so)."""
        self.held[name] = port

    def release(self, name: str) -> None:
        self.held.pop(name, None)
