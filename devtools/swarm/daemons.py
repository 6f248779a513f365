"""The dockerd processes: how each is started (namespaces, flags, environment), waited
for, and stopped, with whatever a crashed one leaves behind (shims, containers, mounts)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from . import engine
from .cluster import Node, daemon_name
from .errors import HarnessError, log_tail
from .layout import Layout
from .netns import SUBNET_BASE
from .procs import (
    CMD_TIMEOUT,
    KILL_WAIT,
    alive,
    all_pids,
    cmdline,
    descendants,
    run,
    send_signal,
    tool_env,
    wait_dead,
    which,
)
from .progress import progress

START_TIMEOUT = 60.0
STOP_GRACE = 15.0

# The manager shares the host's network namespace, which has a default route: without
# these, `docker service create` (the CLI asks the daemon for the image's registry
# digest) and the swarm task executor (it tries a pull before using the local image)
# make dockerd resolve and contact registry-1.docker.io.
DOCKERD_ENV = {
    # Swarm tasks use the image present on the node without trying to pull it first.
    "DOCKER_SERVICE_PREFER_OFFLINE_IMAGE": "1",
    # Any registry request goes to a closed loopback port and fails at once. (dockerd
    # still resolves registry names itself, hence the resolv.conf in start_daemon.)
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": f"localhost,127.0.0.0/8,{SUBNET_BASE}0/24",
}


# Run inside the new namespaces, before exec'ing dockerd. $1: hostname to set (empty:
# keep), $2: resolv.conf to bind over /etc/resolv.conf.
NS_SCRIPT = (
    '{ [ -z "$1" ] || hostname "$1"; } && '
    '{ [ ! -e /etc/resolv.conf ] || mount --bind "$2" /etc/resolv.conf; } && '
    'shift 2 && exec "$@"'
)
RESOLV_CONF = (
    "# gpuspawner test swarm: no name server outside this machine\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
)


def dockerd_args(lay: Layout, name: str, manager: bool) -> list[str]:
    args = [
        which("dockerd") or "dockerd",
        f"--config-file={lay.daemon_json}",  # never read /etc/docker/daemon.json
        f"--data-root={lay.data_root(name)}",
        f"--exec-root={lay.exec_root(name)}",
        f"--pidfile={lay.pidfile(name)}",
        f"--host=unix://{lay.sock(name)}",
        # No --storage-driver: dockerd takes overlay2 where the data root's file system
        # allows it (a container starts at once) and falls back to vfs elsewhere (every
        # container start copies its whole image: ~15 s for the Jupyter image).
        # No iptables rules, no NAT, no ip_forward sysctl: the manager shares the host's
        # network namespace, and the workers don't need any of it.
        "--iptables=false",
        "--ip-masq=false",
        "--ip-forward=false",
        # Containers resolve names through their own loopback (and fail fast) instead of
        # the host's resolver: nothing in the cluster talks to addresses outside it.
        "--dns=127.0.0.1",
        # Containers are force-removed before the daemons stop; don't linger on shutdown.
        "--shutdown-timeout=5",
    ]
    if manager:
        # No docker0 (and no 172.17.0.0/16 route) in the host namespace.
        args.append("--bridge=none")
    return args


def _namespaced(lay: Layout, node: Node, cmd: list[str]) -> list[str]:
    """``cmd`` run in the node's namespaces.

    Every dockerd gets its own mount namespace (slave: it still sees the host's mounts)
    with /etc/resolv.conf replaced by one that points at loopback: dockerd resolves
    registry names even with a proxy set (to check them against insecure-registry
    CIDRs), and the manager shares the host's network, so the host's resolver would be
    reachable. Its own mounts (netns files, container shm) also stay out of the host's
    mount table and vanish with the namespace. Workers also get their network namespace
    (joined with ``nsenter --net``, not ``ip netns exec``, which remounts /sys and breaks
    dockerd's cgroup detection) and their own UTS namespace (hostname). nsenter and
    unshare exec without forking and sh execs dockerd, so the launched pid is dockerd's."""
    prefix = [] if node.netns is None else [which("nsenter") or "nsenter", f"--net=/var/run/netns/{node.netns}"]
    unshare = [which("unshare") or "unshare", "--mount", "--propagation", "slave"]
    if node.netns is not None:
        unshare.append("--uts")
    hostname = node.hostname if node.netns else ""
    return prefix + unshare + ["sh", "-c", NS_SCRIPT, "sh", hostname, str(lay.resolv_conf)] + cmd


def start_daemon(lay: Layout, node: Node) -> int:
    """Start one dockerd, detached from this process; return its pid."""
    name = daemon_name(node)
    lay.data_root(name).mkdir(parents=True, exist_ok=True)
    lay.exec_root(name).mkdir(parents=True, exist_ok=True)
    lay.logs_dir.mkdir(parents=True, exist_ok=True)
    cmd = _namespaced(lay, node, dockerd_args(lay, name, node.role == "manager"))
    log = lay.log(name)
    log.write_text(f"# {' '.join(cmd)}\n")
    env = {
        k: v for k, v in tool_env().items() if k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
    }
    env.update(DOCKERD_ENV)
    # Double fork through sh: dockerd must outlive this Python process (the CLI's `up`
    # returns with the cluster running) and must not be our child (no zombie bookkeeping,
    # no ResourceWarning from an un-waited Popen).
    launcher = 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'
    proc = subprocess.run(
        ["sh", "-c", launcher, "sh", str(log)] + cmd,
        capture_output=True,
        text=True,
        timeout=CMD_TIMEOUT,
        env=env,
        start_new_session=True,
    )
    if proc.returncode != 0 or not proc.stdout.strip().isdigit():
        raise HarnessError(f"could not launch dockerd for {node.hostname}: {proc.stderr}")
    return int(proc.stdout.strip())


def wait_daemon(lay: Layout, node: Node, pid: int) -> None:
    """Wait until the dockerd started as ``pid`` answers; raise with its log if it dies or is late."""
    log = lay.log(daemon_name(node))
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if engine.ping(node.docker_url):
            return
        if not alive(pid):
            raise HarnessError(f"dockerd for {node.hostname} exited during startup; log {log}:\n{log_tail(log)}")
        if time.monotonic() >= deadline:
            raise HarnessError(
                f"dockerd for {node.hostname} did not answer on {node.docker_url} within "
                f"{START_TIMEOUT:.0f}s; log {log}:\n{log_tail(log)}"
            )
        time.sleep(0.1)


def _is_our_process(pid: int, lay: Layout) -> bool:
    """dockerd / containerd / shims whose command line names our run or state dir."""
    argv = cmdline(pid)
    if not argv or not os.path.basename(argv[0]).startswith(("dockerd", "containerd")):
        return False
    roots = (str(lay.run_dir) + "/", str(lay.state_dir) + "/")
    return any(r in arg for arg in argv for r in roots)


def _our_processes(lay: Layout) -> set[int]:
    pids = {p for p in all_pids() if _is_our_process(p, lay)}
    for name_file in lay.run_dir.glob("*.pid") if lay.run_dir.is_dir() else ():
        try:
            pid = int(name_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if _is_our_process(pid, lay):
            pids.add(pid)
    # Containers are children of the shims.
    return pids | descendants(pids)


def stop_daemons(lay: Layout, graceful: bool = True) -> None:
    """Stop dockerds (SIGTERM, SIGKILL after a grace) and kill whatever they leave behind.

    containerd dies with its dockerd, but after a crash the shims and the containers
    under them live on: they are found by command line (our exec roots) and ancestry.
    """
    pids = _our_processes(lay)
    if not pids:
        return
    daemons = {p for p in pids if os.path.basename((cmdline(p) or [""])[0]) == "dockerd"}
    if daemons and graceful:
        progress(f"stopping {len(daemons)} dockerd(s)")
        send_signal(daemons, signal.SIGTERM)
        left = wait_dead(daemons, STOP_GRACE)
        if left:
            progress(f"dockerd(s) {sorted(left)} still running after {STOP_GRACE:.0f}s: SIGKILL")
    rest = (pids | _our_processes(lay)) - {os.getpid()}
    rest = {p for p in rest if alive(p)}
    if rest:
        progress(f"killing {len(rest)} leftover process(es)")
        send_signal(rest, signal.SIGKILL)
        still = wait_dead(rest, KILL_WAIT)
        if still:
            raise HarnessError(f"processes survived SIGKILL: {sorted(still)}")


def unmount_under(paths: Iterable[Path]) -> None:
    """Detach every mount (container shm, netns files, ...) below the given dirs."""
    prefixes = [str(p).rstrip("/") + "/" for p in paths]
    for _ in range(5):
        try:
            lines = Path("/proc/self/mountinfo").read_text().splitlines()
        except OSError:
            return
        mounts = []
        for line in lines:
            mp = line.split()[4].replace("\\040", " ")
            if any(mp.startswith(p) or mp + "/" == p for p in prefixes):
                mounts.append(mp)
        if not mounts:
            return
        for mp in sorted(set(mounts), key=len, reverse=True):
            run(["umount", "-l", mp], check=False)
