"""gpuspawner's JupyterLab extension on the real swarm: a real server from the Jupyter
image (which installs the extension's wheel, devtools/jupyter_image.py), its status
bar in headless Chromium, and the hub's endpoint asked with the server's own token
(read from inside its container). gpu-b's GPUs come from gpuspawner-agent over the fake
NVML, whose process list a test changes.

Guards docs/jupyterlab.md, "The GPUs in JupyterLab's status bar": "These promises are checked in a
real browser on the test swarm"."""

from __future__ import annotations

import time

import pytest
import requests

from tests.integration.support import gpu_b, hub_with_agent_on_gpu_b, login, server_of, services_of
from tests.integration.test_browser import SPAWN_TIMEOUT, browsers, by, log_in, shots, wait  # noqa: F401 - fixtures

A100 = gpu_b()[0]["name"]


@pytest.fixture(scope="module")
def lab(swarm, jupyter_image, tmp_path_factory):
    """A hub with lena's A100 server running JupyterLab: (hub, gpu-b, her device, the
    node PID of her container, the container)."""
    work = tmp_path_factory.mktemp("lab-status")
    config = (
        "c.GPUSwarmSpawner.gpu_idle_timeout = 3600\n"  # limits to show (never reached here)
        "c.GPUSwarmSpawner.gpu_max_hours = 8\n"
        f'c.GPUSwarmSpawner.gpu_sharing = {{"{A100}": {{"quantum": 0.25}}}}\n'
    )
    env = {"GPUSPAWNER_IMAGE": jupyter_image}
    with hub_with_agent_on_gpu_b(swarm, work, port_from=21400, extra_config=config, env=env) as (hub, node):
        r = hub.spawn("lena", {"gpu_model": A100})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("lena", timeout=SPAWN_TIMEOUT)
        uuid, pid = server_of(swarm, "lena")
        [service] = services_of(swarm, "lena")
        label = f"com.docker.swarm.service.name={service.name}"
        [container] = swarm.client("gpu-b").containers.list(filters={"label": label})
        yield hub, node, uuid, pid, container
        hub.stop_all_servers()


def env_in(container, name: str) -> str:
    """A variable as the server's own processes see it."""
    code, out = container.exec_run(["printenv", name])
    assert code == 0, out
    return out.decode().strip()


def test_the_status_bar_shows_the_servers_gpu_and_follows_its_memory_use(lab, browsers, shots):  # noqa: F811
    """Guards docs/jupyterlab.md, "The GPUs in JupyterLab's status bar": "the item's UUIDs against the
    container's NVIDIA_VISIBLE_DEVICES, the item following the fake NVML's memory and utilization,
    the idle limit"."""
    hub, node, uuid, pid, container = lab
    visible = env_in(container, "NVIDIA_VISIBLE_DEVICES")
    assert visible == uuid
    driver = browsers(width=1200, height=800).driver
    log_in(driver, hub, "lena")
    driver.get(f"{hub.url}/user/lena/lab")

    def item(d):
        found = d.find_elements(by().ID, "gpuspawner-lab-status")
        return found[0] if found and found[0].text.startswith("GPU:") else None

    shown = wait(driver, item, "no GPU item in JupyterLab's status bar", timeout=120)
    assert shown.get_attribute("data-uuids") == visible  # the same device(s) the server sees
    # (idle from its first report at 0 %: "idle limit in 60 min unless its GPU is used")
    assert shown.text.startswith(f"GPU: {A100} · 0.0 GiB of 80.0 GiB · 0 % · idle limit "), shown.text
    assert f"{uuid}: the whole GPU" in shown.get_attribute("title")

    # Her notebook takes 2 GiB and the GPU gets busy: the next report says so, and so does the item.
    node.run(uuid, pid, used_mib=2048)
    node.busy(uuid, 40)
    wait(driver, lambda d: "2.0 GiB of 80.0 GiB · 40 %" in (item(d).text if item(d) else ""), "no update", 60)
    driver.save_screenshot(str(shots / "jupyterlab-status.png"))

    # It asks every 15 s (its setting's default), though the node reports every second.
    driver.execute_script("performance.clearResourceTimings()")
    time.sleep(16)
    asked = driver.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.includes('gpuspawner-lab/status')).length"
    )
    assert 1 <= asked <= 2, f"{asked} requests in 16 s"


def test_a_share_holders_home_page_shows_its_memory_use_against_its_share_and_its_limits(
    lab,
    swarm,
    browsers,  # noqa: F811
    shots,  # noqa: F811
):
    """In a real browser, the home page of a holder of half an A100 (screenshot:
    docs/screenshots/home-gpus-share.png): the device, what the share comes with, what
    the server uses of it and how busy the GPU is (from the node's report), and the
    limits that would stop it."""
    hub, node = lab[0], lab[1]
    r = hub.spawn("sara", {"gpu_model": A100, "gpu_share": 0.5})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("sara", timeout=SPAWN_TIMEOUT)
    uuid, pid = server_of(swarm, "sara")
    node.run(uuid, pid, used_mib=10240)  # her notebook takes 10 GiB of the 40 her half comes with
    node.busy(uuid, 30)
    driver = browsers(width=1100, height=700).driver
    log_in(driver, hub, "sara")

    def shown(d) -> str:
        d.get(hub.url + "/hub/home")
        found = d.find_elements(by().ID, "gpuspawner-servers")
        return found[0].text if found else ""

    wait(driver, lambda d: "in use by this server: 10 GiB" in shown(d), "no memory use on the home page", 60)
    text = shown(driver)
    assert f"{A100} on gpu-b" in text and f"{uuid}: 0.5 of the GPU, 40 GiB of memory" in text, text
    assert "in use by this server: 10 GiB · GPU busy 30 %" in text, text
    assert "held-time limit in 8.0 h" in text and "idle limit: after 60 min without GPU use" in text, text
    driver.save_screenshot(str(shots / "home-gpus-share.png"))
    hub.stop_server("sara")


def test_a_cpu_only_server_reads_no_gpu(lab, browsers):  # noqa: F811
    """Guards docs/jupyterlab.md, "The GPUs in JupyterLab's status bar": "on a CPU-only server" and "A
    server without a GPU reads"."""
    hub = lab[0]
    r = hub.spawn("nils", {})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("nils", timeout=SPAWN_TIMEOUT)
    driver = browsers(width=1200, height=800).driver
    log_in(driver, hub, "nils")
    driver.get(f"{hub.url}/user/nils/lab")
    found = wait(driver, lambda d: d.find_elements(by().ID, "gpuspawner-lab-status"), "no item", timeout=120)
    wait(driver, lambda d: found[0].text == "No GPU", f"the item reads {found[0].text!r}", timeout=30)


def test_the_endpoint_answers_a_servers_own_token_for_its_own_server_only(lab):
    """Guards docs/jupyterlab.md, "How it asks the hub": "a server's own token (JupyterHub's server
    role) reads that server only", "A token that may not see the server gets 404, not 403" and "A
    request without valid credentials gets 403"."""
    hub, _, uuid, _, container = lab
    token = env_in(container, "JUPYTERHUB_API_TOKEN")  # the server's own (JupyterHub's "server" role)

    def ask(path: str, with_token: str) -> requests.Response:
        url = f"{hub.url}/hub/api/gpuspawner/servers/{path}"
        return requests.get(url, headers={"Authorization": f"token {with_token}"}, timeout=10)

    own = ask("lena", token)
    assert own.status_code == 200 and [d["uuid"] for d in own.json()["devices"]] == [uuid]
    assert own.json()["model"] == A100 and own.json()["refresh_seconds"] == 1.0  # the agent's interval here
    # Refused as JupyterHub refuses what a token may not see: 404, as if it did not exist.
    assert ask("lena/another", token).status_code == 404  # her other servers are not this token's
    session = login(hub, "mia")  # mia makes a token of her own, as on /hub/token
    assert ask("mia", token).status_code == 404
    made = session.post(
        f"{hub.url}/hub/api/users/mia/tokens",
        json={"note": "mia's own"},
        headers={"X-XSRFToken": session.cookies.get("_xsrf")},
        timeout=30,
    )
    mia = made.json()["token"]
    assert ask("lena", mia).status_code == 404
    assert ask("lena", "not-a-token").status_code == 403
    assert ask("mia", mia).json() == {"server": "", "devices": [], "refresh_seconds": 15.0}  # no server: nothing held
