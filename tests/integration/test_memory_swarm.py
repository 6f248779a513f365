"""A share's GPU memory policed on the real swarm: a real hub, gpuspawner-agent on gpu-b
(examples/agent-stack.yml) over the fake libnvidia-ml.so.1, whose process list gives
the real containers' PIDs the memory a test sets; the agent traces each to its
container. Two servers hold halves of one A100 (40 GiB each)."""

from __future__ import annotations

import time

from gpuspawner.ledger.ledger import Ledger
from tests.integration.support import (
    gpu_b,
    hub_with_agent_on_gpu_b,
    login,
    server_of,
    services_of,
    spawn_ready,
    wait_until,
)

A100 = gpu_b()[0]["name"]
GRACE = 6.0
GIB = 1024
CONFIG = f"""
c.GPUSwarmSpawner.gpu_sharing = {{"{A100}": {{"quantum": 0.25, "memory": "stop", "memory_grace": {GRACE}}}}}
c.GPUSwarmSpawner.gpu_reclaim_interval = 0.5
"""


def notices(hub, user: str) -> list[dict]:
    r = login(hub, user).get(hub.url + "/hub/api/gpuspawner/notices", timeout=10)
    r.raise_for_status()
    return r.json()["notices"]


def holders(hub) -> dict[str, dict]:
    found = {}
    for devices in hub.api("GET", "/gpuspawner/alloc-map").json().values():
        for d in devices.values():
            found.update({h["user"]: h for h in d["holders"]})
    return found


def test_the_holder_above_its_share_is_warned_and_stopped_and_its_neighbour_keeps_running(swarm, tmp_path_factory):
    work = tmp_path_factory.mktemp("memory")
    db = work / "ledger.sqlite"
    config = CONFIG + f"c.GPUSwarmSpawner.gpu_db_url = 'sqlite:///{db}'\n"
    with hub_with_agent_on_gpu_b(swarm, work, port_from=21600, extra_config=config) as (hub, node):
        spawn_ready(hub, "ola", {"gpu_model": A100, "gpu_share": 0.5})
        spawn_ready(hub, "per", {"gpu_model": A100, "gpu_share": 0.5})
        o_uuid, o_pid = server_of(swarm, "ola")
        p_uuid, p_pid = server_of(swarm, "per")
        assert o_uuid == p_uuid  # halves of one A100
        node.busy(o_uuid, 50)
        node.run(p_uuid, p_pid, used_mib=10 * GIB)
        node.run(o_uuid, o_pid, used_mib=50 * GIB)
        t0 = time.monotonic()
        wait_until(lambda: notices(hub, "ola"), "ola was not warned", timeout=15)
        warned = time.monotonic() - t0
        [notice] = notices(hub, "ola")
        assert notice["reason"] == "memory" and "50.0 GiB on " + o_uuid in notice["message"]
        assert "where its share comes with 40.0 GiB" in notice["message"]
        home = login(hub, "ola").get(hub.url + "/hub/home", timeout=10).text
        assert "uses more GPU memory than its share" in home
        seen = holders(hub)
        assert (seen["ola"]["used_mib"], seen["ola"]["entitled_mib"], seen["ola"]["memory_over"]) == (
            50 * GIB,
            40 * GIB,
            True,
        )
        assert (seen["per"]["used_mib"], seen["per"]["memory_over"]) == (10 * GIB, False)
        assert notices(hub, "per") == []

        wait_until(lambda: hub.server_model("ola") is None, "ola's server was not stopped", timeout=GRACE + 20)
        stopped = time.monotonic() - t0
        assert stopped - warned >= GRACE - 1.5  # the grace first
        wait_until(lambda: services_of(swarm, "ola") == [], "ola's service is still there", timeout=30)
        print(f"\nmemory timeline: over at 0 s, warned {warned:.1f} s, stopped {stopped:.1f} s (grace {GRACE:.0f} s)")
        [closed] = Ledger(f"sqlite:///{db}").history(user="ola")
        assert closed.end_reason == "memory" and closed.peak_memory_mib == 50 * GIB
        assert hub.server_model("per") is not None and notices(hub, "per") == []


def test_a_node_set_to_hami_without_the_library_gets_no_share_and_doctor_names_it(swarm, tmp_path_factory):
    """gpu-b is set to enforce shares with HAMi-core, which is not there (its agent
    looks in a folder mounted into its container, as docs/agent.md says): under
    "refuse", a share is refused with why, a whole A100 still starts, and doctor names gpu-b."""
    work = tmp_path_factory.mktemp("hami")
    library = work / "gpus" / "libvgpu.so"  # the folder is the agent's (its devices file's); no library in it
    config = (
        f'c.GPUSwarmSpawner.gpu_sharing = {{"{A100}": {{"quantum": 0.25}}}}\n'
        'c.GPUSwarmSpawner.gpu_share_enforcement = {"gpu-b": "hami", "*": "none"}\n'
        'c.GPUSwarmSpawner.gpu_share_enforcement_missing = "refuse"\n'
    )
    args = ("--hami-library", str(library))
    with hub_with_agent_on_gpu_b(swarm, work, port_from=21700, extra_config=config, agent_args=args) as (hub, _node):
        r = hub.spawn("quin", {"gpu_model": A100, "gpu_share": 0.5})
        assert r.status_code == 409, r.text
        assert f"gpu-b has, but HAMi-core's library is not at {library}." in r.json()["message"]
        assert hub.server_model("quin") is None and services_of(swarm, "quin") == []
        spawn_ready(hub, "rita", {"gpu_model": A100})  # a whole GPU: as before
        findings = hub.api("GET", "/gpuspawner/doctor").json()["findings"]
        [finding] = [f for f in findings if "enforced with hami" in f["problem"]]
        assert finding["host"] == "gpu-b" and finding["severity"] == "error"
        page = login(hub, "admin").get(hub.url + "/hub/gpus", timeout=10).text
        assert 'data-host="gpu-b"' in page and "shares are set to be enforced with hami" in page
