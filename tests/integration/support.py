"""Helpers shared by the hub tests: a hub on the test swarm, and what the swarm says."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

import requests

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
