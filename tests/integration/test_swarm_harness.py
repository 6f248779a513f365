"""The test swarm itself: nodes, images, placement and reachability of host-network services.

These run against the real cluster from ``devtools/swarm/`` (fixture ``swarm``).
"""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.error
import urllib.request
import uuid

import docker
import pytest

from devtools import swarm as harness

WORKERS = ("gpu-a", "gpu-b")
EXPECTED_ADDRS = {"gpu-a": "10.213.77.2", "gpu-b": "10.213.77.3"}

# Never go through a proxy from the environment: the only targets are the test namespaces.
_http = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    with _http.open(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode(errors="replace")


def _wait_http(url: str, timeout: float) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return _http_get(url)
        except (urllib.error.URLError, OSError) as e:
            last = e
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout:.0f}s (last error: {last})")


def _task_summary(service) -> list[tuple]:
    return [
        (t["Status"]["State"], t.get("NodeID", "")[:12], t["Status"].get("Err") or t["Status"].get("Message"))
        for t in service.tasks()
    ]


def _wait_running_task(service, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [t for t in service.tasks() if t["Status"]["State"] == "running"]
        if running:
            return running[0]
        time.sleep(0.1)
    raise AssertionError(f"service {service.name}: no running task after {timeout:.0f}s: {_task_summary(service)}")


def _connection_refused(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def _proc_identity(pid: int) -> tuple[int, str] | None:
    """(pid, start time) of a live process (not a zombie), else None. The start time tells a
    process from a later one that got the same pid (pids wrap quickly on a busy machine)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in "ZX" else (pid, fields[19])


def _running(identity: tuple[int, str] | None) -> bool:
    """That very process still exists and is not a zombie (killed daemons are reaped by init, later)."""
    return identity is not None and _proc_identity(identity[0]) == identity


@pytest.fixture
def client(swarm):
    c = swarm.client()
    yield c
    c.close()


@pytest.fixture
def services(client):
    """Create services through this; they are removed after the test."""
    created = []

    def create(**kwargs):
        kwargs.setdefault("name", f"harness-test-{uuid.uuid4().hex[:8]}")
        service = client.services.create(**kwargs)
        created.append(service)
        return service

    yield create
    for service in created:
        try:
            service.remove()
        except docker.errors.NotFound:
            pass


def _httpd_service(create, hostname: str, port: int):
    """busybox httpd on the host network of one node, serving "hello from <hostname>"."""
    script = f'mkdir -p /www && echo "hello from $(hostname)" > /www/index.html && exec httpd -f -p {port} -h /www'
    return create(
        image=harness.TEST_IMAGE,
        command=["sh", "-c", script],
        networks=["host"],
        constraints=[f"node.hostname=={hostname}"],
        stop_grace_period=1_000_000_000,  # ns; httpd as PID 1 ignores SIGTERM
    )


# --------------------------------------------------------------------------------------


def test_cluster_shape(swarm):
    manager_host = socket.gethostname()
    assert swarm.manager_addr == "10.213.77.1"
    assert swarm.manager.hostname == manager_host
    assert swarm.manager_url == swarm.manager.docker_url
    assert {h: (n.role, n.addr) for h, n in swarm.nodes.items()} == {
        manager_host: ("manager", "10.213.77.1"),
        "gpu-a": ("worker", "10.213.77.2"),
        "gpu-b": ("worker", "10.213.77.3"),
    }


def test_three_nodes_ready_with_hostnames_and_roles(swarm, client):
    nodes = {n.attrs["Description"]["Hostname"]: n.attrs for n in client.nodes.list()}
    assert set(nodes) == {socket.gethostname(), *WORKERS}
    for hostname, attrs in nodes.items():
        expected = swarm.nodes[hostname]
        assert attrs["Status"]["State"] == "ready", hostname
        assert attrs["Spec"]["Availability"] == "active", hostname
        assert attrs["Spec"]["Role"] == expected.role, hostname
        assert attrs["Status"]["Addr"] == expected.addr, hostname
    manager = nodes[socket.gethostname()]
    assert manager["ManagerStatus"]["Leader"] is True
    assert manager["ManagerStatus"]["Addr"] == "10.213.77.1:2377"
    for worker in WORKERS:
        assert "ManagerStatus" not in nodes[worker]


def test_each_node_has_its_own_daemon_and_the_test_image(swarm):
    swarm_ids = set()
    for hostname, node in swarm.nodes.items():
        c = node.client()
        try:
            info = c.info()
            # The daemon behind this node's socket really is that node.
            assert info["Name"] == hostname
            assert info["Swarm"]["NodeAddr"] == node.addr
            assert info["Swarm"]["LocalNodeState"] == "active"
            swarm_ids.add(info["Swarm"]["Cluster"]["ID"] if "Cluster" in info["Swarm"] else None)
            image = c.images.get(harness.TEST_IMAGE)
            assert harness.TEST_IMAGE in image.tags
            assert image.labels.get(harness.ROOTFS_LABEL)
        finally:
            c.close()
    # Workers don't get the cluster ID in /info; the manager does.
    assert len(swarm_ids - {None}) == 1


@pytest.mark.parametrize("hostname, port", [("gpu-b", 18081), ("gpu-a", 18082)])
def test_host_network_service_runs_on_constrained_node_and_answers(swarm, client, services, hostname, port):
    t0 = time.monotonic()
    service = _httpd_service(services, hostname, port)
    # No endpoint spec / published ports: on the host network they make swarm reject the task.
    assert not (service.attrs["Spec"].get("EndpointSpec") or {}).get("Ports")

    task = _wait_running_task(service)
    assert client.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"] == hostname
    assert swarm.hostname_of(task["NodeID"]) == hostname

    addr = EXPECTED_ADDRS[hostname]
    status, body = _wait_http(f"http://{addr}:{port}/", timeout=30)
    converge = time.monotonic() - t0
    print(f"\n{hostname}: service create -> HTTP answer in {converge:.2f}s")
    assert status == 200
    assert body.strip() == f"hello from {hostname}"

    # The server lives in that node's network namespace only.
    others = [a for h, a in EXPECTED_ADDRS.items() if h != hostname] + [swarm.manager_addr]
    for other in others:
        assert _connection_refused(other, port), f"port {port} open on {other}, expected only on {addr}"


def test_up_again_reuses_the_running_cluster(swarm, client):
    swarm_id = client.swarm.attrs["ID"]
    t0 = time.monotonic()
    again = harness.up(WORKERS, swarm.state_dir, swarm.run_dir)
    elapsed = time.monotonic() - t0
    assert again == swarm
    assert client.swarm.attrs["ID"] == swarm_id
    assert elapsed < 10, f"warm up() took {elapsed:.1f}s"


def test_up_recreates_a_cluster_whose_worker_crashed(swarm, client, services):
    """Kill -9 a worker's dockerd under a running task: up() must clean up and rebuild."""
    # This breaks the cluster on purpose: wait until no other test session on this machine
    # uses it, and keep them out until it is rebuilt.
    with harness.exclusive_use(WORKERS, swarm.state_dir, swarm.run_dir) as cluster:
        assert cluster == swarm
        service = _httpd_service(services, "gpu-a", 18083)
        task = _wait_running_task(service)
        container_pid = task["Status"]["ContainerStatus"]["PID"]
        assert container_pid > 0
        container_proc = _proc_identity(container_pid)
        assert container_proc is not None, f"container process {container_pid} not found"
        _wait_http("http://10.213.77.2:18083/", timeout=30)
        old_swarm_id = client.swarm.attrs["ID"]

        dockerd_pid = int((swarm.run_dir / "gpu-a.pid").read_text())
        dockerd_proc = _proc_identity(dockerd_pid)
        assert dockerd_proc is not None, f"gpu-a's dockerd {dockerd_pid} not found"
        os.kill(dockerd_pid, signal.SIGKILL)
        cluster, problems = harness.status(swarm.state_dir, swarm.run_dir)
        assert cluster == swarm
        assert problems, "status() did not notice the dead dockerd"

        rebuilt = harness.up(WORKERS, swarm.state_dir, swarm.run_dir)
        assert rebuilt == swarm
        _, problems = harness.status(swarm.state_dir, swarm.run_dir)
        assert problems == []
        # A fresh swarm, and nothing left of the old one's processes.
        fresh = swarm.client()
        try:
            assert fresh.swarm.attrs["ID"] != old_swarm_id
            assert fresh.services.list() == []
        finally:
            fresh.close()
        assert not _running(container_proc), "container process of the old cluster survived"
        assert not _running(dockerd_proc), "gpu-a's killed dockerd is still running"
        assert _connection_refused("10.213.77.2", 18083)
