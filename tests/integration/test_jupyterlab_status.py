"""gpuspawner's JupyterLab extension on the real swarm: a real server from the Jupyter
image (which installs the extension's wheel, devtools/jupyter_image.py), its status
bar in headless Chromium, and the hub's endpoint asked with the server's own token
(read from inside its container). gpu-b's GPUs come from gpuspawner-agent over the fake
NVML, whose process list a test changes."""

from __future__ import annotations

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
    idle = "c.GPUSwarmSpawner.gpu_idle_timeout = 3600\n"  # a limit to show (never reached here)
    env = {"GPUSPAWNER_IMAGE": jupyter_image}
    with hub_with_agent_on_gpu_b(swarm, work, port_from=21400, extra_config=idle, env=env) as (hub, node):
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


def test_a_cpu_only_server_reads_no_gpu(lab, browsers):  # noqa: F811
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
