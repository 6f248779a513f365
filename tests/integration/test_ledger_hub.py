"""The ledger inside a real hub on the real swarm, on a real PostgreSQL server:
spawns are recorded, usage is reported, and a database outage refuses spawns
cleanly (no service, no GPU kept) until the database is back."""

from __future__ import annotations

import pytest

from gpuspawner.ledger.ledger import Ledger
from tests.integration.support import admin_cli, hub_on, service_gpus, services_of, spawn_ready

A100 = "NVIDIA A100 80GB PCIe"


@pytest.fixture(scope="module")
def db_url(pg):
    return pg.create_database("hub_ledger")


@pytest.fixture(scope="module")
def hub(swarm, pg, db_url, tmp_path_factory):
    config = f"c.GPUSwarmSpawner.gpu_db_url = {db_url!r}\n"
    with hub_on(swarm, tmp_path_factory.mktemp("hub"), port_from=19500, extra_config=config) as h:
        yield h


def held(hub, host="gpu-b") -> list[str]:
    m = hub.api("GET", "/gpuspawner/alloc-map").json()
    return [h["user"] for d in m[host].values() for h in d["holders"]]


def test_a_spawn_and_its_stop_are_recorded_and_usage_counts_them(hub, db_url):
    spawn_ready(hub, "uma", {"gpu_model": A100, "gpu_count": 2})
    (record,) = [r for r in Ledger(db_url).open_allocations() if r.user == "uma"]
    assert record.host == "gpu-b" and len(record.devices) == 2 and record.milli == (1000, 1000)
    hub.stop_server("uma")
    assert not [r for r in Ledger(db_url).open_allocations() if r.user == "uma"]
    (closed,) = Ledger(db_url).history(user="uma")
    assert closed.end_reason == "server stopped" and closed.ended_at > closed.started_at

    usage = hub.api("GET", "/gpuspawner/usage?by=user").json()
    (uma,) = [u for u in usage["usage"] if u["key"] == "uma"]
    seconds = (closed.ended_at - closed.started_at).total_seconds()
    assert uma["gpu_hours"] == pytest.approx(2 * seconds / 3600, rel=1e-3)
    assert hub.api("GET", "/gpuspawner/usage?since=yesterday").status_code == 400
    by_model = hub.api("GET", "/gpuspawner/usage?by=model").json()["usage"]
    assert [u["key"] for u in by_model] == [A100]
    cli = admin_cli(hub, "usage")
    assert cli.returncode == 0 and any(line.startswith("uma ") for line in cli.stdout.splitlines()), cli


def test_with_the_database_down_spawns_fail_cleanly_and_work_again_when_it_is_back(hub, swarm, pg):
    """Guards docs/reliability.md, "The fault model": "no service is made and no GPU stays reserved.
    CPU-only servers start" and "The same hub records and spawns normally"; "Measured on the test
    swarm": "no service is created, no GPU is left held; after the server starts again the same hub
    records and spawns normally"."""
    pg.stop()
    try:
        r = hub.spawn("vera", {"gpu_model": A100})
        assert r.status_code == 503
        assert "GPU ledger database is unreachable" in r.json()["message"]
        assert services_of(swarm, "vera") == []  # no half-made service
        assert "vera" not in held(hub)  # and no GPU kept
        assert hub.server_model("vera") is None
        # A server without GPUs needs no ledger: it starts (NVIDIA_VISIBLE_DEVICES=void) and stops.
        spawn_ready(hub, "walt", {})
        [walt] = services_of(swarm, "walt")
        assert service_gpus(walt) == []
        hub.stop_server("walt")
    finally:
        pg.start()
    spawn_ready(hub, "vera", {"gpu_model": A100})
    assert held(hub) == ["vera"]
    hub.stop_server("vera")
