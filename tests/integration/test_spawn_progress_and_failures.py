"""What a user sees while a spawn runs, and what is left after one fails or dies.

A real hub on the real swarm, with ``slow_spawn_timeout = 0`` so the REST API
answers at once and the progress stream shows each step. A pre-spawn hook makes
some users' servers fail on purpose: an image that no node has (the task is
rejected) or a constraint no node meets (the task waits until the timeout).
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.integration.support import hub_on, login, services_of, wait_until

A100 = "NVIDIA A100 80GB PCIe"

EXTRA_CONFIG = """
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
c.Spawner.poll_interval = 1

def _break_some(spawner):
    if spawner.user.name.startswith("broken"):
        spawner.image = "gpuspawner-test/missing:latest"
    if spawner.user.name.startswith("stuck"):
        spawner.task_start_timeout = 3
        spawner.extra_placement_spec = {"constraints": ["node.labels.nowhere == true"]}

    if spawner.user.name.startswith("stubborn"):
        # httpd as PID 1 ignores SIGTERM: the container outlives its service's
        # removal by the swarm's grace period (10 s).
        spawner.cmd = ["/bin/sh", "-c", 'p="${JUPYTERHUB_SERVICE_URL##*:}"; exec httpd -f -p "${p%%/*}" -h /']

c.Spawner.pre_spawn_hook = _break_some
"""


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    with hub_on(swarm, tmp_path_factory.mktemp("hub-progress"), 18400, EXTRA_CONFIG) as h:
        yield h


def wait_gone(hub, user: str) -> None:
    wait_until(lambda: hub.server_model(user) is None, f"{user}'s failed server still listed")


def spawn_events(hub, user: str, options: dict) -> list[dict]:
    """Ask for a server (the API answers at once) and read its progress to the end."""
    r = hub.spawn(user, options)
    assert r.status_code == 202, r.text
    return hub.progress(user)


def test_progress_shows_the_real_steps(hub, swarm):
    messages = [e.get("message", "") for e in spawn_events(hub, "nina", {"gpu_model": A100, "gpu_count": 1})]
    assert f"Reserved 1 × {A100} on gpu-b" in messages
    assert "Service created" in messages
    assert "Task running on gpu-b" in messages
    assert messages.index(f"Reserved 1 × {A100} on gpu-b") < messages.index("Service created")
    assert messages[-1].startswith("Server ready at /user/nina/")
    hub.stop_server("nina")


@pytest.mark.parametrize(
    "user, expected",
    [
        ("broken1", "The server could not start on gpu-b"),
        ("stuck1", "The server did not start within 3 s (last task state: pending"),
    ],
)
def test_failed_start_removes_the_service_and_frees_the_gpus(hub, swarm, user, expected):
    events = spawn_events(hub, user, {"gpu_model": A100, "gpu_count": 2})
    assert events[-1].get("failed"), events
    assert expected in events[-1]["message"]
    # Exactly the spawner's message: no status code, class name or traceback.
    assert events[-1]["message"].startswith("Spawn failed: " + expected)
    assert "SpawnException" not in events[-1]["message"] and "Traceback" not in events[-1]["message"]
    wait_gone(hub, user)
    assert services_of(swarm, user) == []
    # Both A100s are free again: another user gets both.
    assert spawn_events(hub, "olga", {"gpu_model": A100, "gpu_count": 2})[-1].get("ready")
    hub.stop_server("olga")


def test_a_server_that_dies_gives_its_gpus_back(hub, swarm):
    assert spawn_events(hub, "pete", {"gpu_model": A100, "gpu_count": 2})[-1].get("ready")
    (service,) = services_of(swarm, "pete")
    (container,) = swarm.client("gpu-b").containers.list(filters={"label": f"com.docker.swarm.service.id={service.id}"})
    container.kill()
    # The hub's poll sees it dead, stops the server and removes the service...
    wait_gone(hub, "pete")
    wait_until(lambda: not services_of(swarm, "pete"), "the dead server's service was not removed")
    # ...and swarm did not restart it on its own: both A100s are free again.
    assert spawn_events(hub, "olga", {"gpu_model": A100, "gpu_count": 2})[-1].get("ready")
    hub.stop_server("olga")


def test_gpus_wait_until_the_old_container_has_exited(hub, swarm):
    assert spawn_events(hub, "stubborn1", {"gpu_model": A100, "gpu_count": 2})[-1].get("ready")
    stopping = threading.Thread(target=hub.stop_server, args=("stubborn1",))
    started = time.monotonic()
    stopping.start()
    time.sleep(2)  # the service is removed by now, its container still runs
    page = login(hub, "quinn").get(hub.url + "/hub/spawn/quinn", timeout=30).text
    assert "0 of 2 free now" in page  # the A100s are not offered yet
    assert services_of(swarm, "stubborn1") == []
    stopping.join()
    assert time.monotonic() - started > 8  # the grace period was waited out
    r = hub.spawn("quinn", {"gpu_model": A100, "gpu_count": 2})
    assert r.status_code == 202, r.text
    hub.wait_ready("quinn")
