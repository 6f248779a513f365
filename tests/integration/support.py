"""Helpers shared by the hub tests: a hub on the test swarm, and what the swarm says."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from devtools import agent_stack, fakenvml
from devtools.hub import Hub, free_port_block


@contextlib.contextmanager
def hub_on(swarm, state_dir, port_from: int = 18000, extra_config: str = "", env: dict | None = None):
    """A real hub (examples/local config) on the test swarm; its services go with it."""
    hub = Hub(
        state_dir,
        port=free_port_block(port_from),
        extra_config=extra_config,
        env={"GPUSPAWNER_DOCKER_URL": swarm.manager_url, **(env or {})},
    )
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()
        for service in services_of_hub(swarm, hub):
            service.remove()


def gpu_b() -> list[dict]:
    """gpu-b's two A100s as the fake NVML lists them (tests/integration/test_agents_on_nodes.py)."""
    from tests.integration.test_agents_on_nodes import GPU_B  # noqa: PLC0415 - a test module's table

    return GPU_B


class Node:
    """gpu-b's devices file: who runs on which GPU, and how busy each GPU is."""

    def __init__(self, path):
        self.path = path
        self.util = {d["uuid"]: 0 for d in gpu_b()}
        self.procs: dict[str, list[dict]] = {d["uuid"]: [] for d in gpu_b()}
        self.write()

    def write(self) -> None:
        devices = [dict(d, util_gpu=self.util[d["uuid"]], processes=self.procs[d["uuid"]]) for d in gpu_b()]
        fakenvml.write_devices(self.path, devices)

    def run(self, uuid: str, pid: int, used_mib: int = 900) -> None:
        self.procs[uuid].append({"pid": pid, "used_mib": used_mib})
        self.write()

    def busy(self, uuid: str, util: int) -> None:
        self.util[uuid] = util
        self.write()

    def clear(self) -> None:
        for uuid in self.util:
            self.util[uuid], self.procs[uuid] = 0, []
        self.write()


@contextlib.contextmanager
def hub_with_agents(swarm, work, nodes: dict[str, list[dict]], port_from: int, extra_config: str = "", interval=1.0):
    """A hub whose GPUs are what gpuspawner-agent on each of ``nodes`` reports (each
    node's fake NVML devices, its own agent token, examples/agent-stack.yml), once every
    agent has reported: (hub, the folder of the nodes' devices files, HOST.txt)."""
    lib_dir = fakenvml.build(work / "lib").parent
    gpus = work / "gpus"
    gpus.mkdir()
    for host, devices in nodes.items():
        fakenvml.write_devices(gpus / f"{host}.txt", devices)
    env = {"GPUSPAWNER_INVENTORY_SOURCE": "agent"}  # no shared agent token: each node has its own
    with hub_on(swarm, work / "hub", port_from=port_from, extra_config=extra_config, env=env) as hub:
        tokens = {h: hub.api("POST", f"/gpuspawner/agent-tokens/{h}").json()["token"] for h in nodes}
        agent_stack.write_tokens(work / "tokens", tokens)
        hub_api = f"http://{swarm.manager_addr}:{hub.port + 81}/"  # the hub's own port, on the bridge
        stack = agent_stack.local_stack(
            hub_api, lib_dir, str(gpus / "{{.Node.Hostname}}.txt"), swarm.image, work / "tokens", interval=interval
        )
        with agent_stack.deployed(swarm, stack, dict.fromkeys(nodes, "true"), work):
            reported = lambda: set(hub.api("GET", "/gpuspawner/alloc-map").json()) == set(nodes)  # noqa: E731
            wait_until(reported, "the agents did not report", timeout=90)
            yield hub, gpus


@contextlib.contextmanager
def hub_with_agent_on_gpu_b(
    swarm, work, port_from: int, extra_config: str = "", env: dict | None = None, agent_args: tuple[str, ...] = ()
):
    """A hub whose GPUs are what gpuspawner-agent on gpu-b reports (examples/agent-stack.yml,
    every second), reading real pynvml over the fake libnvidia-ml.so.1 and tracing GPU
    processes to containers through gpu-b's /proc and dockerd: (hub, gpu-b's Node).
    ``agent_args``: more of the agent's options."""
    lib_dir = fakenvml.build(work / "lib").parent
    gpus = work / "gpus"
    gpus.mkdir()
    node = Node(gpus / "gpu-b.txt")
    env = {"GPUSPAWNER_INVENTORY_SOURCE": "agent", **(env or {})}
    with hub_on(swarm, work / "hub", port_from=port_from, extra_config=extra_config, env=env) as hub:
        token = hub.api("POST", "/gpuspawner/agent-tokens/gpu-b").json()["token"]
        agent_stack.write_tokens(work / "tokens", {"gpu-b": token})
        sockets = str(swarm.run_dir / "{{.Node.Hostname}}.sock")  # each node's own dockerd
        stack = agent_stack.local_stack(
            f"http://{swarm.manager_addr}:{hub.port + 81}/",
            lib_dir,
            str(gpus / "{{.Node.Hostname}}.txt"),
            swarm.image,
            work / "tokens",
            interval=1.0,
            docker_sockets=sockets,
            args=agent_args,
        )
        with agent_stack.deployed(swarm, stack, {"gpu-b": "true"}, work):
            wait_until(lambda: "gpu-b" in hub.api("GET", "/gpuspawner/alloc-map").json(), "no report", timeout=90)
            yield hub, node


def server_of(swarm, user: str) -> tuple[str, int]:
    """The device the user's server holds, and the node PID of its container's process."""
    [service] = services_of(swarm, user)
    [uuid] = service.attrs["Spec"]["Labels"]["gpuspawner.devices"].split(",")
    name = service.attrs["Spec"]["Name"]
    client = swarm.client("gpu-b")
    wait_until(
        lambda: client.containers.list(filters={"label": f"com.docker.swarm.service.name={name}"}), "no container"
    )
    [container] = client.containers.list(filters={"label": f"com.docker.swarm.service.name={name}"})
    return uuid, container.attrs["State"]["Pid"]


def services_of_hub(swarm, hub: Hub) -> list:
    """The gpuspawner services this hub created (their servers call its API port).
    Other test sessions share the swarm: their hubs' servers are not this one's to remove."""
    mine = f":{hub.port + 81}/"
    return [
        s
        for s in swarm.client().services.list(filters={"label": "gpuspawner.devices"})
        if any(
            e.startswith("JUPYTERHUB_API_URL=") and mine in e
            for e in s.attrs["Spec"]["TaskTemplate"]["ContainerSpec"].get("Env") or []
        )
    ]


def services_of(swarm, user: str) -> list:
    return swarm.client().services.list(filters={"label": f"gpuspawner.user={user}"})


def service_gpus(service) -> list[str]:
    """The devices a service's spec gives its container (NVIDIA_VISIBLE_DEVICES; none for void)."""
    env = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"].get("Env") or []
    visible = next((e.split("=", 1)[1] for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")), "void")
    return [] if visible == "void" else visible.split(",")


def spawn_ready(hub: Hub, user: str, options: dict) -> None:
    r = hub.spawn(user, options)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user)


def wait_until(condition, message: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.2)


def login(hub: Hub, user: str) -> requests.Session:
    s = requests.Session()
    s.get(hub.url + "/hub/login", timeout=10)
    r = s.post(
        hub.url + "/hub/login",
        data={"username": user, "password": "x", "_xsrf": s.cookies.get("_xsrf")},
        timeout=10,
    )
    r.raise_for_status()
    return s


def admin_cli(hub: Hub, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
    """``gpuspawner ARGS`` against the hub, with its admin token (or ``token``)."""
    return subprocess.run(
        [sys.executable, "-m", "gpuspawner.cli", "--hub-url", hub.url, *args],
        env={**os.environ, "JUPYTERHUB_API_TOKEN": token or hub.token},
        capture_output=True,
        text=True,
    )


class Sampler(threading.Thread):
    """Every ``every`` seconds: which GPUs each running container on ``node`` was
    given (its NVIDIA_VISIBLE_DEVICES), as the node's own daemon lists them."""

    def __init__(self, swarm, node: str, every: float = 0.2):
        super().__init__(daemon=True)
        self.client = swarm.client(node)
        self.every = every
        self.samples: list[tuple[float, dict[str, list[str]]]] = []  # (time, {container name: uuids})
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            seen = {}
            try:
                for c in self.client.containers.list():
                    env = dict(item.split("=", 1) for item in c.attrs["Config"]["Env"] if "=" in item)
                    visible = env.get("NVIDIA_VISIBLE_DEVICES", "void")
                    if visible != "void":
                        seen[c.name] = visible.split(",")
                self.samples.append((time.monotonic(), seen))
            except Exception:  # noqa: BLE001 - a container gone between list and inspect: next sample
                pass
            self.done.wait(self.every)

    def double_booked(self) -> list[tuple[float, dict[str, list[str]]]]:
        """The samples in which one GPU was in two containers."""
        return [
            (at, seen)
            for at, seen in self.samples
            if len(us := [u for uuids in seen.values() for u in uuids]) != len(set(us))
        ]


# -- quotas (tests/integration/test_quotas_*.py) -----------------------------------------


@contextlib.contextmanager
def hub_with_quota(swarm, work, image: str, quotas: dict, port_from: int):
    """A hub with ``gpu_quotas``, the group lab-a (ada), its reclaim loop every half second
    and its own SQLite ledger (``hub.db_url``), gpu-b's GPUs reported by its agent, and the
    servers in ``image`` (one with the stop-notice extension)."""
    db_url = f"sqlite:///{work / 'ledger.sqlite'}"
    config = (
        f"c.GPUSwarmSpawner.gpu_quotas = {quotas!r}\n"
        "c.GPUSwarmSpawner.gpu_reclaim_interval = 0.5\n"
        f"c.GPUSwarmSpawner.gpu_db_url = {db_url!r}\n"
        "c.JupyterHub.load_groups = {'lab-a': {'users': ['ada']}}\n"
    )
    env = {"GPUSPAWNER_IMAGE": image}
    with hub_with_agent_on_gpu_b(swarm, work, port_from=port_from, extra_config=config, env=env) as (h, _node):
        h.db_url = db_url
        yield h


def notices_of(hub: Hub, user: str) -> list[dict]:
    """``user``'s notices (GET /hub/api/gpuspawner/notices, logged in as them)."""
    r = login(hub, user).get(hub.url + "/hub/api/gpuspawner/notices", timeout=10)
    r.raise_for_status()
    return r.json()["notices"]


def log_of(hub: Hub) -> str:
    """The end of the hub's log, without its GET 200 lines."""
    lines = hub.log_path.read_text(errors="replace").splitlines()
    return "\n".join(x for x in lines if " 200 GET " not in x)[-6000:]


def ask_and_see_who_is_told(hub: Hub, user: str, options: dict, borrowers) -> tuple:
    """``user`` asks (in a thread: the hub answers once its slow-spawn timeout has passed)
    and waits until one of ``borrowers`` is told: (the answer to come, when asked, when
    told (monotonic), each borrower's notices)."""
    hub.ensure_user(user)
    asking = ThreadPoolExecutor(max_workers=1)
    t_ask = time.monotonic()
    asked = asking.submit(hub.spawn, user, options)
    asking.shutdown(wait=False)
    told: dict[str, list[dict]] = {}

    def someone_told() -> bool:
        told.update({u: notices_of(hub, u) for u in borrowers})
        return any(told.values())

    wait_until(someone_told, f"no borrower was told:\n{log_of(hub)}", timeout=10)
    return asked, t_ask, time.monotonic(), told


def wait_stopped_after(swarm, hub: Hub, user: str, stop_at, slack: float, timeout: float) -> float:
    """Wait until ``user``'s server is gone from the swarm, and then from the hub, never
    before the notice's ``stop_at`` (less ``slack`` seconds); when it went (monotonic)."""
    from datetime import datetime, timedelta, timezone  # noqa: PLC0415 - only these tests need it

    def stopped() -> bool:
        if services_of(swarm, user):
            return False
        now = datetime.now(timezone.utc)
        assert now >= stop_at - timedelta(seconds=slack), f"{user}'s server went at {now}, the notice said {stop_at}"
        return True

    wait_until(stopped, f"{user}'s server was not stopped:\n{log_of(hub)}", timeout=timeout)
    went = time.monotonic()
    wait_until(lambda: hub.server_model(user) is None, f"the hub still lists {user}'s server", timeout=10)
    return went
