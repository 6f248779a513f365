"""The swarm over the daemons: init on the manager, join the workers, wait until every
node is Ready in its role; and, on the way down, remove what runs and leave."""

from __future__ import annotations

import concurrent.futures
import time

import docker

from . import engine
from .cluster import Cluster, Node, daemon_name, node_hostname
from .errors import HarnessError, log_tail
from .layout import Layout
from .netns import GW_BRIDGE, GW_BRIDGE_SUBNET, MANAGER_ADDR, SWARM_PORT, disable_ipv6
from .progress import progress

JOIN_TIMEOUT = 60.0
READY_TIMEOUT = 60.0


def swarm_init(cluster: Cluster) -> str:
    """Make the manager's daemon a swarm manager; return the workers' join token."""
    with engine.connected(cluster.manager_url, timeout=JOIN_TIMEOUT) as c:
        # Swarm would create docker_gwbridge itself, with a 172.x subnet and a route in the
        # host namespace. Create it first, without a host address.
        c.networks.create(
            "docker_gwbridge",
            driver="bridge",
            check_duplicate=True,
            ipam=docker.types.IPAMConfig(
                driver="default", pool_configs=[docker.types.IPAMPool(subnet=GW_BRIDGE_SUBNET)]
            ),
            options={
                "com.docker.network.bridge.name": GW_BRIDGE,
                "com.docker.network.bridge.enable_icc": "false",
                "com.docker.network.bridge.enable_ip_masquerade": "false",
                "com.docker.network.bridge.inhibit_ipv4": "true",
            },
        )
        disable_ipv6(GW_BRIDGE)
        progress(f"swarm init on {MANAGER_ADDR}:{SWARM_PORT}")
        c.swarm.init(
            listen_addr=f"{MANAGER_ADDR}:{SWARM_PORT}", advertise_addr=MANAGER_ADDR, task_history_retention_limit=2
        )
        return c.swarm.attrs["JoinTokens"]["Worker"]


def swarm_join(lay: Layout, node: Node, token: str) -> None:
    log = lay.log(daemon_name(node))
    try:
        with engine.connected(node.docker_url, timeout=JOIN_TIMEOUT) as c:
            c.swarm.join(
                remote_addrs=[f"{MANAGER_ADDR}:{SWARM_PORT}"],
                join_token=token,
                listen_addr=f"{node.addr}:{SWARM_PORT}",
                advertise_addr=node.addr,
            )
    except docker.errors.APIError as e:
        if "continue in the background" in (e.explanation or ""):
            # dockerd gives up waiting for the join after 20 s (slow on a busy machine) but
            # keeps joining; wait_ready waits for the node to show up Ready.
            progress(f"{node.hostname}: join still in progress in the background")
            return
        raise HarnessError(
            f"{node.hostname} could not join the swarm: {engine.describe(e)}; log {log}:\n{log_tail(log)}"
        ) from e
    except engine.ENGINE_ERRORS as e:
        raise HarnessError(
            f"{node.hostname} could not join the swarm: {engine.describe(e)}; log {log}:\n{log_tail(log)}"
        ) from e


def node_problems(cluster: Cluster, timeout: float = 10.0) -> list[str]:
    """Why the swarm's node list doesn't match the cluster (empty list: all Ready)."""
    try:
        with engine.connected(cluster.manager_url, timeout) as c:
            nodes = [n.attrs for n in c.nodes.list()]
    except engine.ENGINE_ERRORS as e:
        return [f"manager: {engine.describe(e)}"]
    problems = []
    seen = {}
    for n in nodes:
        state = (n.get("Status") or {}).get("State", "unknown")
        host = node_hostname(n)
        if host is None:
            # A node that has just joined is in the list before its agent has reported
            # its description (hostname, ...): not ready yet, not an error.
            problems.append(f"node {n.get('ID', '?')[:12]} ({state}) has not reported its hostname yet")
            continue
        seen[host] = n
        want = cluster.nodes.get(host)
        if want is None:
            problems.append(f"unexpected node {host} ({state})")
            continue
        if state != "ready":
            problems.append(f"{host} is {state}")
        role = (n.get("Spec") or {}).get("Role")
        if role != want.role:
            problems.append(f"{host} has role {role}, expected {want.role}")
    for host in cluster.nodes:
        if host not in seen:
            problems.append(f"{host} not in swarm")
    return problems


def wait_ready(lay: Layout, cluster: Cluster, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        problems = node_problems(cluster)
        if not problems:
            return
        if time.monotonic() >= deadline:
            log = lay.log("manager")
            raise HarnessError(
                f"swarm nodes not Ready after {timeout:.0f}s: {'; '.join(problems)}; "
                f"manager log {log}:\n{log_tail(log)}"
            )
        time.sleep(0.2)


def _clean_node(node: Node) -> None:
    """Force-remove the node's containers; a worker leaves the swarm."""
    if not engine.ping(node.docker_url):
        return
    with engine.connected(node.docker_url, timeout=10) as c:
        try:
            for container in c.api.containers(all=True):
                c.api.remove_container(container["Id"], force=True, v=True)
        except engine.ENGINE_ERRORS as e:
            progress(f"removing containers on {node.hostname}: {engine.describe(e)}")
        if node.role == "worker":
            try:
                c.swarm.leave(force=True)
            except engine.ENGINE_ERRORS as e:
                progress(f"{node.hostname} leaving swarm: {engine.describe(e)}")


def remove_swarm_objects(cluster: Cluster) -> None:
    """Best effort: remove services, force-remove containers, leave the swarm."""
    with engine.connected(cluster.manager_url, timeout=10) as manager:
        if engine.ping(cluster.manager_url):
            try:
                for svc in manager.api.services():
                    manager.api.remove_service(svc["ID"])
            except engine.ENGINE_ERRORS as e:
                progress(f"removing services: {engine.describe(e)}")
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(cluster.nodes)) as pool:
            list(pool.map(_clean_node, cluster.nodes.values()))
        if engine.ping(cluster.manager_url):
            try:
                manager.swarm.leave(force=True)
            except engine.ENGINE_ERRORS as e:
                progress(f"manager leaving swarm: {engine.describe(e)}")
