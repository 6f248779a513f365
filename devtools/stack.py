"""examples/stack/stack.yml deployed on the local three-node swarm.

    python -m devtools.stack up      # images, secrets, labels, deploy; waits for the hub
    python -m devtools.stack down    # the stack, its servers, secrets and database removed
    python -m devtools.stack down --keep-data    # the same, but the database's volume kept

``down`` says what it removed, one line each (the database's volume included), and leaves
the test swarm as it is: one that is not up has nothing of the stack to remove.

What this machine lacks is swapped in, and only that:

* images: no registry, so the hub's and the database's images are built here
  (devtools/stack_images.py: examples/stack/Dockerfile made the debootstrap way, and
  Debian's PostgreSQL) and the servers' is devtools/jupyter_image.py's; all are
  ``docker import``-ed on the workers;
* the hub and its proxy run on worker gpu-a, not on a manager: the test swarm's manager shares this
  machine's network namespace, where a published port cannot reach a container (its
  docker_gwbridge has no address here). It talks to the manager's Docker API through the
  manager's socket, bind-mounted where the stack mounts /var/run/docker.sock;
* GPUs: the fake libnvidia-ml.so.1 and each worker's devices file (examples/local/gpus.yaml)
  are mounted into the agents, which read them through the real NVML bindings;
* files on the nodes (the agents' token files, /etc/docker) are folders of the state
  directory: the workers share this machine's file system.

Everything else is the stack file as users get it: the services, the overlay network,
the secrets (made here, kept in the state directory), the health checks and the labels
(``gpu=true`` on both workers, ``gpuspawner.db=true`` on gpu-b).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import requests
import yaml
from docker import errors as docker_errors

from . import demo, jupyter_image, stack_images
from . import swarm as swarm_harness
from .hub import Hub, HubError

REPO = Path(__file__).resolve().parents[1]
STACK_DIR = REPO / "examples" / "stack"
STACK_NAME = "gpuspawner"
NETWORK = "gpuspawner"
HUB_NODE = "gpu-a"
DB_NODE = "gpu-b"
RECONCILE_INTERVAL = 10  # s; the stack's default is 60
WORKERS = ("gpu-a", "gpu-b")
PORT = 8000
AGENT_INTERVAL = 2  # s between the agents' reports here (15 in stack.yml)
DEFAULT_STATE = REPO / "stack-state"
SECRETS = ("postgres-password", "cookie-secret", "proxy-auth-token", "admin-token", "login-password")


class StackError(swarm_harness.HarnessError):
    pass


def docker(cluster, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """The docker CLI on the manager (``docker stack`` has no API of its own)."""
    run = subprocess.run(
        ["docker", *args],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", **cluster.env()},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and run.returncode != 0:
        raise StackError(f"docker {' '.join(args)} failed ({run.returncode}): {run.stderr.strip()[-2000:]}")
    return run


def hub_url(cluster) -> str:
    """The published port, on the node the proxy runs on."""
    return f"http://{cluster.nodes[HUB_NODE].addr}:{PORT}"


def secret_values(state_dir: Path) -> dict[str, str]:
    """Each secret's value, made once and kept in the state directory (the database on
    its volume keeps the password it was created with)."""
    folder = state_dir / "secrets"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)  # as docs/deploy.md keeps them: root only
    values = {}
    for name in SECRETS:
        path = folder / name
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(secrets.token_hex(32))
        values[name] = path.read_text().strip()
    return values


def local_stack(cluster, state_dir: Path, images: dict[str, str], lib_dir: Path, gpus: Path) -> dict:
    """The example stack with this machine's stand-ins (see the module's docstring)."""
    stack = yaml.safe_load((STACK_DIR / "stack.yml").read_text())
    hub, proxy, db, agent = (stack["services"][name] for name in ("hub", "proxy", "postgres", "agent"))
    hub["image"] = proxy["image"] = agent["image"] = images["hub"]
    db["image"] = images["postgres"]
    for service in (hub, proxy):
        service["deploy"]["placement"]["constraints"] = [f"node.hostname == {HUB_NODE}"]
    socket = cluster.manager_url.removeprefix("unix://")
    hub["volumes"] = [v.replace("/var/run/docker.sock:", f"{socket}:", 1) for v in hub["volumes"]]
    # A small shared machine starts Python slowly (and vfs copies the image per container).
    hub["environment"].update(
        GPUSPAWNER_SERVER_IMAGE=images["server"],
        GPUSPAWNER_TASK_START_TIMEOUT="90",
        GPUSPAWNER_START_TIMEOUT="150",
        GPUSPAWNER_HTTP_TIMEOUT="90",
        GPUSPAWNER_RECONCILE_INTERVAL=str(RECONCILE_INTERVAL),  # the fault tests wait for two rounds
    )
    docker_etc = state_dir / "docker-etc"
    docker_etc.mkdir(parents=True, exist_ok=True)
    (docker_etc / "daemon.json").write_text((cluster.state_dir / "daemon.json").read_text())
    agent["volumes"] = [
        f"{docker_etc}:/host/etc/docker:ro",
        dict(agent["volumes"][1], source=str(state_dir / "agent-tokens")),
        {"type": "bind", "source": str(lib_dir), "target": "/opt/fakenvml", "read_only": True},
        {"type": "bind", "source": str(gpus), "target": "/opt/gpus", "read_only": True},
    ]
    agent["environment"].update(LD_LIBRARY_PATH="/opt/fakenvml", FAKE_NVML_DEVICES="/opt/gpus/{{.Node.Hostname}}.txt")
    agent["command"][agent["command"].index("--interval") + 1] = str(AGENT_INTERVAL)
    agent["deploy"]["restart_policy"]["delay"] = "2s"  # its token is written once the hub is up
    config = STACK_DIR / "jupyterhub_config.py"
    stack["configs"]["hub_config"] = {
        "name": "gpuspawner-hub-config-" + hashlib.sha256(config.read_bytes()).hexdigest()[:12],
        "file": str(config),
    }
    return stack


def _label_nodes(cluster, set_them: bool = True) -> bool:
    """The stack's node labels: gpu=true on the workers, gpuspawner.db=true on DB_NODE
    (or none of them). True when a node's labels changed."""
    changed = False
    for node in cluster.client().nodes.list():
        hostname = node.attrs["Description"]["Hostname"]
        spec = node.attrs["Spec"]
        before = dict(spec.get("Labels") or {})
        labels = {k: v for k, v in before.items() if k not in ("gpu", "gpuspawner.db")}
        if set_them and hostname in WORKERS:
            labels["gpu"] = "true"
        if set_them and hostname == DB_NODE:
            labels["gpuspawner.db"] = "true"
        if labels != before:
            node.update(dict(spec, Labels=labels))
            changed = True
    return changed


def _create_secrets(cluster, values: dict[str, str]) -> None:
    client = cluster.client()
    existing = {s.name: s for s in client.secrets.list()}
    for name, value in values.items():
        full = f"gpuspawner-{name}"
        if full in existing:
            existing[full].remove()
        client.secrets.create(name=full, data=value.encode())


def network(cluster):
    """The stack's overlay network, or None (the API's name filter also matches longer names)."""
    return next((n for n in cluster.client().networks.list(names=[NETWORK]) if n.name == NETWORK), None)


def down(cluster, state_dir: Path = DEFAULT_STATE, keep_data: bool = False) -> list[str]:
    """Remove the stack, the servers its hub started (those on its network), its secrets
    and node labels (and its database's volume unless ``keep_data``), waiting until the
    network is gone too. Returns what was removed, one line each (empty: nothing was there)."""
    client = cluster.client()
    net = network(cluster)
    removed = []
    stacked = client.services.list(filters={"label": f"com.docker.stack.namespace={STACK_NAME}"})
    if stacked:
        removed.append(f"the {STACK_NAME} stack's services: {', '.join(sorted(s.name for s in stacked))}")
    docker(cluster, "stack", "rm", STACK_NAME, check=False)
    servers = []
    for service in client.services.list(filters={"label": "gpuspawner.user"}) if net else []:
        if any(n.get("Target") == net.id for n in service.attrs["Spec"]["TaskTemplate"].get("Networks", [])):
            service.remove()
            servers.append(service.name)
    if servers:
        removed.append(f"the servers its hub started: {', '.join(sorted(servers))}")
    if net is not None:
        removed.append(f"the overlay network {NETWORK}")
    deadline = time.monotonic() + 90
    while network(cluster) or client.services.list(filters={"label": f"com.docker.stack.namespace={STACK_NAME}"}):
        if time.monotonic() > deadline:
            raise StackError(f"the {STACK_NAME} stack was not removed within 90 s")
        left = network(cluster)
        if left is not None:
            with contextlib.suppress(docker_errors.APIError):  # still in use: its containers are exiting
                left.remove()
        time.sleep(1)
    secret_names = []
    for s in client.secrets.list():
        if s.name in {f"gpuspawner-{n}" for n in SECRETS}:
            s.remove()
            secret_names.append(s.name)
    if secret_names:
        removed.append(f"the swarm secrets {', '.join(sorted(secret_names))}")
    if _label_nodes(cluster, set_them=False):
        removed.append("the node labels gpu=true and gpuspawner.db=true")
    volume = f"{STACK_NAME}_pgdata"
    for node in WORKERS:
        for found in cluster.client(node).volumes.list(filters={"name": volume}):
            if found.name != volume:  # the filter also matches longer names
                continue
            if keep_data:
                removed.append(f"(kept: the database's volume {volume} on {node})")
                continue
            _remove_when_free(found)
            removed.append(f"the database's volume {volume} on {node}: the hub's database and the GPU ledger")
    return removed


def _remove_when_free(volume, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return volume.remove()
        except docker_errors.APIError:  # its container is still exiting
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def wait_serving(url: str, timeout: float) -> float:
    """Seconds until the hub answers its API through the published port."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if requests.get(url + "/hub/api/", timeout=3).status_code == 200:
                return time.monotonic() - t0
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise StackError(f"the hub did not answer at {url} within {timeout:.0f} s")


def hub_log(cluster, lines: int = 60) -> str:
    """The end of the hub service's log (without the proxy's lines)."""
    out = docker(cluster, "service", "logs", "--raw", f"{STACK_NAME}_hub", check=False)
    return "\n".join([x for x in (out.stdout + out.stderr).splitlines() if "ConfigProxy" not in x][-lines:])


def client_hub(cluster, state_dir: Path) -> Hub:
    """devtools.hub.Hub's REST calls, on the stack's hub with its admin token; its
    log_tail() is the hub service's log."""
    hub = Hub(state_dir)
    hub.url, hub.token = hub_url(cluster), secret_values(state_dir)["admin-token"]
    hub.log_tail = lambda lines=60: hub_log(cluster, lines)  # type: ignore[method-assign]
    return hub


def up(cluster, state_dir: Path = DEFAULT_STATE, timeout: float = 300) -> tuple[Hub, float]:
    """Deploy the stack afresh and wait for a ready hub with both agents reporting;
    return (the hub's REST client, seconds from ``docker stack deploy`` to a ready hub)."""
    state_dir = Path(state_dir).resolve()
    images = {"server": jupyter_image.ensure_on(cluster), **stack_images.ensure_on(cluster)}
    for line in down(cluster, state_dir):  # an earlier stack's, its database too: a fresh start
        print(f"removed first: {line}", file=sys.stderr)
    lib_dir, gpus = demo._agent_files(state_dir)
    _create_secrets(cluster, secret_values(state_dir))
    _label_nodes(cluster)
    (state_dir / "agent-tokens").mkdir(parents=True, exist_ok=True)  # the agents' bind source
    stack_file = state_dir / "stack.yml"
    stack_file.write_text(yaml.safe_dump(local_stack(cluster, state_dir, images, lib_dir, gpus)))
    t0 = time.monotonic()
    docker(cluster, "stack", "deploy", "--resolve-image", "never", "-c", str(stack_file), STACK_NAME)
    hub = client_hub(cluster, state_dir)
    try:
        wait_serving(hub.url, timeout)
    except StackError as e:
        raise StackError(f"{e}: {json.dumps(service_errors(cluster))}\n{hub_log(cluster)}") from None
    ready = time.monotonic() - t0
    demo._issue_tokens(hub, list(WORKERS), state_dir / "agent-tokens")
    docker(cluster, "service", "update", "--detach", "--force", f"{STACK_NAME}_agent")
    deadline = time.monotonic() + 90
    while set(hub.api("GET", "/gpuspawner/alloc-map").json()) != set(WORKERS):
        if time.monotonic() > deadline:
            raise StackError(f"the agents did not report within 90 s: {json.dumps(service_errors(cluster))}")
        time.sleep(1)
    return hub, ready


def service_errors(cluster) -> dict[str, list[str]]:
    """Each stack service's task errors, for a message when something does not start."""
    out: dict[str, list[str]] = {}
    for service in cluster.client().services.list(filters={"label": f"com.docker.stack.namespace={STACK_NAME}"}):
        out[service.name] = [t["Status"].get("Err", t["Status"]["State"]) for t in service.tasks()][-5:]
    return out


def guide(cluster, state_dir: Path, url: str) -> str:
    """What an admin of the running stack needs next: where to log in, the secrets' files,
    which Docker API to talk to, the backup and restore, and how to take it down."""
    folder = state_dir / "secrets"
    password = secret_values(state_dir)["login-password"]
    db_socket = cluster.nodes[DB_NODE].docker_url
    return "\n".join(
        [
            f"log in:    {url}  any user name, password {password} ('admin' is an admin)",
            f"secrets:   {folder}/ (readable by root only; admin-token for the gpuspawner command)",
            f"admin:     .venv/bin/gpuspawner --hub-url {url} --token-file {folder}/admin-token alloc-map",
            f"swarm:     DOCKER_HOST={cluster.manager_url} docker stack services {STACK_NAME}",
            f"backup:    DOCKER_HOST={db_socket} examples/stack/database.sh backup {state_dir}/backup.sql",
            f"restore:   DOCKER_HOST={cluster.manager_url} docker service scale {STACK_NAME}_hub=0",
            f"           DOCKER_HOST={db_socket} examples/stack/database.sh restore {state_dir}/backup.sql",
            f"           DOCKER_HOST={cluster.manager_url} docker service scale {STACK_NAME}_hub=1",
            "down:      python -m devtools.stack down   (make demo-down also stops the swarm)",
        ]
    )


def stack_down(state_dir: Path, keep_data: bool = False) -> int:
    """``down`` from the command line: on the test swarm as it is (never started for this),
    saying what was removed."""
    cluster, problems = swarm_harness.status()
    if cluster is None or problems:
        why = "; ".join(problems) or "no cluster"
        print(f"the test swarm is not up ({why}): nothing of the {STACK_NAME} stack was removed")
        return 0
    removed = down(cluster, state_dir, keep_data=keep_data)
    print("\n".join(f"removed {line}" if not line.startswith("(") else line for line in removed) or "nothing to remove")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.stack", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    parser.add_argument("--keep-data", action="store_true", help="down: keep the database's volume")
    args = parser.parse_args(argv)
    try:
        if args.command == "down":
            return stack_down(args.state_dir, args.keep_data)
        cluster = swarm_harness.up()
        hub, seconds = up(cluster, args.state_dir)
        print(f"hub ready in {seconds:.0f} s\n" + guide(cluster, args.state_dir.resolve(), hub.url))
    except (swarm_harness.HarnessError, HubError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
