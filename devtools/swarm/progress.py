"""Progress lines on stderr, timed from the start of the process."""

from __future__ import annotations

import sys
import time

_T0 = time.monotonic()


def progress(msg: str, tag: str = "swarm") -> None:
    print(f"[{tag} +{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)
