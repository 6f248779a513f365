"""examples/agent-stack.yml deployed with `docker stack deploy` on the real test swarm.

What the test machine lacks is swapped in, and only that: the test image (busybox) with
this machine's Python and the repository bind-mounted instead of an image with
gpuspawner, and the fake libnvidia-ml.so.1 instead of the NVIDIA runtime's. The rest is
the stack file as users get it: a global service placed by a node label, the host
network, each node's own token from a file whose path the swarm templates by node,
the node's hostname through the same template.
The stand-in hub listens on the manager's bridge address, which the nodes reach.
"""

from __future__ import annotations

import json
import time

import pytest

from devtools import agent_stack, fakenvml
from devtools.fakenvml.nodes import MIXED_NODE
from devtools.report_sink import ReportSink

TOKEN = "swarm-agent-token"


@pytest.fixture
def deployed(swarm, tmp_path):
    lib_dir = fakenvml.build(tmp_path / "lib").parent
    (tmp_path / "gpus").mkdir()
    devices = fakenvml.write_devices(tmp_path / "gpus" / "devices.txt", MIXED_NODE)
    sink = ReportSink(host=swarm.manager_addr)
    agent_stack.write_tokens(tmp_path / "tokens", {"gpu-a": TOKEN, "gpu-b": "gpu-b-token"})
    stack = agent_stack.local_stack(sink.url("/jhub/"), lib_dir, str(devices), swarm.image, tmp_path / "tokens")
    try:
        with agent_stack.deployed(swarm, stack, {"gpu-a": "true", "gpu-b": "false"}, tmp_path):
            yield sink
    finally:
        sink.stop()


def test_the_example_stack_reports_each_labelled_node_under_its_swarm_hostname(swarm, deployed):
    sink = deployed
    sink.wait_for(3, timeout=90)  # the first report at start, then one a second
    time.sleep(2)  # time for a wrongly placed agent to show up too
    bodies = [json.loads(body) for _, _, body in sink.requests]
    assert {b["hostname"] for b in bodies} == {"gpu-a"}  # gpu-b is labelled gpu=false
    for path, headers, _ in sink.requests:
        assert path == "/jhub/hub/api/gpuspawner/report"
        assert headers["Authorization"] == f"token {TOKEN}"  # read from gpu-a's own token file
    report = bodies[-1]
    assert report["device_count"] == len(MIXED_NODE) and report["interval"] == 1
    assert [d["uuid"] for d in report["devices"] if not d["lost"]] == [
        d["uuid"] for d in MIXED_NODE if not d.get("lost")
    ]


def test_a_labelled_node_without_its_token_file_gets_an_agent_that_stops_saying_why(swarm, tmp_path):
    lib_dir = fakenvml.build(tmp_path / "lib").parent
    (tmp_path / "gpus").mkdir()
    devices = fakenvml.write_devices(tmp_path / "gpus" / "devices.txt", MIXED_NODE)
    agent_stack.write_tokens(tmp_path / "tokens", {"gpu-a": TOKEN})  # none for gpu-b
    sink = ReportSink(host=swarm.manager_addr)
    stack = agent_stack.local_stack(sink.url("/"), lib_dir, str(devices), swarm.image, tmp_path / "tokens")
    try:
        with agent_stack.deployed(swarm, stack, {"gpu-a": "true", "gpu-b": "true"}, tmp_path):
            sink.wait_for(2, timeout=90)
            client = swarm.client()
            gpu_b = next(n.id for n in client.nodes.list() if n.attrs["Description"]["Hostname"] == "gpu-b")
            service = client.services.get(f"{agent_stack.STACK_NAME}_agent")
            deadline = time.monotonic() + 60
            while not any(t.get("NodeID") == gpu_b and t["Status"].get("Err") for t in service.tasks()):
                assert time.monotonic() < deadline, "gpu-b's agent did not stop"
                time.sleep(1)
            errors = {
                t["Status"]["Err"] for t in service.tasks() if t.get("NodeID") == gpu_b and t["Status"].get("Err")
            }
            assert errors == {"task: non-zero exit (2)"}, errors  # exit 2: it cannot report
            logs = b"".join(
                c.logs()
                for c in swarm.client("gpu-b").containers.list(
                    all=True, filters={"label": f"com.docker.swarm.service.id={service.id}"}
                )
            ).decode()
            assert "cannot read the token file /run/gpuspawner/agent-tokens/gpu-b" in logs, logs
            assert {json.loads(body)["hostname"] for _, _, body in sink.requests} == {"gpu-a"}
    finally:
        sink.stop()
