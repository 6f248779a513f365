"""gpuspawner-agent's program name and its one-sentence failures, shared by its modules."""

from __future__ import annotations

PROG = "gpuspawner-agent"


class AgentError(Exception):
    """A node-level failure; str() is the one sentence shown to the operator."""


def plain(e: Exception) -> str:
    """The sentence without the program's name, for log lines that carry it already."""
    return str(e).removeprefix(f"{PROG}: ")
