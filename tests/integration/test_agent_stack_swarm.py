"""examples/agent-stack.yml deployed with `docker stack deploy` on the real test swarm.

What the test machine lacks is swapped in, and only that: the test image (busybox) with
this machine's Python and the repository bind-mounted instead of an image with
gpuspawner, and the fake libnvidia-ml.so.1 instead of the NVIDIA runtime's. The rest is
the stack file as users get it: a global service placed by a node label, the host
network, the token as a swarm secret, the node's hostname through a swarm template.
The stand-in hub listens on the manager's bridge address, which the nodes reach.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests import fakenvml
from tests.fakenvml.nodes import MIXED_NODE
from tests.harness.report_sink import ReportSink

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "examples" / "agent-stack.yml"
STACK_NAME = "gpuspawner-agent-test"
TOKEN = "swarm-agent-token"


def docker(swarm, *args, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], env={"PATH": "/usr/local/bin:/usr/bin:/bin", **swarm.env()},
                          input=input, capture_output=True, text=True, timeout=60, check=check)


def set_gpu_label(swarm, hostname: str, value: str | None) -> None:
    node = next(n for n in swarm.client().nodes.list() if n.attrs["Description"]["Hostname"] == hostname)
    spec = node.attrs["Spec"]
    labels = dict(spec.get("Labels") or {})
    if value is None:
        labels.pop("gpu", None)
    else:
        labels["gpu"] = value
    node.update(dict(spec, Labels=labels))


def local_stack(sink: ReportSink, lib_dir: Path, devices: Path, image: str) -> dict:
    """The example stack with this machine's stand-ins for the image and the driver."""
    stack = yaml.safe_load(STACK.read_text())
    [service] = stack["services"].values()
    service["image"] = image
    mounts = {"/usr", "/lib", "/lib64", sys.base_prefix, sys.prefix, str(REPO), str(lib_dir), str(devices.parent)}
    service["volumes"] = [{"type": "bind", "source": m, "target": m, "read_only": True}
                          for m in sorted(mounts) if Path(m).exists()]
    service["environment"].update(LD_LIBRARY_PATH=str(lib_dir), FAKE_NVML_DEVICES=str(devices),
                                  PYTHONPATH=str(REPO))
    command = service["command"]
    assert command[0] == "gpuspawner-agent"
    command[:1] = [sys.executable, "-m", "gpuspawner.agent"]
    command[command.index("--hub-url") + 1] = sink.url("/jhub/")
    command[command.index("--interval") + 1] = "1"
    return stack


@pytest.fixture
def deployed(swarm, tmp_path):
    lib_dir = fakenvml.build(tmp_path / "lib").parent
    (tmp_path / "gpus").mkdir()
    devices = fakenvml.write_devices(tmp_path / "gpus" / "devices.txt", MIXED_NODE)
    sink = ReportSink(host=swarm.manager_addr)
    stack_file = tmp_path / "agent-stack.yml"
    stack_file.write_text(yaml.safe_dump(local_stack(sink, lib_dir, devices, swarm.image)))
    docker(swarm, "stack", "rm", STACK_NAME, check=False)
    docker(swarm, "secret", "rm", "gpuspawner_agent_token", check=False)
    docker(swarm, "secret", "create", "gpuspawner_agent_token", "-", input=TOKEN)
    set_gpu_label(swarm, "gpu-a", "true")
    set_gpu_label(swarm, "gpu-b", "false")
    try:
        docker(swarm, "stack", "deploy", "-c", str(stack_file), STACK_NAME)
        yield sink
    finally:
        docker(swarm, "stack", "rm", STACK_NAME, check=False)
        for hostname in ("gpu-a", "gpu-b"):
            set_gpu_label(swarm, hostname, None)
        deadline = time.monotonic() + 60
        while docker(swarm, "secret", "rm", "gpuspawner_agent_token", check=False).returncode != 0:
            if time.monotonic() > deadline:  # still in use by a task that is going away
                break
            time.sleep(1)
        sink.stop()


def test_the_example_stack_reports_each_labelled_node_under_its_swarm_hostname(swarm, deployed):
    sink = deployed
    sink.wait_for(3, timeout=90)  # the first report at start, then one a second
    time.sleep(2)                 # time for a wrongly placed agent to show up too
    bodies = [json.loads(body) for _, _, body in sink.requests]
    assert {b["hostname"] for b in bodies} == {"gpu-a"}  # gpu-b is labelled gpu=false
    for path, headers, _ in sink.requests:
        assert path == "/jhub/hub/api/gpuspawner/report"
        assert headers["Authorization"] == f"token {TOKEN}"  # read from /run/secrets
    report = bodies[-1]
    assert report["device_count"] == len(MIXED_NODE) and report["interval"] == 1
    assert [d["uuid"] for d in report["devices"] if not d["lost"]] == \
        [d["uuid"] for d in MIXED_NODE if not d.get("lost")]
