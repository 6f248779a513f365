"""GPUSwarmSpawner end to end: a real JupyterHub (with its proxy) spawning on the
real three-node test swarm, driven through the hub's REST API and login form.

What the tests check comes from the swarm itself (service specs, tasks, and the
environment of the container on its node), never from the spawner's own word.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time

import pytest
import yaml

from devtools.hub import REPO
from gpuspawner.cluster.cluster import NODES_MAX_AGE
from tests.integration.support import hub_on, login, services_of, spawn_ready

A100 = "NVIDIA A100 80GB PCIe"
GTX = "NVIDIA GeForce GTX 1070"
INVENTORY = yaml.safe_load((REPO / "examples/local/gpus.yaml").read_text())
UUIDS = {host: [d["uuid"] for d in devices] for host, devices in INVENTORY.items()}


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    with hub_on(swarm, tmp_path_factory.mktemp("hub")) as h:
        yield h


def running_node(swarm, service) -> str:
    tasks = [t for t in service.tasks() if t["Status"]["State"] == "running"]
    assert len(tasks) == 1, service.tasks()
    return swarm.hostname_of(tasks[0]["NodeID"])


def container_env(swarm, node: str, service) -> dict[str, str]:
    """The environment the server's process really has, read inside its container."""
    client = swarm.client(node)
    containers = client.containers.list(filters={"label": f"com.docker.swarm.service.id={service.id}"})
    assert len(containers) == 1
    out = containers[0].exec_run(["env"]).output.decode()
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_model_request_lands_on_its_node_with_its_uuids(hub, swarm):
    spawn_ready(hub, "alice", {"gpu_model": A100, "gpu_count": 1})
    (service,) = services_of(swarm, "alice")
    assert running_node(swarm, service) == "gpu-b"
    env = container_env(swarm, "gpu-b", service)
    assert env["NVIDIA_VISIBLE_DEVICES"] == UUIDS["gpu-b"][0]
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    spec = service.attrs["Spec"]
    constraints = spec["TaskTemplate"]["Placement"]["Constraints"]
    assert "node.role == worker" in constraints  # the admin's own constraint is kept
    assert "node.hostname==gpu-b" in constraints
    assert spec["Labels"]["gpuspawner.devices"] == UUIDS["gpu-b"][0]
    # The hub reaches the server at its node's address, on a port of its own.
    model = hub.server_model("alice")
    assert model["url"] == "/user/alice/"
    hub.stop_server("alice")
    assert services_of(swarm, "alice") == []


def test_cpu_only_server_sees_no_gpu(hub, swarm):
    """Guards docs/security.md, "A user's server": "a CPU-only server gets void, even from a CUDA image
    that says all"."""
    spawn_ready(hub, "bob", {})
    (service,) = services_of(swarm, "bob")
    node = running_node(swarm, service)
    assert node in ("gpu-a", "gpu-b")  # the admin's node.role == worker
    env = container_env(swarm, node, service)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "NVIDIA_DRIVER_CAPABILITIES" not in env
    constraints = service.attrs["Spec"]["TaskTemplate"]["Placement"]["Constraints"]
    assert constraints == ["node.role == worker"]
    hub.stop_server("bob")


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"gpu_model": "NVIDIA H100"}, f"choose one of: {A100}, {GTX}"),
        ({"gpu_model": A100, "gpu_count": -1}, "gpu_count must be a whole number from 0"),
        ({"gpu_model": A100, "gpu_count": "1"}, "gpu_count must be a whole number"),
        ({"gpu_model": GTX, "gpu_count": 3}, "the limit is 2 per user"),
        ({"gpu_model": A100, "image": "evil"}, "Unknown option(s) 'image'"),
        ({"gpu_model": A100, "gpu_host": "gpu-b"}, "Choosing a host (gpu_host) is not enabled"),
        ({"gpu_model": ["x"]}, "Unknown GPU model 'x' in gpu_model's list"),
    ],
)
def test_bad_options_are_refused_and_create_nothing(hub, swarm, options, expected):
    r = hub.spawn("mallory", options)
    assert r.status_code == 400, r.text
    assert expected in r.json()["message"]
    assert services_of(swarm, "mallory") == []
    assert hub.server_model("mallory") is None


def test_two_users_racing_for_the_last_gpu(hub, swarm):
    spawn_ready(hub, "carol", {"gpu_model": A100, "gpu_count": 1})
    for user in ("dave", "erin"):
        hub.ensure_user(user)
    results = {}

    def race(user):
        results[user] = hub.api("POST", f"/users/{user}/server", json={"gpu_model": A100, "gpu_count": 1})

    threads = [threading.Thread(target=race, args=(u,)) for u in ("dave", "erin")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results.values())
    assert codes[0] in (201, 202) and codes[1] == 409, {u: r.text for u, r in results.items()}
    (winner,) = [u for u, r in results.items() if r.status_code in (201, 202)]
    (loser,) = [u for u, r in results.items() if r.status_code == 409]
    assert f"No {A100} is free right now (0 of 2 free)" in results[loser].json()["message"]
    hub.wait_ready(winner)
    assert services_of(swarm, loser) == []
    held = [
        s.attrs["Spec"]["Labels"]["gpuspawner.devices"]
        for s in services_of(swarm, "carol") + services_of(swarm, winner)
    ]
    assert sorted(held) == sorted(UUIDS["gpu-b"])

    # Stopping a server frees its GPU for the next user.
    hub.stop_server(winner)
    spawn_ready(hub, loser, {"gpu_model": A100, "gpu_count": 1})
    for user in ("carol", loser):
        hub.stop_server(user)


def test_several_gpus_come_from_one_host(hub, swarm):
    spawn_ready(hub, "frank", {"gpu_model": GTX, "gpu_count": 2})
    (service,) = services_of(swarm, "frank")
    assert running_node(swarm, service) == "gpu-a"
    env = container_env(swarm, "gpu-a", service)
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS["gpu-a"][:2])
    r = hub.spawn("george", {"gpu_model": GTX, "gpu_count": 2})
    assert r.status_code == 409
    assert f"2 × {GTX} requested, at most 1 free on any single host" in r.json()["message"]
    hub.stop_server("frank")


def test_spawn_form_shows_free_counts_and_offers_full_models_to_wait_for(hub, swarm):
    spawn_ready(hub, "holly", {"gpu_model": A100, "gpu_count": 2})
    page = login(hub, "ivan").get(hub.url + "/hub/spawn/ivan", timeout=30).text
    assert "0 of 2 free now" in page and "3 of 3 free now, up to 3 on one host" in page
    a100_input = re.search(r"<input[^>]*value=\"" + re.escape(A100) + r"\"[^>]*>", page, re.S).group(0)
    gtx_input = re.search(r"<input[^>]*value=\"" + re.escape(GTX) + r"\"[^>]*>", page, re.S).group(0)
    assert "disabled" not in a100_input and "disabled" not in gtx_input  # none free: it can be waited for
    assert "No GPU (CPU only)" in page
    # The count choice stops at the per-user limit (2), though 3 GTX are free.
    assert '<option value="2">' in page and '<option value="3">' not in page
    hub.stop_server("holly")


def test_form_submission_spawns_what_was_chosen(hub, swarm):
    s = login(hub, "judy")
    r = s.post(
        hub.url + "/hub/spawn/judy",
        data={"gpu_model": GTX, "gpu_count": "1", "_xsrf": s.cookies.get("_xsrf")},
        timeout=60,
    )
    assert r.status_code == 200
    assert r.url in (hub.url + "/hub/spawn-pending/judy", hub.url + "/user/judy/")
    hub.wait_ready("judy")
    # The user reaches the server itself, through the proxy, and it has the GPU.
    page = s.get(hub.url + "/user/judy/", timeout=30)
    assert page.status_code == 200
    assert f"NVIDIA_VISIBLE_DEVICES={UUIDS['gpu-a'][0]}" in page.text
    # Her home page says which GPU she got.
    home = " ".join(s.get(hub.url + "/hub/home", timeout=30).text.split())
    assert "Your GPUs" in home and f"{GTX} on gpu-a" in home
    assert f'<code class="user-select-all">{UUIDS["gpu-a"][0]}</code>: the whole GPU' in home
    (service,) = services_of(swarm, "judy")
    assert container_env(swarm, "gpu-a", service)["NVIDIA_VISIBLE_DEVICES"] == UUIDS["gpu-a"][0]
    hub.stop_server("judy")


def test_hub_restart_keeps_existing_allocations(hub, swarm):
    spawn_ready(hub, "kate", {"gpu_model": A100, "gpu_count": 2})
    (service,) = services_of(swarm, "kate")
    hub.stop(signal.SIGTERM)
    hub.start()
    # The server survived and the new hub still knows its GPUs are taken.
    assert hub.server_model("kate")["ready"]
    assert [s.id for s in services_of(swarm, "kate")] == [service.id]
    r = hub.spawn("leo", {"gpu_model": A100, "gpu_count": 1})
    assert r.status_code == 409, r.text
    assert "0 of 2 free" in r.json()["message"]
    hub.stop_server("kate")
    spawn_ready(hub, "leo", {"gpu_model": A100, "gpu_count": 1})
    hub.stop_server("leo")


def set_availability(swarm, hostname: str, availability: str) -> None:
    (node,) = swarm.client().nodes.list(filters={"name": hostname})
    spec = dict(node.attrs["Spec"], Availability=availability)
    node.update(spec)
    time.sleep(NODES_MAX_AGE)  # the hub reads node status at most this often


@pytest.mark.parametrize("availability", ["drain", "pause"])
def test_gpus_of_drained_or_paused_nodes_are_not_offered(hub, swarm, availability):
    set_availability(swarm, "gpu-b", availability)
    try:
        r = hub.spawn("nick", {"gpu_model": A100, "gpu_count": 1})
        assert r.status_code == 409, r.text
        assert f"No {A100} is free right now (0 of 2 free)" in r.json()["message"]
        assert services_of(swarm, "nick") == []
        page = login(hub, "nick").get(hub.url + "/hub/spawn/nick", timeout=30).text
        assert "0 of 2 free now (2 on hosts that are down, drained or paused)" in page
    finally:
        set_availability(swarm, "gpu-b", "active")
    # Back in service: offered again.
    spawn_ready(hub, "nick", {"gpu_model": A100, "gpu_count": 1})
    hub.stop_server("nick")


def metric(hub, name: str, **labels) -> float:
    """One sample from the hub's /metrics (Prometheus text format)."""
    text = hub.api("GET", "/../metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_follow_spawns_and_refusals(hub, swarm):
    # One series per model by default (gpu_metrics_per_host adds the host label).
    devices = [
        line for line in hub.api("GET", "/../metrics").text.splitlines() if line.startswith("gpuspawner_devices{")
    ]
    assert devices and not any('host="' in line for line in devices)
    free_before = metric(hub, "gpuspawner_devices_free", model=A100)
    granted = metric(hub, "gpuspawner_allocations_granted_total", model=A100)
    refused = metric(hub, "gpuspawner_allocations_refused_total", reason="capacity")
    decisions = metric(hub, "gpuspawner_allocation_seconds_count")
    assert free_before == 2 and metric(hub, "gpuspawner_devices", model=A100) == 2
    spawn_ready(hub, "quinn", {"gpu_model": A100, "gpu_count": 2})
    assert metric(hub, "gpuspawner_devices_free", model=A100) == 0
    assert metric(hub, "gpuspawner_allocated_share", model=A100) == 2
    assert metric(hub, "gpuspawner_allocations_granted_total", model=A100) == granted + 1
    r = hub.spawn("rita", {"gpu_model": A100})
    assert r.status_code == 409
    assert metric(hub, "gpuspawner_allocations_refused_total", reason="capacity") == refused + 1
    assert metric(hub, "gpuspawner_allocation_seconds_count") == decisions + 2
    hub.stop_server("quinn")
    assert metric(hub, "gpuspawner_devices_free", model=A100) == 2


def test_the_readme_rest_example_runs_as_written_with_a_token_made_as_readme_says(hub, swarm):
    """Guards docs/tutorial.md, "Through the REST API": "Log in as `alice`, make a token at"
    and its curl command, with the hub's address for the demo's: the page it names is
    there, and the API it calls makes a server."""
    text = (REPO / "docs" / "tutorial.md").read_text()
    block = re.search(r"```sh\n(curl -X POST .*?/hub/api/users/alice/server)\n```", text, re.S)[1]
    session = login(hub, "alice")
    assert session.get(hub.url + "/hub/token", timeout=30).status_code == 200
    made = session.post(
        hub.url + "/hub/api/users/alice/tokens",
        json={"note": "README example"},
        headers={"X-XSRFToken": session.cookies.get("_xsrf")},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    command = block.replace("\\\n", " ").replace("http://127.0.0.1:8000", hub.url)
    out = subprocess.run(
        ["bash", "-c", command + " -s -o /dev/null -w '%{http_code}'"],
        env={"PATH": "/usr/bin:/bin", "TOKEN": made.json()["token"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout in ("201", "202"), (out.stdout, out.stderr)
    hub.wait_ready("alice")
    (service,) = services_of(swarm, "alice")
    env = container_env(swarm, running_node(swarm, service), service)
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS["gpu-b"])  # 2 × A100, as the example asks
    hub.stop_server("alice")


def test_a_form_refused_for_none_free_is_one_info_line_in_the_hubs_log(hub, swarm):
    """JupyterHub logs a failed form spawn at ERROR, three times, one with a traceback;
    "none free" is an answer, so the hub's log has it as one INFO line of gpuspawner's with
    what the user was told, and the request's line (409) at WARNING."""
    set_availability(swarm, "gpu-b", "drain")
    try:
        s = login(hub, "olga")
        start = hub.log_path.stat().st_size
        r = s.post(
            hub.url + "/hub/spawn/olga",
            data={"gpu_model": A100, "gpu_count": "1", "_xsrf": s.cookies.get("_xsrf")},
            timeout=60,
        )
        assert f"No {A100} is free right now" in r.text
        with open(hub.log_path, "rb") as f:
            f.seek(start)
            log = f.read().decode(errors="replace")
    finally:
        set_availability(swarm, "gpu-b", "active")
    lines = [line for line in log.splitlines() if "gpuspawner: olga refused (gpu_unavailable, 409): " in line]
    assert len(lines) == 1 and lines[0].startswith("[I ") and f"No {A100} is free right now" in lines[0], log
    assert "Failed to spawn single-user server with form" not in log, log
    (request,) = [x for x in log.splitlines() if re.search(r"\] 409 POST /hub/spawn/olga ", x)]
    assert request.startswith("[W "), log
    errors = [x for x in log.splitlines() if x.startswith("[E ")]
    assert "Traceback" not in log and errors == [], log
