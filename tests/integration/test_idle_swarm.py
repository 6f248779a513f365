"""Idle reclaim on the real swarm: a real hub, and gpuspawner-agent on gpu-b (from
examples/agent-stack.yml) reading real pynvml over the fake libnvidia-ml.so.1 and
tracing GPU processes to their containers through gpu-b's /proc and dockerd. The
fake NVML lists the PIDs of the servers' real containers, with the utilization a
test sets; timeouts are seconds long."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from devtools import agent_stack
from gpuspawner.ledger.ledger import Ledger
from tests.integration.support import hub_with_agent_on_gpu_b, login, server_of, services_of, spawn_ready, wait_until
from tests.integration.test_agents_on_nodes import GPU_B

A100 = GPU_B[0]["name"]
TIMEOUT, WARNING = 8.0, 4.0
CONFIG = f"""
c.GPUSwarmSpawner.gpu_idle_timeout = {TIMEOUT}
c.GPUSwarmSpawner.gpu_idle_warning = {WARNING}
c.GPUSwarmSpawner.gpu_reclaim_interval = 0.5
c.GPUSwarmSpawner.gpu_activity_updates_last_activity = True
c.GPUSwarmSpawner.max_gpus_per_user = 1
c.GPUSwarmSpawner.gpu_sharing = {{"{A100}": {{"quantum": 0.05}}}}
"""


@pytest.fixture(scope="module")
def idle_hub(swarm, tmp_path_factory):
    work = tmp_path_factory.mktemp("idle")
    db = work / "ledger.sqlite"
    config = CONFIG + f"c.GPUSwarmSpawner.gpu_db_url = 'sqlite:///{db}'\n"
    with hub_with_agent_on_gpu_b(swarm, work, port_from=20400, extra_config=config) as (hub, node):
        yield hub, node, f"sqlite:///{db}"


@pytest.fixture
def cluster(idle_hub):
    hub, node, db = idle_hub
    yield hub, node, db
    hub.stop_all_servers()
    node.clear()


def holder(hub, user: str) -> dict | None:
    for devices in hub.api("GET", "/gpuspawner/alloc-map").json().values():
        for d in devices.values():
            for h in d["holders"]:
                if h["user"] == user:
                    return h
    return None


def notices(hub, user: str) -> list[dict]:
    r = login(hub, user).get(hub.url + "/hub/api/gpuspawner/notices", timeout=10)
    r.raise_for_status()
    return r.json()["notices"]


def hub_times(hub, user: str) -> dict[str, float]:
    """When the hub's log says the user's server was added to the proxy, taken off it (the
    reclaim's first step) and stopped, in seconds after the first."""
    marks = {
        "ready": f"Adding user {user} to proxy",
        "stop begun": f"Removing user {user} from proxy",
        "stopped": f"Stopped {user}'s server",
    }
    found = {}
    for line in hub.log_path.read_text(errors="replace").splitlines():
        for mark, text in marks.items():
            if text in line and mark not in found:
                found[mark] = datetime.strptime(line.split()[2], "%H:%M:%S.%f")
    return {m: (t - found["ready"]).total_seconds() for m, t in found.items()}


def running(hub, user: str) -> bool:
    return hub.server_model(user) is not None


def test_processes_are_attributed_to_their_containers_and_an_idle_server_is_warned_then_stopped(cluster, swarm):
    """Guards docs/idle.md, "Measured": "One reclaim on the test swarm", "the test prints these lines",
    "the warning ran out: the hub takes the server off the proxy and stops it" and "the container
    has ended: the server is gone from JupyterHub, its GPU free, the ledger says idle"."""
    hub, node, db = cluster
    spawn_ready(hub, "alice", {"gpu_model": A100})
    t0 = time.monotonic()  # alice's GPU is at 0 % from the start
    spawn_ready(hub, "bob", {"gpu_model": A100})
    a_uuid, a_pid = server_of(swarm, "alice")
    b_uuid, b_pid = server_of(swarm, "bob")
    agents = {"label": f"com.docker.stack.namespace={agent_stack.STACK_NAME}"}
    client = swarm.client("gpu-b")
    wait_until(lambda: len(client.containers.list(filters=agents)) == 1, "an earlier agent still runs")
    [agent] = client.containers.list(filters=agents)
    node.busy(b_uuid, 60)
    node.run(b_uuid, b_pid)
    node.run(a_uuid, a_pid)
    node.run(a_uuid, agent.attrs["State"]["Pid"], used_mib=10)  # a container that holds nothing
    wait_until(lambda: hub.api("GET", "/gpuspawner/idle").json()["unattributed"].get("gpu-b"), "not reported", 10)
    [stray] = hub.api("GET", "/gpuspawner/idle").json()["unattributed"]["gpu-b"]
    assert stray["pid"] == agent.attrs["State"]["Pid"] and stray["service"] == agent_stack.STACK_NAME + "_agent"
    assert stray["uuid"] == a_uuid
    idle = hub.api("GET", "/gpuspawner/idle").json()["idle"]
    assert [r["user"] for r in idle] == ["alice"]  # bob's process is his and his GPU is busy
    assert holder(hub, "bob")["last_gpu_activity"] is not None and holder(hub, "bob")["idle_seconds"] is None

    wait_until(lambda: notices(hub, "alice"), "alice was not warned", timeout=TIMEOUT + 5)
    warned = time.monotonic() - t0
    [notice] = notices(hub, "alice")
    assert notice["reason"] == "idle" and 0 < notice["seconds_left"] <= WARNING
    home = login(hub, "alice").get(hub.url + "/hub/home", timeout=10).text
    assert notice["message"].split(";")[0] in home
    assert notices(hub, "bob") == []

    wait_until(lambda: not running(hub, "alice"), "alice's server was not stopped", timeout=WARNING + 10)
    stopped = time.monotonic() - t0
    assert stopped - warned >= WARNING - 1  # the whole warning first
    wait_until(lambda: services_of(swarm, "alice") == [], "alice's service is still there", timeout=30)
    wait_until(lambda: holder(hub, "alice") is None, "alice's GPU is still held", timeout=30)
    freed = time.monotonic() - t0
    print(
        f"\nreclaim timeline: ready (and idle) at 0 s, warned {warned:.1f} s, stopped {stopped:.1f} s, GPU free {freed:.1f} s"
    )
    print(f"hub log, s after the server was ready: {hub_times(hub, 'alice')}")
    [closed] = Ledger(db).history(user="alice")
    assert closed.end_reason == "idle"
    usage = {u["key"]: u["gpu_hours"] for u in hub.api("GET", "/gpuspawner/usage?by=reason").json()["usage"]}
    assert usage["idle"] > 0 and "" in usage  # alice's GPU-hours apart from bob's, still held
    assert running(hub, "bob") and notices(hub, "bob") == []
    # bob never used the web: his last_activity follows his GPU
    last = hub.server_model("bob")["last_activity"]
    time.sleep(2.5)
    assert hub.server_model("bob")["last_activity"] > last


def test_activity_during_the_warning_cancels_it(cluster, swarm):
    hub, node, db = cluster
    spawn_ready(hub, "carol", {"gpu_model": A100})
    uuid, pid = server_of(swarm, "carol")
    node.run(uuid, pid)
    wait_until(lambda: notices(hub, "carol"), "carol was not warned", timeout=TIMEOUT + 5)
    node.busy(uuid, 60)
    wait_until(lambda: notices(hub, "carol") == [], "the warning stayed", timeout=5)
    time.sleep(WARNING + 2)
    assert running(hub, "carol")
    assert holder(hub, "carol")["idle_seconds"] is None


def test_on_a_shared_gpu_only_the_idle_holder_is_stopped(cluster, swarm):
    hub, node, db = cluster
    spawn_ready(hub, "dave", {"gpu_model": A100, "gpu_share": 0.5})
    spawn_ready(hub, "erin", {"gpu_model": A100, "gpu_share": 0.5})
    d_uuid, d_pid = server_of(swarm, "dave")
    e_uuid, _ = server_of(swarm, "erin")
    assert d_uuid == e_uuid  # one GPU, two holders
    node.busy(d_uuid, 60)
    node.run(d_uuid, d_pid)  # dave computes; erin has no process on it
    wait_until(lambda: not running(hub, "erin"), "erin was not stopped", timeout=TIMEOUT + WARNING + 10)
    [dave] = services_of(swarm, "dave")
    assert [t["Status"]["State"] for t in dave.tasks()] == ["running"]
    assert running(hub, "dave") and notices(hub, "dave") == []
    [closed] = Ledger(db).history(user="erin")
    assert closed.end_reason == "idle"


def test_max_hours_stops_a_busy_server_after_its_warning(idle_hub, swarm):
    hub, node, db = idle_hub
    # The same hub, restarted with a held-time limit of 10.8 s (the agents keep reporting).
    hub.stop()
    extra = hub.extra_config
    hub.extra_config = extra + (
        "c.GPUSwarmSpawner.gpu_idle_timeout = 0\nc.GPUSwarmSpawner.gpu_max_hours = 0.003\n"
        f"c.GPUSwarmSpawner.gpu_max_hours_warning = {WARNING}\n"
    )
    try:
        hub.start()
        wait_until(lambda: "gpu-b" in hub.api("GET", "/gpuspawner/alloc-map").json(), "no report", timeout=30)
        spawn_ready(hub, "frank", {"gpu_model": A100})
        uuid, pid = server_of(swarm, "frank")
        node.busy(uuid, 90)
        node.run(uuid, pid)
        wait_until(lambda: notices(hub, "frank"), "frank was not warned", timeout=15)
        warned = time.monotonic()
        assert notices(hub, "frank")[0]["reason"] == "max_hours"  # busy, and warned all the same
        wait_until(lambda: not running(hub, "frank"), "frank was not stopped", timeout=20)
        assert time.monotonic() - warned >= WARNING - 1  # the whole warning first
        [closed] = Ledger(db).history(user="frank")
        assert closed.end_reason == "max_hours"
    finally:
        hub.stop_all_servers()
        node.clear()
        hub.stop()
        hub.extra_config = extra
        hub.start()
