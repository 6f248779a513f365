"""The one error type of the swarm harness, and the log tails its messages carry."""

from __future__ import annotations

import os
from pathlib import Path


class HarnessError(RuntimeError):
    """The test cluster could not be brought up (or torn down) as asked."""


def log_tail(path: Path, lines: int = 40) -> str:
    """The last lines of a dockerd log, for an error message."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(text.splitlines()[-lines:])
