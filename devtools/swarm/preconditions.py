"""What must hold before a bring-up: this machine can run the cluster (Linux, root, the
programs), the worker hostnames are usable, and the socket paths fit in a sockaddr."""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Iterable, Sequence

from .errors import HarnessError
from .images import NO_BUSYBOX, find_busybox
from .layout import Layout
from .netns import MAX_WORKERS
from .procs import which

_REQUIRED_TOOLS = ("dockerd", "containerd", "runc", "ip", "nsenter", "unshare", "sh", "mount", "umount", "hostname")
# Don't let hostnames look like anything but a plain DNS label; they also end up in
# namespace and directory names.
_HOSTNAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
_SUN_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1


def unavailable_reason() -> str | None:
    """Why this machine can't run the cluster at all (None if it can)."""
    if sys.platform != "linux":
        return f"needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "needs root (network namespaces, bridges and dockerd)"
    missing = [t for t in _REQUIRED_TOOLS if which(t) is None]
    if missing:
        return f"missing programs: {', '.join(missing)} (apt-get install docker.io iproute2 util-linux)"
    if find_busybox() is None:
        return NO_BUSYBOX
    return None


def check_workers(workers: Sequence[str]) -> list[str]:
    workers = list(workers)
    if not workers:
        raise HarnessError("at least one worker is needed")
    if len(workers) > MAX_WORKERS:
        raise HarnessError(f"at most {MAX_WORKERS} workers")
    if len(set(workers)) != len(workers):
        raise HarnessError(f"duplicate worker hostnames: {workers}")
    for h in workers:
        if not _HOSTNAME_RE.match(h) or h == "manager":
            raise HarnessError(f"bad worker hostname {h!r} (lowercase letters, digits, '-'; not 'manager')")
    if socket.gethostname() in workers:
        raise HarnessError(f"worker hostname {socket.gethostname()!r} is this machine's (the manager's) hostname")
    return workers


def check_paths(lay: Layout, names: Iterable[str]) -> None:
    for name in names:
        # containerd's socket is the deepest unix socket dockerd creates under exec-root.
        longest = lay.exec_root(name) / "containerd" / "containerd-debug.sock"
        for p in (lay.sock(name), longest):
            if len(str(p)) > _SUN_PATH_MAX:
                raise HarnessError(f"socket path too long for a unix socket: {p}")
