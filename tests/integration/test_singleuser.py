"""The real single-user server (jupyterhub-singleuser with JupyterLab, the image of
devtools/jupyter_image.py) on the test swarm: the hub starts it on the node the
allocator chose, the user reaches JupyterLab through the proxy, and what runs in it (a
kernel, a terminal) sees exactly the GPUs the allocator gave, as an ordinary user.
"""

from __future__ import annotations

import pytest
import yaml

from devtools.hub import REPO
from tests.integration.jupyter_api import run_in_kernel, run_in_terminal
from tests.integration.support import hub_on, login, services_of, spawn_ready

GTX = "NVIDIA GeForce GTX 1070"
INVENTORY = yaml.safe_load((REPO / "examples/local/gpus.yaml").read_text())
UUIDS = {host: [d["uuid"] for d in devices] for host, devices in INVENTORY.items()}


@pytest.fixture(scope="module")
def hub(swarm, jupyter_image, tmp_path_factory):
    with hub_on(swarm, tmp_path_factory.mktemp("hub-jupyter"), 21000, env={"GPUSPAWNER_IMAGE": jupyter_image}) as h:
        yield h


def test_user_lands_in_jupyterlab_whose_kernel_and_terminal_see_the_gpus(hub, swarm):
    spawn_ready(hub, "alice", {"gpu_model": GTX, "gpu_count": 2})
    (service,) = services_of(swarm, "alice")
    assert service.attrs["Spec"]["Labels"]["gpuspawner.devices"] == ",".join(UUIDS["gpu-a"][:2])
    expected = ",".join(UUIDS["gpu-a"][:2])

    # The browser's way in: the hub's login, then OAuth to the server, which is JupyterLab.
    page = login(hub, "alice").get(hub.url + "/user/alice/", timeout=60)
    assert page.status_code == 200
    assert page.url == hub.url + "/user/alice/lab"
    assert "jupyter-config-data" in page.text and "JupyterLab" in page.text

    out = run_in_kernel(
        hub, "alice", "import os, getpass; print(os.environ['NVIDIA_VISIBLE_DEVICES'], getpass.getuser())"
    )
    assert out.split() == [expected, "jovyan"]  # Jupyter does not run as root
    screen = run_in_terminal(hub, "alice", "echo GPUS=$NVIDIA_VISIBLE_DEVICES", r"GPUS=[^\s$]+\s")
    assert f"GPUS={expected}" in screen


def test_cpu_only_server_kernel_sees_no_gpu(hub, swarm):
    spawn_ready(hub, "bob", {})
    out = run_in_kernel(hub, "bob", "import os; print(os.environ['NVIDIA_VISIBLE_DEVICES'])")
    assert out.strip() == "void"
