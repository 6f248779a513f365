"""A worker's dockerd stopped under a running server, on the real test swarm. Its own
file so that it runs after the other hub tests: the paused daemon needs a while to
settle after it resumes. Results: docs/reliability.md."""

from __future__ import annotations

import os
import signal
import time

import pytest

from gpuspawner.cluster.cluster import NODES_MAX_AGE
from tests.integration.support import hub_on, wait_until

MODEL = "NVIDIA A100 80GB PCIe"


@pytest.fixture
def quick_heartbeats(swarm):
    """Nodes found down within seconds instead of the default ~15 s."""
    client = swarm.client()
    client.swarm.update(dispatcher_heartbeat_period=1_000_000_000)
    yield
    client.swarm.update(dispatcher_heartbeat_period=5_000_000_000)


def test_a_worker_whose_daemon_stops_is_not_offered_its_servers_end_and_it_comes_back(
    swarm, tmp_path, quick_heartbeats
):
    """Guards docs/security.md, "Root on a GPU node": "make the hub give its servers' GPUs away while
    their containers may still run: they stay removing until the node is back and the tasks have
    ended".

    Guards docs/reliability.md, "The fault model": "A server whose node is down keeps its GPUs
    reserved (phase removing) while its container may still run" and "The task's end is seen and its
    GPUs are released at the next reconciliation"; "Measured on the test swarm": "its GPU stays
    reserved (phase removing in the allocation map) through every reconciliation while the node is
    down" and "After SIGCONT the node is back, the task ends, the next reconciliation releases the
    GPU"."""
    config = (
        "c.Spawner.poll_interval = 2\n"
        "c.GPUSwarmSpawner.reconcile_interval = 2\n"
        "c.GPUSwarmSpawner.server_stop_timeout = 3\n"
    )
    with hub_on(swarm, tmp_path / "hub", port_from=20600, extra_config=config) as hub:
        r = hub.spawn("mike", {"gpu_model": MODEL})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("mike")
        pid = int((swarm.run_dir / "gpu-b.pid").read_text())
        os.kill(pid, signal.SIGSTOP)  # gpu-b's dockerd stops answering
        try:

            def node_down():
                return swarm.client().nodes.list(filters={"name": "gpu-b"})[0].attrs["Status"]["State"] == "down"

            wait_until(node_down, "the swarm did not notice gpu-b is down", timeout=60)
            # Its server is reported dead and gone from the hub; its GPUs are not offered.
            wait_until(lambda: hub.server_model("mike") is None, "mike's server was not reported dead", timeout=60)
            r = hub.spawn("nina", {"gpu_model": MODEL, "gpu_count": 2})
            assert r.status_code == 409 and "(0 of 2 free)" in r.json()["message"], r.text

            # Its container may still run on the stopped node: the GPU stays reserved,
            # shown as being removed, until the swarm can say the task ended.
            def held():
                return [
                    h for d in hub.api("GET", "/gpuspawner/alloc-map").json()["gpu-b"].values() for h in d["holders"]
                ]

            wait_until(
                lambda: [h["phase"] for h in held()] == ["removing"], "mike's GPU is not being removed", timeout=30
            )
            time.sleep(5)  # several reconciliations while the node is down
            assert [(h["user"], h["phase"]) for h in held()] == [("mike", "removing")]
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: not node_down(), "gpu-b did not come back", timeout=60)
        wait_until(lambda: held() == [], "mike's GPU was not released once gpu-b was back", timeout=60)
        time.sleep(NODES_MAX_AGE)
        r = hub.spawn("nina", {"gpu_model": MODEL, "gpu_count": 2})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("nina")
        hub.stop_server("nina")
