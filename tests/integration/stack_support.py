"""What the stack tests (test_stack_swarm.py, test_stack_faults_swarm.py) share: the stack
deployed once per module, and what they read of it from the swarm, the hub and the database,
as an admin would."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone

import pytest
import requests
import yaml

from devtools import stack as stack_harness
from devtools.hub import REPO

A100 = "NVIDIA A100 80GB PCIe"
INVENTORY = yaml.safe_load((REPO / "examples/local/gpus.yaml").read_text())
UUIDS = {host: [d["uuid"] for d in devices] for host, devices in INVENTORY.items()}
HUB_SERVICE = f"{stack_harness.STACK_NAME}_hub"
PROXY_SERVICE = f"{stack_harness.STACK_NAME}_proxy"
DB_SERVICE = f"{stack_harness.STACK_NAME}_postgres"
RESTART_BOUND = 60  # s from the hub (or proxy) serving again to each server answering (docs/deploy.md)
TIMES: dict[str, float] = {}  # what each step took, printed when the module's stack goes


@pytest.fixture(scope="module", name="stack")
def stack_fixture(swarm, jupyter_image, tmp_path_factory):
    """(the stack's hub client, its state directory): deployed for the module that imports it."""
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
    TIMES.clear()


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


def opened(hub, user: str, password: str) -> int | str:
    """A fresh login, then the user's server API: its status code, or what failed."""
    try:
        return login(hub, user, password).get(hub.url + f"/user/{user}/api/status", timeout=30).status_code
    except requests.RequestException as e:
        return repr(e)


def task_of(swarm, service) -> tuple[str, dict]:
    [task] = [t for t in service.tasks() if t["Status"]["State"] == "running"]
    return swarm.hostname_of(task["NodeID"]), task


def container_of(swarm, service):
    """The container of ``service``'s running task."""
    node, task = task_of(swarm, service)
    [container] = swarm.client(node).containers.list(filters={"label": f"com.docker.swarm.task.id={task['ID']}"})
    return container


def container_env(swarm, node: str, service) -> dict[str, str]:
    [container] = swarm.client(node).containers.list(filters={"label": f"com.docker.swarm.service.id={service.id}"})
    out = container.exec_run(["env"]).output.decode()
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def holders(hub) -> dict[str, list[str]]:
    """{device uuid: [user, ...]} from the hub's allocation map."""
    alloc_map = hub.api("GET", "/gpuspawner/alloc-map").json()
    return {uuid: sorted(h["user"] for h in d["holders"]) for host in alloc_map.values() for uuid, d in host.items()}


def psql(swarm, query: str, separator: str = " ") -> list[list[str]]:
    """The rows of ``query``, run with psql in the stack's database container."""
    db = container_of(swarm, swarm.client().services.get(DB_SERVICE))
    run = db.exec_run(["psql", "-U", "jupyterhub", "-d", "jupyterhub", "-At", "-F", separator, "-c", query])
    assert run.exit_code == 0, run.output
    return [line.split(separator) for line in run.output.decode().splitlines()]


def open_allocations(swarm) -> list[tuple[str, str, str]]:
    """(user, host, devices) of each allocation the ledger has open."""
    query = (
        "SELECT a.username, a.host, string_agg(d.uuid, ',' ORDER BY d.position) FROM gpuspawner_allocations a "
        "LEFT JOIN gpuspawner_allocation_devices d ON d.allocation_id = a.id WHERE a.ended_at IS NULL "
        "GROUP BY a.id, a.username, a.host ORDER BY a.username"
    )
    return [tuple(row) for row in psql(swarm, query)]  # type: ignore[misc]


def allocation_rows(swarm, user: str) -> list[tuple[str, str, float, float | None]]:
    """(end reason, devices, start, end) of each of ``user``'s rows in the ledger, as POSIX times."""
    query = (
        "SELECT a.end_reason, string_agg(d.uuid, ',' ORDER BY d.position), extract(epoch FROM a.started_at), "
        "extract(epoch FROM a.ended_at) FROM gpuspawner_allocations a LEFT JOIN gpuspawner_allocation_devices d "
        f"ON d.allocation_id = a.id WHERE a.username = '{user}' GROUP BY a.id ORDER BY a.id"
    )
    rows = psql(swarm, query, separator="|")
    return [(reason, devices, float(start), float(end) if end else None) for reason, devices, start, end in rows]


def docker_time(text: str) -> float:
    """A Docker timestamp (RFC 3339 in UTC, to the nanosecond) as a POSIX time."""
    whole, _, fraction = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp() + float("0." + (fraction or "0"))


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
    return container_of(swarm, service).exec_run(["python3", "-c", ASK_THE_HUB]).output.decode().strip()
