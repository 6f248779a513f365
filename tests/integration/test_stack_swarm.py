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

import json
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

import pytest
import requests
import yaml

from devtools import agent_stack
from devtools import stack as stack_harness
from devtools.hub import REPO
from tests.integration.support import services_of

A100 = "NVIDIA A100 80GB PCIe"
INVENTORY = yaml.safe_load((REPO / "examples/local/gpus.yaml").read_text())
UUIDS = {host: [d["uuid"] for d in devices] for host, devices in INVENTORY.items()}
HUB_SERVICE = f"{stack_harness.STACK_NAME}_hub"
TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def stack(swarm, jupyter_image, tmp_path_factory):
    state = tmp_path_factory.mktemp("stack")
    try:
        hub, seconds = stack_harness.up(swarm, state)
    except stack_harness.StackError as e:
        pytest.fail(f"the stack did not come up:\n{e}\n{stack_harness.service_errors(swarm)}", pytrace=False)
    TIMES["deploy to a ready hub"] = seconds
    print(f"\nstack deployed: hub ready {seconds:.1f} s after `docker stack deploy`")
    yield hub, state
    stack_harness.down(swarm, state)
    assert stack_harness.network(swarm) is None
    print("\n" + "\n".join(f"{what}: {s:.1f} s" for what, s in TIMES.items()))


def login(hub, user: str, password: str) -> requests.Session:
    s = requests.Session()
    s.get(hub.url + "/hub/login", timeout=10)
    r = s.post(
        hub.url + "/hub/login",
        data={"username": user, "password": password, "_xsrf": s.cookies.get("_xsrf")},
        timeout=10,
    )
    r.raise_for_status()
    return s


RESTART_BOUND = 60  # s from the restarted hub serving to each server answering (docs/deploy.md)


def opened(hub, user: str, password: str) -> int | str:
    """A fresh login, then the user's server API: its status code, or what failed."""
    try:
        return login(hub, user, password).get(hub.url + f"/user/{user}/api/status", timeout=30).status_code
    except requests.RequestException as e:
        return repr(e)


def task_of(swarm, service) -> tuple[str, dict]:
    [task] = [t for t in service.tasks() if t["Status"]["State"] == "running"]
    return swarm.hostname_of(task["NodeID"]), task


def container_env(swarm, node: str, service) -> dict[str, str]:
    [container] = swarm.client(node).containers.list(filters={"label": f"com.docker.swarm.service.id={service.id}"})
    out = container.exec_run(["env"]).output.decode()
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def holders(hub) -> dict[str, list[str]]:
    """{device uuid: [user, ...]} from the hub's allocation map."""
    alloc_map = hub.api("GET", "/gpuspawner/alloc-map").json()
    return {uuid: sorted(h["user"] for h in d["holders"]) for host in alloc_map.values() for uuid, d in host.items()}


def open_allocations(swarm) -> list[tuple[str, str, str]]:
    """(user, host, devices) of each allocation the ledger has open, read with psql in
    the stack's database container."""
    db = swarm.client().services.get(f"{stack_harness.STACK_NAME}_postgres")
    node, task = task_of(swarm, db)
    [container] = swarm.client(node).containers.list(filters={"label": f"com.docker.swarm.task.id={task['ID']}"})
    query = (
        "SELECT a.username, a.host, string_agg(d.uuid, ',' ORDER BY d.position) FROM gpuspawner_allocations a "
        "LEFT JOIN gpuspawner_allocation_devices d ON d.allocation_id = a.id WHERE a.ended_at IS NULL "
        "GROUP BY a.id, a.username, a.host ORDER BY a.username"
    )
    run = container.exec_run(["psql", "-U", "jupyterhub", "-d", "jupyterhub", "-At", "-F", " ", "-c", query])
    assert run.exit_code == 0, run.output
    return [tuple(line.split(" ")) for line in run.output.decode().splitlines()]  # type: ignore[misc]


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
    node, task = task_of(swarm, services["hub"])
    assert node == task_of(swarm, services["proxy"])[0] == stack_harness.HUB_NODE
    [container] = swarm.client(node).containers.list(filters={"label": f"com.docker.swarm.task.id={task['ID']}"})
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


DB_SERVICE = f"{stack_harness.STACK_NAME}_postgres"
# What PostgreSQL writes at a start that must recover from a stop that was not clean.
NOT_CLEAN = ("database system was not properly shut down", "automatic recovery in progress")


def docker_time(text: str) -> float:
    """A container's Docker timestamp (RFC 3339 in UTC, to the nanosecond) as a POSIX time."""
    whole, _, fraction = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp() + float("0." + (fraction or "0"))


def db_containers(swarm) -> list:
    """Every container of the database's service on its node, running or not, oldest first."""
    found = swarm.client(stack_harness.DB_NODE).containers.list(
        all=True, filters={"label": f"com.docker.swarm.service.name={DB_SERVICE}"}
    )
    return sorted(found, key=lambda c: c.attrs["Created"])


def db_answers(container) -> bool:
    run = container.exec_run(["pg_isready", "-q", "-U", "jupyterhub", "-d", "jupyterhub"])
    return run.exit_code == 0


def test_a_database_restart_stops_it_cleanly_never_runs_two_and_leaves_no_server_behind(stack, swarm):
    """`docker service update --force` on the database while users spawn: the old server
    stops at its stop signal (SIGINT), at once and cleanly, before the new one starts on the
    volume; the new one starts without recovery; every spawn is answered with a server that
    runs or a refusal with its message, and a server that runs is one the hub knows, ready.

    Guards docs/deploy.md, "How a database restart behaves": "Two servers never run on the
    volume at once" and "the next start needs no recovery"; docs/reliability.md, "The
    production stack as a whole": "Every spawn meanwhile is answered with a server that runs
    and that the hub knows, or a refusal with its message", "The new server starts without
    recovery" and "Measured by the stack test, which prints the seconds from the command to the
    old server's stop and to the new server answering"."""
    hub, state = stack
    users = [f"dbr{i}" for i in range(12)]
    for user in users:
        hub.ensure_user(user)
    [old] = [c for c in db_containers(swarm) if c.status == "running"]
    answers: dict[str, tuple[int | str, str]] = {}
    running_at_once: list[int] = []
    done = threading.Event()

    def spawn_all() -> None:
        for i, user in enumerate(users):
            if done.is_set():
                break
            options = {"gpu_model": A100, "gpu_count": 1} if i % 3 == 0 else {}
            try:
                r = hub.api("POST", f"/users/{user}/server", json=options)
                answers[user] = (r.status_code, r.text)
            except requests.RequestException as e:
                answers[user] = (repr(e), "")
            time.sleep(0.5)

    def sample() -> None:  # the database's containers that run, every 0.2 s
        while not done.is_set():
            running_at_once.append(sum(c.status == "running" for c in db_containers(swarm)))
            time.sleep(0.2)

    threads = [threading.Thread(target=spawn_all), threading.Thread(target=sample)]
    for thread in threads:
        thread.start()
    t0, wall0 = time.monotonic(), time.time()
    try:
        stack_harness.docker(swarm, "service", "update", "--force", "--detach", DB_SERVICE)
        while True:
            new = [c for c in db_containers(swarm) if c.id != old.id and c.status == "running"]
            if new and db_answers(new[0]):
                break
            assert time.monotonic() - t0 < 120, f"the database is not back: {stack_harness.service_errors(swarm)}"
            time.sleep(0.2)
        back = time.monotonic() - t0
        time.sleep(3)  # a spawn or two after it is back
    finally:
        done.set()
        for thread in threads:
            thread.join()
    old.reload()
    [new] = new
    new.reload()
    stopped, started = docker_time(old.attrs["State"]["FinishedAt"]), docker_time(new.attrs["State"]["StartedAt"])
    TIMES["database restart: the old server stopped after the command"] = stopped - wall0
    TIMES["database restart: the command to the new server answering"] = back
    print(f"\ndatabase restart: spawns answered {sorted(answers.items())}")
    # SIGINT: a fast shutdown, exit 0, long before the grace (30 s) ends in a SIGKILL.
    assert old.attrs["State"]["ExitCode"] == 0, old.attrs["State"]
    assert stopped - wall0 < 15, f"the old server took {stopped - wall0:.1f} s to stop"
    assert "received fast shutdown request" in old.logs().decode()
    # One server on the volume at a time: the new one started after the old one had stopped.
    assert started >= stopped, f"the new server started {stopped - started:.1f} s before the old one stopped"
    assert max(running_at_once) == 1, running_at_once
    log = new.logs().decode()
    assert not [line for line in NOT_CLEAN if line in log], log

    # Each spawn: a server that runs, ready and known to the hub; or a refusal with its
    # message and nothing left running for it (a 500 only where no server then runs).
    deadline = time.monotonic() + 300
    for user in users:
        if user not in answers:
            continue
        status, body = answers[user]
        if status in (201, 202):
            while (model := hub.server_model(user)) is not None and not model.get("ready"):
                assert time.monotonic() < deadline, f"{user}'s spawn never ended: {model}"
                time.sleep(0.5)
        else:
            assert isinstance(status, int) and status >= 400, (user, status, body)
            assert status == 500 or json_message(body), (user, status, body)
    running = {}
    for user in users:
        model, services = hub.server_model(user), services_of(swarm, user)
        assert bool(services) == bool(model and model.get("ready")), (user, answers.get(user), model, services)
        if services:
            assert answers[user][0] in (201, 202), (user, answers[user])
            running[user] = [s.id for s in services]
    # Two reconcile rounds (60 s apart): a service the hub did not know would be stopped by now.
    time.sleep(2 * 60 + 5)
    assert {u: [s.id for s in services_of(swarm, u)] for u in users if services_of(swarm, u)} == running
    hub.stop_all_servers()
    assert all(services_of(swarm, user) == [] for user in users)
    assert open_allocations(swarm) == []


def json_message(body: str) -> str:
    """The "message" of a JSON error body, or "" (JupyterHub and gpuspawner answer with one)."""
    try:
        return str(json.loads(body).get("message") or "")
    except (ValueError, AttributeError):
        return ""


def database_sh(swarm, node: str, *args: str) -> subprocess.CompletedProcess:
    """examples/stack/database.sh on ``node``, as an admin runs it there."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "DOCKER_HOST": swarm.nodes[node].docker_url}
    run = subprocess.run(
        ["sh", str(REPO / "examples/stack/database.sh"), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    return run


ASK_THE_HUB = """
import os, urllib.error, urllib.request
request = urllib.request.Request(
    os.environ["JUPYTERHUB_API_URL"] + "/user",
    headers={"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"]},
)
try:
    print(urllib.request.urlopen(request, timeout=30).status)
except urllib.error.HTTPError as e:
    print(e.code)
"""


def hub_answers_server(swarm, service) -> str:
    """What the hub answers a server that asks who it is, with the API token its container was
    given (as the server does to check a user's login): its HTTP status."""
    node, task = task_of(swarm, service)
    [container] = swarm.client(node).containers.list(filters={"label": f"com.docker.swarm.task.id={task['ID']}"})
    run = container.exec_run(["python3", "-c", ASK_THE_HUB])
    return run.output.decode().strip()


def allocation_rows(swarm, user: str) -> list[tuple[str, str, float, float | None]]:
    """(end reason, devices, start, end) of each of ``user``'s rows in the ledger, as POSIX
    times, read with psql in the stack's database container."""
    db = swarm.client().services.get(DB_SERVICE)
    node, task = task_of(swarm, db)
    [container] = swarm.client(node).containers.list(filters={"label": f"com.docker.swarm.task.id={task['ID']}"})
    query = (
        "SELECT a.end_reason, string_agg(d.uuid, ',' ORDER BY d.position), extract(epoch FROM a.started_at), "
        "extract(epoch FROM a.ended_at) FROM gpuspawner_allocations a LEFT JOIN gpuspawner_allocation_devices d "
        f"ON d.allocation_id = a.id WHERE a.username = '{user}' GROUP BY a.id ORDER BY a.id"
    )
    run = container.exec_run(["psql", "-U", "jupyterhub", "-d", "jupyterhub", "-At", "-F", "|", "-c", query])
    assert run.exit_code == 0, run.output
    rows = []
    for line in run.output.decode().splitlines():
        reason, devices, started, ended = line.split("|")
        rows.append((reason, devices, float(started), float(ended) if ended else None))
    return rows


def test_a_backup_restored_into_a_new_database_gives_the_hub_its_state_back(stack, swarm):
    """Guards docs/backup.md: "The restarted hub finds its servers, and who holds which GPU"
    (dump, stop the hub, drop the database, load the dump, start the hub; it serves the same
    holders and open allocations); "Servers started after the backup": "JupyterHub removes its
    route from the proxy as it starts", "so the server's own requests to the hub are refused",
    "The restarted hub stops it" and "with one WARNING in the hub's log naming its user and
    server" (erin's, started after the dump: stopped within two reconcile rounds, its ledger row
    from its service's creation to its container's exit, with its end reason)."""
    hub, state = stack
    assert hub.spawn("alice", {"gpu_model": A100, "gpu_count": 1}).status_code in (201, 202)
    hub.wait_ready("alice", timeout=200)
    before, ledger = holders(hub), open_allocations(swarm)
    assert [user for user, _, _ in ledger] == ["alice"]
    db_node, _ = task_of(swarm, swarm.client().services.get(DB_SERVICE))
    dump = state / "backup.sql"
    database_sh(swarm, db_node, "backup", str(dump))
    assert dump.stat().st_mode & 0o777 == 0o600 and "gpuspawner_allocations" in dump.read_text()
    # erin starts a server after the backup: the restored database will not have it.
    assert hub.spawn("erin", {"gpu_model": A100, "gpu_count": 1}).status_code in (201, 202)
    hub.wait_ready("erin", timeout=200)
    (erin,) = services_of(swarm, "erin")
    erin_created = docker_time(erin.attrs["CreatedAt"])
    assert hub_answers_server(swarm, erin) == "200"

    stack_harness.docker(swarm, "service", "scale", f"{HUB_SERVICE}=0", timeout=180)
    restored = database_sh(swarm, db_node, "restore", str(dump))
    assert restored.stdout.strip() == f"restored from {dump}", restored.stdout  # nothing else
    stack_harness.docker(swarm, "service", "scale", f"{HUB_SERVICE}=1", "--detach")
    stack_harness.wait_serving(hub.url, 240)
    started = time.monotonic()
    while set(hub.api("GET", "/gpuspawner/alloc-map").json()) != set(stack_harness.WORKERS):
        assert time.monotonic() - started < 120, "the agents did not report to the hub"
        time.sleep(0.5)
    assert (hub.server_model("alice") or {}).get("ready")
    assert hub.api("GET", "/users/erin").status_code == 404  # JupyterHub does not know her, nor her server
    assert "Deleting stale route /user/erin/" in stack_harness.hub_log(swarm, 5000)
    assert hub_answers_server(swarm, erin) == "403"  # its API token is not in the restored database

    # Stopped within two reconcile rounds (60 s apart), with one WARNING naming her server.
    while services_of(swarm, "erin"):
        assert time.monotonic() - started < 240, "erin's server, unknown to the restored database, still runs"
        time.sleep(1)
    TIMES["restore: the restarted hub serving to erin's unknown server stopped"] = time.monotonic() - started
    while "erin" in {u for users in holders(hub).values() for u in users}:  # once her container has exited
        assert time.monotonic() - started < 300, "erin's GPU did not come back"
        time.sleep(1)
    warnings = [
        line
        for line in stack_harness.hub_log(swarm, 5000).splitlines()
        if "erin's default server" in line and "does not have" in line
    ]
    assert len(warnings) == 1 and warnings[0].startswith("[W "), warnings
    [(reason, devices, row_start, row_end)] = allocation_rows(swarm, "erin")
    assert reason == "not in the hub's database" and devices in UUIDS["gpu-b"]
    assert abs(row_start - erin_created) < 1 and row_end is not None and row_end > row_start

    assert holders(hub) == before and open_allocations(swarm) == ledger
    hub.stop_server("alice", timeout=120)
    assert open_allocations(swarm) == []
