"""A reservation on the real three-node swarm, end to end: a real JupyterHub (with its
proxy), `gpuspawner reserve` against it, the swarm's two A100s.

Two others hold both A100s when an admin reserves one for the group cs101 from half a
minute on. The newer of the two is told at once (a notice with the reason
``reservation``); a member asks meanwhile and waits in line. At the window's start
the newer other is stopped with the end reason ``reservation`` and the member's
request is served (the time from the start to the member's server being ready is
printed); the older other keeps running. While the window is open, a non-member is
refused; after it, others are served again.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from gpuspawner.ledger.ledger import Ledger
from tests.integration.support import admin_cli, hub_on, login, services_of, spawn_ready, wait_until

A100 = "NVIDIA A100 80GB PCIe"
LEAD = 30.0  # seconds from the reservation to its window's start
WINDOW = 60.0


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    work = tmp_path_factory.mktemp("reservations")
    config = (
        "c.GPUSwarmSpawner.gpu_reclaim_interval = 0.5\n"
        f"c.GPUSwarmSpawner.gpu_db_url = 'sqlite:///{work / 'ledger.sqlite'}'\n"
        "c.JupyterHub.load_groups = {'cs101': {'users': ['mia']}}\n"
    )
    with hub_on(swarm, work, port_from=22000, extra_config=config) as h:
        h.db_url = f"sqlite:///{work / 'ledger.sqlite'}"
        yield h


def notices(hub, user: str) -> list[dict]:
    r = login(hub, user).get(hub.url + "/hub/api/gpuspawner/notices", timeout=10)
    r.raise_for_status()
    return r.json()["notices"]


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S+00:00")


def test_a_window_makes_room_for_its_members_and_gives_the_gpu_back_after(hub, swarm):
    spawn_ready(hub, "oda", {"gpu_model": A100})
    spawn_ready(hub, "ole", {"gpu_model": A100})  # the newer: the one to make room
    start = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=LEAD)
    end = start + timedelta(seconds=WINDOW)
    made = admin_cli(hub, "reserve", "cs101", A100, "1", "--start", iso(start), "--end", iso(end), "--name", "CS101")
    assert made.returncode == 0, made.stderr
    assert "CS101, 1 NVIDIA A100 80GB PCIe for cs101" in made.stdout
    listed = admin_cli(hub, "reserve", "--list")
    assert "CS101" in listed.stdout and "cs101" in listed.stdout, listed.stdout

    wait_until(lambda: notices(hub, "ole"), "ole was not told to make room", timeout=15)
    [notice] = notices(hub, "ole")
    assert notice["reason"] == "reservation" and "reserved for CS101" in notice["message"]
    assert notices(hub, "oda") == []

    r = hub.spawn("mia", {"gpu_model": A100, "gpu_wait": True})  # a member, before the window: in line
    assert r.status_code == 202, r.text
    wait_until(lambda: datetime.now(timezone.utc) >= start, "the window did not open", timeout=LEAD + 10)
    t0 = time.monotonic()
    hub.wait_ready("mia", timeout=60)
    served = time.monotonic() - t0
    print(f"\nreservation: the member's server ready {served:.1f} s after the window's start")
    assert hub.server_model("ole") is None and hub.server_model("oda") is not None
    wait_until(lambda: services_of(swarm, "ole") == [], "ole's service is still there", timeout=30)
    [closed] = Ledger(hub.db_url).history(user="ole")
    assert closed.end_reason == "reservation"

    hub.stop_server("mia")  # the reserved GPU is free again, kept for cs101 while the window is open
    r = hub.spawn("uli", {"gpu_model": A100})
    assert r.status_code == 409 and "reserved" in r.text and "CS101" in r.text, r.text

    wait_until(lambda: datetime.now(timezone.utc) >= end, "the window did not end", timeout=WINDOW + 10)
    spawn_ready(hub, "uli", {"gpu_model": A100})  # after the window, others are served again
