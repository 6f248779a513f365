"""examples/stack/stack.yml, the production stack, deployed with `docker stack deploy`
on the real test swarm (devtools/stack.py): the hub and its proxy as a swarm service,
PostgreSQL, the node agents, swarm secrets, and users' servers on the attachable
overlay network, reached by their service names.

What the tests check comes from the swarm and through the hub's published port, as a
user and an admin meet them. Each step prints how long it took (``-s`` shows them).

Guards docs/deploy.md, "Deploying on a swarm: the hub as a swarm service": "The same stack runs in
CI on the local three-node swarm, where a test deploys it" and "Measured there (two shared cores,
the vfs storage driver, images cached; that test prints these figures)".
"""

from __future__ import annotations

import subprocess
import sys
import time

import requests

from devtools import agent_stack
from devtools import stack as stack_harness
from tests.integration.stack_support import (
    A100,
    HUB_SERVICE,
    RESTART_BOUND,
    TIMES,
    UUIDS,
    container_env,
    container_of,
    holders,
    login,
    open_allocations,
    opened,
    stack_fixture,  # noqa: F401 - the module's stack
    task_of,
)
from tests.integration.support import services_of


def test_the_stack_runs_as_deployed(stack, swarm):
    """Guards docs/deploy.md, "Deploying on a swarm: the hub as a swarm service": "every token and
    password from a swarm secret"."""
    hub, state = stack
    client = swarm.client()
    services = {
        s.name.split("_", 1)[1]: s
        for s in client.services.list(filters={"label": "com.docker.stack.namespace=gpuspawner"})
    }
    assert set(services) == {"hub", "proxy", "postgres", "agent"}
    node, _ = task_of(swarm, services["hub"])
    assert node == task_of(swarm, services["proxy"])[0] == stack_harness.HUB_NODE
    container = container_of(swarm, services["hub"])
    assert container.attrs["State"]["Health"]["Status"] == "healthy"  # the stack's health check
    env = container_env(swarm, node, services["hub"])
    assert not any(v in env for v in ("POSTGRES_PASSWORD", "CONFIGPROXY_AUTH_TOKEN"))  # secrets stay files
    db_node, _ = task_of(swarm, services["postgres"])
    assert db_node == stack_harness.DB_NODE  # node.labels.gpuspawner.db == true
    # Every password and token of the stack is a swarm secret.
    names = {s.name for s in client.secrets.list()}
    assert {f"gpuspawner-{n}" for n in stack_harness.SECRETS} <= names
    # The admin token reads the metrics Prometheus scrapes (examples/stack/prometheus.yml)
    # and drives the `gpuspawner` command.
    metrics = requests.get(hub.url + "/hub/metrics", headers={"Authorization": f"token {hub.token}"}, timeout=30)
    assert metrics.status_code == 200 and "gpuspawner_devices_unhealthy{" in metrics.text
    token_file = state / "secrets" / "admin-token"
    cli = [sys.executable, "-m", "gpuspawner.cli", "--hub-url", hub.url, "--token-file", str(token_file)]
    listed = subprocess.run([*cli, "agent-token", "--list"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and {line.split()[0] for line in listed.stdout.splitlines()} == {"gpu-a", "gpu-b"}
    # A wrong password is refused at the published port.
    s = requests.Session()
    s.get(hub.url + "/hub/login", timeout=10)
    r = s.post(hub.url + "/hub/login", data={"username": "mallory", "password": "x", "_xsrf": s.cookies.get("_xsrf")})
    assert r.status_code == 403


def test_gpu_and_cpu_servers_on_the_overlay_network_and_a_hub_restart(stack, swarm):
    """Guards docs/deploy.md, "Deploying on a swarm: the hub as a swarm service": "logs in through the
    published port, starts a GPU server and a CPU-only server on the overlay network, restarts the
    hub's service".

    Guards docs/reliability.md, "The fault model": "The proxy, a service of its own, keeps its
    routes: open notebook pages keep working" and "Servers reach the hub again through the proxy as
    soon as it serves".

    Guards docs/how-it-works.md, "Networking": "the hub and the servers reach each other by their
    service names"."""
    hub, state = stack
    password = stack_harness.secret_values(state)["login-password"]
    network = stack_harness.network(swarm)
    t0 = time.monotonic()
    assert hub.spawn("alice", {"gpu_model": A100, "gpu_count": 1}).status_code in (201, 202)
    assert hub.spawn("bob", {}).status_code in (201, 202)
    hub.wait_ready("alice", timeout=200)
    hub.wait_ready("bob", timeout=200)
    TIMES["spawn to ready servers (GPU and CPU-only, started together)"] = time.monotonic() - t0

    (alice,) = services_of(swarm, "alice")
    (bob,) = services_of(swarm, "bob")
    node, _ = task_of(swarm, alice)
    assert node == "gpu-b"
    env = container_env(swarm, node, alice)
    assert env["NVIDIA_VISIBLE_DEVICES"] in UUIDS["gpu-b"]
    node_of_bob = task_of(swarm, bob)[0]
    assert container_env(swarm, node_of_bob, bob)["NVIDIA_VISIBLE_DEVICES"] == "void"
    for service in (alice, bob):
        spec = service.attrs["Spec"]
        assert [n["Target"] for n in spec["TaskTemplate"]["Networks"]] == [network.id]
        assert spec["EndpointSpec"]["Mode"] == "dnsrr"
        assert "node.role == worker" in spec["TaskTemplate"]["Placement"]["Constraints"]

    # Through the published port into JupyterLab: the server checks the login with the
    # hub's API at hub:8081, over the overlay network.
    session = login(hub, "alice", password)
    page = session.get(hub.url + "/user/alice/", timeout=60)
    assert page.status_code == 200 and page.url == hub.url + "/user/alice/lab"
    before = holders(hub)
    assert before[env["NVIDIA_VISIBLE_DEVICES"]] == ["alice"]
    ledger = open_allocations(swarm)  # GPU allocations only: bob holds none
    assert ledger == [("alice", "gpu-b", env["NVIDIA_VISIBLE_DEVICES"])]

    # The hub's service restarted: the servers and their GPUs are kept, nothing twice.
    t0 = time.monotonic()
    stack_harness.docker(swarm, "service", "update", "--force", "--detach", HUB_SERVICE)
    time.sleep(2)  # the old task is being stopped
    stack_harness.wait_serving(hub.url, 240)
    while not all((hub.server_model(u) or {}).get("ready") for u in ("alice", "bob")):
        assert time.monotonic() - t0 < 300, "the servers are not back after the hub's restart"
        time.sleep(0.5)
    serving = time.monotonic()
    TIMES["hub restart to serving again (servers ready)"] = serving - t0
    # Each server reaches the restarted hub: a fresh login opens it, which the server
    # checks with the hub's API, through the proxy (docs/deploy.md promises a minute).
    for user in ("alice", "bob"):
        while (status := opened(hub, user, password)) != 200:
            assert time.monotonic() - serving < RESTART_BOUND, f"{user}'s server cannot reach the hub: {status}"
            time.sleep(1)
    TIMES["hub restart to every server answering a fresh login through the proxy"] = time.monotonic() - t0
    # The new hub knows the nodes' GPUs again at each agent's next report (an agent whose
    # posts failed meanwhile retries with backoff).
    while set(hub.api("GET", "/gpuspawner/alloc-map").json()) != set(stack_harness.WORKERS):
        assert time.monotonic() - t0 < 300, "the agents did not report to the restarted hub"
        time.sleep(0.5)
    TIMES["hub restart to both agents' GPUs known again"] = time.monotonic() - t0
    assert services_of(swarm, "alice") == [alice] and services_of(swarm, "bob") == [bob]
    after = holders(hub)
    assert after == before
    # The one other A100 goes to the next user; two are not free any more.
    r = hub.spawn("carol", {"gpu_model": A100, "gpu_count": 2})
    assert r.status_code == 409 and "at most 1 free" in r.json()["message"], r.text
    assert open_allocations(swarm) == ledger
    assert session.get(hub.url + "/user/alice/api/status", timeout=30).status_code == 200

    for user in ("alice", "bob"):
        hub.stop_server(user, timeout=120)
    assert services_of(swarm, "alice") == services_of(swarm, "bob") == []
    assert all(not users for users in holders(hub).values())
    assert open_allocations(swarm) == []


def test_a_rotated_agent_token_is_picked_up_without_a_restart(stack, swarm):
    """An admin rotates gpu-a's token: its agent's reports are refused and its GPUs go
    stale; once the node's file holds the new token, they are offered again by
    themselves, within two of the agent's intervals, and no agent was restarted.

    Guards docs/deploy.md, "Deploying on a swarm: the hub as a swarm service": "from a rotated agent
    token written to the node's file to its GPUs offered again, 1 s, with no restart"."""
    hub, state = stack
    agent = swarm.client().services.get(f"{stack_harness.STACK_NAME}_agent")
    tasks = sorted(t["ID"] for t in agent.tasks(filters={"desired-state": "running"}))

    def health() -> set[str]:
        return {d["health"] for d in hub.api("GET", "/gpuspawner/alloc-map").json()["gpu-a"].values()}

    r = hub.api("POST", "/gpuspawner/agent-tokens/gpu-a")
    assert r.status_code == 200 and r.json()["rotated"] is True
    t0 = time.monotonic()
    while health() != {"stale"}:  # the old token is refused: after agent_stale_intervals
        assert time.monotonic() - t0 < 60, f"gpu-a's GPUs did not go stale: {health()}"
        time.sleep(0.5)
    agent_stack.write_tokens(state / "agent-tokens", {"gpu-a": r.json()["token"]})
    t0 = time.monotonic()
    while health() != {"ok"}:
        assert time.monotonic() - t0 < 60, f"gpu-a's GPUs are not offered again: {health()}"
        time.sleep(0.2)
    TIMES["new token file written to the node's GPUs offered again"] = seconds = time.monotonic() - t0
    assert seconds < 2 * stack_harness.AGENT_INTERVAL, f"{seconds:.1f} s"
    assert sorted(t["ID"] for t in agent.tasks(filters={"desired-state": "running"})) == tasks
