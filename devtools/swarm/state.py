"""What persists between processes: the state file (the cluster that runs, and a
fingerprint of how its daemons were started) and the machine-wide locks.

``/run/lock/gpuspawner-swarm.lock`` serializes ``up``/``down`` between processes.
``/run/lock/gpuspawner-swarm.users.lock`` is held shared by every process that uses the
cluster, and exclusively by what would pull it from under them (tearing it down,
crashing and rebuilding it in a test). The kernel drops a lock when its process dies,
so a killed session leaves nothing stale behind."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from .cluster import Cluster, daemon_name
from .daemons import DOCKERD_ENV, NS_SCRIPT, RESOLV_CONF, dockerd_args
from .errors import HarnessError
from .layout import Layout
from .netns import BRIDGE_PREFIXLEN, GW_BRIDGE, GW_BRIDGE_SUBNET
from .progress import progress

# One lock for the machine, not per state dir: the bridge, the namespaces and the
# addresses are machine-wide.
LOCK_FILE = Path("/run/lock/gpuspawner-swarm.lock" if os.path.isdir("/run/lock") else "/tmp/gpuspawner-swarm.lock")
LOCK_TIMEOUT = 300.0
USERS_LOCK_FILE = LOCK_FILE.with_name("gpuspawner-swarm.users.lock")

# flock() locks belong to an open file: this process must use one, or it would wait for itself.
_users_file: io.TextIOWrapper | None = None
_users_mode = fcntl.LOCK_UN


@contextlib.contextmanager
def lock(timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """Serialize up/down between processes (e.g. two test sessions at once)."""
    with open(LOCK_FILE, "a") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise HarnessError(f"another process holds {LOCK_FILE} for more than {timeout:.0f}s") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def users_mode() -> int:
    """How this process holds the users lock: LOCK_UN, LOCK_SH or LOCK_EX."""
    return _users_mode


def users_lock(mode: int, timeout: float, what: str) -> None:
    """Take USERS_LOCK_FILE in ``mode`` (LOCK_SH or LOCK_EX), waiting at most ``timeout`` s.

    Converting a held lock is not atomic: while it waits, this process holds no lock."""
    global _users_file, _users_mode
    if _users_mode == mode:
        return
    if _users_file is None:
        _users_file = open(USERS_LOCK_FILE, "a")  # noqa: SIM115 - kept open for the process's life
    deadline = time.monotonic() + timeout
    said = False
    while True:
        try:
            fcntl.flock(_users_file, mode | fcntl.LOCK_NB)
            _users_mode = mode
            return
        except BlockingIOError:
            _users_mode = fcntl.LOCK_UN  # a failed conversion has dropped the old lock
            if time.monotonic() >= deadline:
                raise HarnessError(
                    f"{what}: other processes kept using the test swarm (lock {USERS_LOCK_FILE}) for "
                    f"more than {timeout:.0f}s"
                ) from None
            if not said:
                progress(f"{what}: waiting for other test sessions to finish with the swarm")
                said = True
            time.sleep(0.5)


def users_unlock() -> None:
    global _users_mode
    if _users_file is not None:
        fcntl.flock(_users_file, fcntl.LOCK_UN)
    _users_mode = fcntl.LOCK_UN


def load_state(lay: Layout) -> Cluster | None:
    """The cluster recorded in the state file (running or not), or None."""
    try:
        return Cluster.from_json(json.loads(lay.state_file.read_text())["cluster"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fingerprint(lay: Layout, cluster: Cluster) -> str:
    """Hash of how the daemons are started: a change in the harness means a fresh cluster."""
    config = {
        "args": {h: dockerd_args(lay, daemon_name(n), n.role == "manager") for h, n in cluster.nodes.items()},
        "env": DOCKERD_ENV,
        "namespaces": [NS_SCRIPT, RESOLV_CONF],
        "gw": [GW_BRIDGE, GW_BRIDGE_SUBNET, BRIDGE_PREFIXLEN],
    }
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def saved_fingerprint(lay: Layout) -> str | None:
    try:
        return json.loads(lay.state_file.read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def save_state(lay: Layout, cluster: Cluster) -> None:
    lay.state_dir.mkdir(parents=True, exist_ok=True)
    tmp = lay.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"cluster": cluster.to_json(), "fingerprint": fingerprint(lay, cluster)}, indent=2))
    tmp.replace(lay.state_file)
