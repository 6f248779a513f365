"""Backfill and two open reservations on the real three-node test swarm: a real JupyterHub
(with its proxy) driven through its REST API, with three A100s: one on gpu-a, two on gpu-b.

A request for both of gpu-b's A100s waits at the head of the line while one of them is
held; gpu-b is its planned host (the queue API says so). A 1-GPU request behind it, with
gpu_wait, is served at once on gpu-a (the time from its request to its server being ready
is printed); the head gets gpu-b when the holder stops. Guards docs/line.md, "Backfill".

Two reservations of the A100 are open together: Lab B (1) since before its member's
server started, Lab A (2) from a few seconds on. At Lab A's start exactly the server of
the user who is a member of neither is stopped (told first, end reason ``reservation``);
Lab B's member, the newer server, keeps his. Guards docs/reservations.md, "Members of any
open reservation of the model are never stopped for one".
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from gpuspawner.ledger.ledger import Ledger
from tests.integration.support import hub_on, login, services_of, spawn_ready, wait_until

A100 = "NVIDIA A100 80GB PCIe"
WAIT = {"gpu_model": A100, "gpu_wait": True}
INVENTORY = {
    "gpu-a": [{"index": 0, "uuid": "GPU-a100a000-0000-4000-8000-000000000000", "model": A100, "memory_mib": 81920}],
    "gpu-b": [
        {"index": i, "uuid": f"GPU-a100b000-0000-4000-8000-00000000000{i}", "model": A100, "memory_mib": 81920}
        for i in range(2)
    ],
}
LEAD = 10.0  # seconds from Lab A's making to its window's start


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    work = tmp_path_factory.mktemp("backfill")
    (work / "gpus.yaml").write_text(yaml.safe_dump(INVENTORY))
    config = (
        # The REST API answers a spawn at once (202), not after 10 s, also for one that waits in line.
        'c.JupyterHub.tornado_settings.update({"slow_spawn_timeout": 0})\n'
        "c.GPUSwarmSpawner.allow_host_choice = True\n"
        "c.GPUSwarmSpawner.gpu_reclaim_interval = 0.5\n"
        f"c.GPUSwarmSpawner.gpu_db_url = 'sqlite:///{work / 'ledger.sqlite'}'\n"
        "c.JupyterHub.load_groups = {'lab-a': {'users': ['ada']}, 'lab-b': {'users': ['dov']}}\n"
    )
    env = {"GPUSPAWNER_INVENTORY": str(work / "gpus.yaml")}
    with hub_on(swarm, work, port_from=22200, extra_config=config, env=env) as h:
        h.db_url = f"sqlite:///{work / 'ledger.sqlite'}"
        yield h


def queue(hub) -> list[tuple[str, int, str | None]]:
    """The A100's line as the queue API lists it: (user, position, planned host)."""
    r = hub.api("GET", "/gpuspawner/queue")
    assert r.status_code == 200, r.text
    return [(w["user"], w["position"], w["planned_host"]) for w in r.json().get(A100, [])]


def placed(swarm, user: str) -> tuple[str, int]:
    """The host the user's service is placed on, and how many GPUs it was given."""
    [service] = services_of(swarm, user)
    labels = service.attrs["Spec"]["Labels"]
    assert f"node.hostname=={labels['gpuspawner.host']}" in [
        c.replace(" ", "") for c in service.attrs["Spec"]["TaskTemplate"]["Placement"]["Constraints"]
    ]
    return labels["gpuspawner.host"], len(labels["gpuspawner.devices"].split(","))


def test_a_small_request_behind_a_whole_host_one_is_served_at_once_on_the_other_host(hub, swarm):
    spawn_ready(hub, "abe", {"gpu_model": A100, "gpu_host": "gpu-b"})  # one of gpu-b's two
    r = hub.spawn("bea", {**WAIT, "gpu_count": 2})  # only gpu-b has two: she waits for it
    assert r.status_code == 202, r.text
    wait_until(lambda: queue(hub) == [("bea", 1, "gpu-b")], "bea does not wait at the head with gpu-b planned")
    assert services_of(swarm, "bea") == []

    t0 = time.monotonic()
    r = hub.spawn("cal", WAIT)
    assert r.status_code in (201, 202), r.text
    assert queue(hub) == [("bea", 1, "gpu-b")]  # cal never joined the line
    hub.wait_ready("cal", timeout=60)
    print(f"\nbackfill: the request behind the head ready {time.monotonic() - t0:.1f} s after it was made")
    assert placed(swarm, "cal") == ("gpu-a", 1)
    assert services_of(swarm, "bea") == [] and queue(hub) == [("bea", 1, "gpu-b")]

    hub.stop_server("abe")
    hub.wait_ready("bea", timeout=90)  # the holder's stop gives the head its host
    assert placed(swarm, "bea") == ("gpu-b", 2)
    assert queue(hub) == []
    hub.stop_all_servers()


def reserve(hub, group: str, count: int, start: datetime, end: datetime, name: str) -> int:
    body = {"group": group, "model": A100, "count": count, "start": start.isoformat(), "end": end.isoformat()}
    r = hub.api("POST", "/gpuspawner/reservations", json={**body, "name": name})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def notices(hub, user: str) -> list[dict]:
    r = login(hub, user).get(hub.url + "/hub/api/gpuspawner/notices", timeout=10)
    r.raise_for_status()
    return r.json()["notices"]


def test_a_windows_start_with_two_open_reservations_stops_exactly_the_non_member(hub, swarm):
    now = datetime.now(timezone.utc).replace(microsecond=0)
    made = [reserve(hub, "lab-b", 1, now - timedelta(minutes=1), now + timedelta(minutes=10), "Lab B")]
    try:
        spawn_ready(hub, "bob", {"gpu_model": A100})  # a member of neither: 3 free, 1 kept for Lab B
        spawn_ready(hub, "dov", {"gpu_model": A100})  # Lab B's member, the newer server
        start = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=LEAD)
        made.append(reserve(hub, "lab-a", 2, start, start + timedelta(minutes=10), "Lab A"))
        wait_until(lambda: notices(hub, "bob"), "bob was not told to make room", timeout=LEAD - 4)
        [notice] = notices(hub, "bob")
        assert notice["reason"] == "reservation" and "Lab A" in notice["message"], notice
        assert notices(hub, "dov") == []

        wait_until(lambda: datetime.now(timezone.utc) >= start, "Lab A did not open", timeout=LEAD + 10)
        t0 = time.monotonic()
        wait_until(lambda: hub.server_model("bob") is None, "bob's server was not stopped", timeout=30)
        print(f"\nreservations: the non-member stopped {time.monotonic() - t0:.1f} s after Lab A's start")
        wait_until(lambda: services_of(swarm, "bob") == [], "bob's service is still there", timeout=30)
        [closed] = Ledger(hub.db_url).history(user="bob")
        assert closed.end_reason == "reservation"
        assert (hub.server_model("dov") or {}).get("ready"), "dov's server was stopped too"
        assert [h.user for h in Ledger(hub.db_url).open_allocations()] == ["dov"]
    finally:
        for reservation in made:
            assert hub.api("DELETE", f"/gpuspawner/reservations/{reservation}").status_code == 200
    hub.stop_all_servers()
