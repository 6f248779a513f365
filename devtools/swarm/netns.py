"""The cluster's network: the bridge on the host, one network namespace per worker
joined to it by a veth pair, and their teardown.

Everything stays inside 10.213.77.0/24: the bridge is a /25 (manager .1, worker N at
.(N+2)), and the manager's docker_gwbridge takes the upper /25 with no host address."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import HarnessError
from .procs import KILL_WAIT, run, send_signal, wait_dead
from .progress import progress

if TYPE_CHECKING:
    from .cluster import Cluster

BRIDGE = "gpusw0"
GW_BRIDGE = "gpuswgw0"  # kernel name of the manager's docker_gwbridge
SUBNET_BASE = "10.213.77."
BRIDGE_PREFIXLEN = 25
MANAGER_ADDR = SUBNET_BASE + "1"
GW_BRIDGE_SUBNET = SUBNET_BASE + "128/25"
FIRST_WORKER_OCTET = 2
MAX_WORKERS = 120  # .2 .. .121, well inside the /25
NETNS_PREFIX = "gpusw-"
VETH_PREFIX = "gpuswv"
SWARM_PORT = 2377


def worker_addr(index: int) -> str:
    return f"{SUBNET_BASE}{FIRST_WORKER_OCTET + index}"


def netns_name(hostname: str) -> str:
    return NETNS_PREFIX + hostname


def veth_name(index: int) -> str:
    return f"{VETH_PREFIX}{FIRST_WORKER_OCTET + index}"


def link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def disable_ipv6(ifname: str, netns: str | None = None) -> None:
    """Keep a test link IPv4-only (no link-local address, no router solicitations).

    Best effort: without IPv6 in the kernel there is nothing to do."""
    knob = f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6"
    if netns is None:
        try:
            Path(knob).write_text("1")
        except OSError:
            pass
    else:
        # /proc/sys/net shows the network namespace of the process that opens it.
        run(
            ["nsenter", f"--net=/var/run/netns/{netns}", "sh", "-c", f"[ ! -e {knob} ] || echo 1 > {knob}"], check=False
        )


def setup_network(cluster: Cluster) -> None:
    progress(f"network: bridge {BRIDGE} {MANAGER_ADDR}/{BRIDGE_PREFIXLEN}")
    run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    disable_ipv6(BRIDGE)
    run(["ip", "addr", "add", f"{MANAGER_ADDR}/{BRIDGE_PREFIXLEN}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    for i, node in enumerate(cluster.workers):
        ns, veth = node.netns, veth_name(i)
        assert ns is not None
        progress(f"network: netns {ns} {node.addr} via {veth}")
        run(["ip", "netns", "add", ns])
        # Create the pair with its far end directly inside the namespace, named eth0.
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        disable_ipv6(veth)
        run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
        disable_ipv6("eth0", ns)
        run(["ip", "-n", ns, "addr", "add", f"{node.addr}/{BRIDGE_PREFIXLEN}", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        # Deliberately no default route: nothing in a worker namespace reaches beyond the bridge.


def our_netns() -> list[str]:
    proc = run(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(NETNS_PREFIX)]


def our_links() -> list[str]:
    try:
        names = os.listdir("/sys/class/net")
    except OSError:
        return []
    return [n for n in names if n == BRIDGE or n == GW_BRIDGE or re.fullmatch(VETH_PREFIX + r"\d+", n)]


def teardown_network() -> None:
    for ns in our_netns():
        # A namespace only disappears when no process holds it; kill whatever is left.
        pids = [int(p) for p in run(["ip", "netns", "pids", ns], check=False).stdout.split() if p.isdigit()]
        if pids:
            progress(f"killing {len(pids)} leftover process(es) in netns {ns}")
            send_signal(pids, signal.SIGKILL)
            wait_dead(pids, KILL_WAIT)
        run(["ip", "netns", "delete", ns], check=False)
    for bridge in (GW_BRIDGE, BRIDGE):
        if link_exists(bridge):
            # Ports of the bridge (veths whose other end is in a dying namespace).
            for port in (
                os.listdir(f"/sys/class/net/{bridge}/brif") if os.path.isdir(f"/sys/class/net/{bridge}/brif") else ()
            ):
                run(["ip", "link", "delete", port], check=False)
    for link in our_links():
        run(["ip", "link", "delete", link], check=False)
    left = our_links()
    if left:
        raise HarnessError(f"could not delete links: {left}")
