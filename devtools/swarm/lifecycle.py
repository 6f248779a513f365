"""Bringing the cluster up (or reusing a healthy one), tearing it down, its status, and
sharing it between test sessions on one machine."""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import os
import shutil
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from . import engine
from .cluster import Cluster, Node, daemon_name
from .daemons import RESOLV_CONF, start_daemon, stop_daemons, unmount_under, wait_daemon
from .errors import HarnessError
from .images import ensure_test_image
from .layout import Layout, layout
from .membership import node_problems, remove_swarm_objects, swarm_init, swarm_join, wait_ready
from .netns import (
    BRIDGE,
    MANAGER_ADDR,
    link_exists,
    netns_name,
    our_netns,
    setup_network,
    teardown_network,
    worker_addr,
)
from .preconditions import check_paths, check_workers, unavailable_reason
from .progress import progress
from .state import (
    LOCK_TIMEOUT,
    fingerprint,
    load_state,
    lock,
    save_state,
    saved_fingerprint,
    users_lock,
    users_mode,
    users_unlock,
)

DEFAULT_WORKERS: tuple[str, ...] = ("gpu-a", "gpu-b")
BRINGUP_ATTEMPTS = 2  # a bring-up that fails for an environmental reason is retried once, from scratch
EXCLUSIVE_USE_TIMEOUT = 900.0


def _expected_cluster(lay: Layout, workers: Sequence[str]) -> Cluster:
    manager_host = socket.gethostname()
    nodes = {manager_host: Node(manager_host, MANAGER_ADDR, f"unix://{lay.sock('manager')}", "manager", None)}
    for i, h in enumerate(workers):
        nodes[h] = Node(h, worker_addr(i), f"unix://{lay.sock(h)}", "worker", netns_name(h))
    return Cluster(
        state_dir=lay.state_dir,
        run_dir=lay.run_dir,
        manager_url=f"unix://{lay.sock('manager')}",
        manager_addr=MANAGER_ADDR,
        nodes=nodes,
    )


def load(state_dir: Path | str | None = None, run_dir: Path | str | None = None) -> Cluster | None:
    """The cluster recorded in state_dir (running or not), or None."""
    return load_state(layout(state_dir, run_dir))


def _health_problems(cluster: Cluster) -> list[str]:
    """Why a running cluster can't be reused as-is (empty list: healthy)."""
    problems = []
    if not link_exists(BRIDGE):
        problems.append(f"bridge {BRIDGE} missing")
    netns = set(our_netns())
    for node in cluster.nodes.values():
        if node.netns and node.netns not in netns:
            problems.append(f"netns {node.netns} missing")
        if not engine.ping(node.docker_url, timeout=engine.HEALTH_PING_TIMEOUT):
            problems.append(f"dockerd for {node.hostname} not answering on {node.docker_url}")
    if problems:
        return problems
    for node in cluster.nodes.values():
        try:
            with engine.connected(node.docker_url) as c:
                info = c.info()
        except engine.ENGINE_ERRORS as e:
            problems.append(f"{node.hostname}: {engine.describe(e)}")
            continue
        if info.get("Name") != node.hostname:
            problems.append(f"dockerd at {node.docker_url} has hostname {info.get('Name')}, expected {node.hostname}")
        if (info.get("Swarm") or {}).get("LocalNodeState") != "active":
            problems.append(f"{node.hostname} is not in a swarm")
    return problems or node_problems(cluster)


def up(
    workers: Sequence[str] = DEFAULT_WORKERS,
    state_dir: Path | str | None = None,
    run_dir: Path | str | None = None,
) -> Cluster:
    """Bring the cluster up (or reuse it if it is already up and healthy); return it.

    Anything half-made (namespaces, links, daemons, mounts, files from a crashed or
    different run) is torn down first. Raises ``HarnessError`` on failure, with the
    failing dockerd's log tail where there is one.
    """
    reason = unavailable_reason()
    if reason:
        raise HarnessError(f"cannot run a swarm here: {reason}")
    workers = check_workers(workers)
    lay = layout(state_dir, run_dir)
    wanted = _expected_cluster(lay, workers)
    check_paths(lay, (daemon_name(n) for n in wanted.nodes.values()))

    with lock():
        return _up_locked(lay, wanted)


def _up_locked(lay: Layout, wanted: Cluster) -> Cluster:
    t0 = time.monotonic()
    current = load_state(lay)
    same_config = saved_fingerprint(lay) == fingerprint(lay, wanted)
    if current is not None and current.to_json() == wanted.to_json() and same_config:
        problems = _health_problems(wanted)
        if not problems:
            ensure_test_image(wanted)
            progress(f"cluster already up and healthy ({time.monotonic() - t0:.1f}s)")
            return wanted
        progress("existing cluster unhealthy, recreating: " + "; ".join(problems))
    elif current is not None:
        progress("existing cluster has a different shape or daemon configuration, recreating")

    # Whatever is there gets replaced, so no need for a graceful stop.
    _teardown(lay, graceful=False)
    for old_log in lay.logs_dir.glob("*.attempt*.log") if lay.logs_dir.is_dir() else ():
        old_log.unlink(missing_ok=True)
    _create_with_retry(lay, wanted)
    progress(f"cluster up ({time.monotonic() - t0:.1f}s)")
    return wanted


def _create_with_retry(lay: Layout, wanted: Cluster) -> None:
    failures: list[str] = []
    for attempt in range(1, BRINGUP_ATTEMPTS + 1):
        try:
            _create(lay, wanted)
            return
        except (HarnessError, *engine.ENGINE_ERRORS) as e:
            # Environmental failures (a daemon that died or did not answer in time, ...)
            # get one more try from scratch. Anything else (a bug here) fails at once.
            first_line = (str(e).splitlines() or [""])[0] or type(e).__name__
            failures.append(f"attempt {attempt}: {first_line}")
            last = attempt == BRINGUP_ATTEMPTS
            progress(
                f"bring-up attempt {attempt}/{BRINGUP_ATTEMPTS} failed ({first_line}); "
                + ("cleaning up" if last else "tearing down and retrying from scratch")
                + "; dockerd logs are in "
                + str(lay.logs_dir)
            )
            cleaned = _cleanup_failed_bringup(lay)
            if last or not cleaned:
                # Callers catch HarnessError: a Docker API error becomes one, with its cause.
                err = e if isinstance(e, HarnessError) else HarnessError(f"bring-up failed: {engine.describe(e)}")
                if len(failures) > 1 and hasattr(err, "add_note"):
                    err.add_note("earlier bring-up attempts failed too: " + "; ".join(failures[:-1]))
                if err is e:
                    raise
                raise err from e
            _keep_logs_of_attempt(lay, attempt)
        except BaseException:
            progress("bring-up failed, cleaning up; dockerd logs are in " + str(lay.logs_dir))
            _cleanup_failed_bringup(lay)
            raise


def _cleanup_failed_bringup(lay: Layout) -> bool:
    """Don't leave daemons and namespaces behind (the logs stay); False if that failed."""
    try:
        _teardown(lay, graceful=False)
    except Exception as e:  # noqa: BLE001 - the original error matters more
        progress(f"cleanup after the failed bring-up failed too: {e}")
        return False
    return True


def _keep_logs_of_attempt(lay: Layout, attempt: int) -> None:
    """logs/<name>.log -> logs/<name>.attempt<N>.log, before the next attempt overwrites them."""
    for log in lay.logs_dir.glob("*.log") if lay.logs_dir.is_dir() else ():
        if ".attempt" not in log.name:
            log.replace(log.with_name(f"{log.stem}.attempt{attempt}.log"))


def _create(lay: Layout, cluster: Cluster) -> None:
    lay.state_dir.mkdir(parents=True, exist_ok=True)
    lay.run_dir.mkdir(parents=True, exist_ok=True)
    lay.daemon_json.write_text("{}\n")
    lay.resolv_conf.write_text(RESOLV_CONF)
    setup_network(cluster)

    nodes = list(cluster.nodes.values())
    progress(f"starting {len(nodes)} dockerd(s)")
    pids = {n.hostname: start_daemon(lay, n) for n in nodes}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        for f in [pool.submit(wait_daemon, lay, n, pids[n.hostname]) for n in nodes]:
            f.result()
    progress("all dockerds answer")

    token = swarm_init(cluster)
    progress(f"joining {', '.join(n.hostname for n in cluster.workers)}")
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cluster.workers)) as pool:
        for f in [pool.submit(swarm_join, lay, n, token) for n in cluster.workers]:
            f.result()
    wait_ready(lay, cluster)
    progress("all nodes Ready")
    save_state(lay, cluster)
    ensure_test_image(cluster)


def _teardown(lay: Layout, graceful: bool = True) -> None:
    """Remove everything the harness makes; graceful: via the API first (services,
    containers, swarm membership), then SIGTERM; otherwise straight to SIGKILL."""
    t0 = time.monotonic()
    cluster = load_state(lay)
    if graceful and cluster is not None:
        progress("removing the swarm's services and containers")
        remove_swarm_objects(cluster)
    stop_daemons(lay, graceful=graceful)
    teardown_network()
    unmount_under([lay.run_dir, lay.state_dir])
    if (lay.state_dir / "nodes").is_dir():
        progress("deleting the nodes' data (vfs keeps a full copy of each image per node: this takes a while)")
    for path in [lay.run_dir, lay.state_dir / "nodes", lay.state_file, lay.daemon_json, lay.resolv_conf]:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=False)
        elif path.exists() or path.is_symlink():
            path.unlink()
    if time.monotonic() - t0 > 0.5:
        progress(f"teardown done ({time.monotonic() - t0:.1f}s)")


def down(state_dir: Path | str | None = None, run_dir: Path | str | None = None) -> None:
    """Tear the cluster down completely. Safe to call when nothing is up."""
    if os.geteuid() != 0:
        raise HarnessError("needs root")
    with lock():
        _teardown(layout(state_dir, run_dir), graceful=True)


def status(state_dir: Path | str | None = None, run_dir: Path | str | None = None) -> tuple[Cluster | None, list[str]]:
    """(recorded cluster or None, list of problems; empty when up and healthy)."""
    lay = layout(state_dir, run_dir)
    cluster = load_state(lay)
    if cluster is None:
        return None, ["no cluster recorded in " + str(lay.state_file)]
    return cluster, _health_problems(cluster)


# Several test sessions on one machine (two developers, or a session started while another
# runs) share the one cluster: each holds the users lock shared while it uses it.


def use_shared(timeout: float = LOCK_TIMEOUT) -> None:
    """Mark this process as a user of the cluster, until ``down_if_unused`` or its exit.

    Waits only while another process uses the cluster exclusively (a rebuild or a
    ``down_if_unused``)."""
    users_lock(fcntl.LOCK_SH, timeout, "using the swarm")


@contextlib.contextmanager
def exclusive_use(
    workers: Sequence[str] = DEFAULT_WORKERS,
    state_dir: Path | str | None = None,
    run_dir: Path | str | None = None,
    timeout: float = EXCLUSIVE_USE_TIMEOUT,
) -> Iterator[Cluster]:
    """For a test that breaks the cluster on purpose: wait until no other process uses
    it, make sure it is up (another session may have taken it down meanwhile), and keep
    other sessions out until the block ends. Then back to shared use."""
    had = users_mode()
    users_lock(fcntl.LOCK_EX, timeout, "exclusive use of the swarm")
    try:
        yield up(workers, state_dir, run_dir)
    finally:
        if had == fcntl.LOCK_SH:
            users_lock(fcntl.LOCK_SH, LOCK_TIMEOUT, "using the swarm")
        else:
            users_unlock()


def down_if_unused(state_dir: Path | str | None = None, run_dir: Path | str | None = None) -> bool:
    """End this process's use of the cluster and tear it down unless another process
    still uses it (then it stays up for that one, whose own end takes it down).
    Returns whether it was torn down."""
    users_unlock()
    try:
        users_lock(fcntl.LOCK_EX, 0, "down")
    except HarnessError:
        return False
    try:
        down(state_dir, run_dir)
    finally:
        users_unlock()
    return True
