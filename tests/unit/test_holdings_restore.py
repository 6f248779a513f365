"""A labelled service whose server the hub's database does not have (one started after the
backup a restored database was made from): the holdings' reconciliation over the in-process
fake swarm (tests/fakedocker.py) and a SQLite ledger, as tests/unit/test_holdings.py drives
them. It is stopped with its GPU time in the ledger, counted from its service's creation,
and the reason it ended; one WARNING names its user and server.

And an adopted server whose node's agent has not reported yet (a hub's start): no WARNING
that its device is not in the inventory until the agent has reported without it, and its
ledger row written once its devices are offered."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

import pytest

from gpuspawner.core.reports import parse_report
from gpuspawner.holdings import holdings as holdings_module
from gpuspawner.holdings.holdings import NOT_IN_HUB_DATABASE, Phase, created_at
from gpuspawner.ledger.ledger import Ledger
from tests.unit.test_holdings import A100, World
from tests.unit.test_reports import device, report

HOLDINGS_LOG = holdings_module.__name__
ON_GPU_A = {"gpu-a": [{"uuid": "GPU-a0", "model": A100, "memory_mib": 81920}]}  # GPU-b0 is not listed


def erin_unknown(user: str, server: str) -> bool:
    """JupyterHub's restored database: it has every server but erin's."""
    return user == "erin"


def erins_service(world: World) -> dict:
    [service] = world.fake.services(filters={"name": ["jupyter-erin"]})
    return service


def holdings_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == HOLDINGS_LOG and r.levelno >= logging.WARNING]


async def stopped_as_unknown(world: World, caplog) -> None:
    """Reconcile as the hub does (its restored database lacks erin's server) until erin's
    server is stopped and its GPU given back."""
    owner = world.owner
    await owner.reconcile(erin_unknown)  # adopted: the hub holds its GPU
    assert owner.get("jupyter-erin").phase is Phase.RUNNING
    await owner.reconcile(erin_unknown)  # found unknown once: maybe a spawn about to register
    assert world.fake.services(filters={"name": ["jupyter-erin"]}) != []
    await owner.reconcile(erin_unknown)  # unknown twice in a row: stopped
    assert world.fake.services(filters={"name": ["jupyter-erin"]}) == []
    assert owner.get("jupyter-erin").phase is Phase.REMOVING  # its container still runs
    world.fake.exit_all()
    await owner.reconcile(erin_unknown)
    assert owner.get("jupyter-erin") is None


async def test_a_server_the_restored_database_lacks_is_stopped_with_its_gpu_time_and_the_reason(tmp_path, caplog):
    """Guards docs/backup.md, "Servers started after the backup": "The restarted hub stops it"
    and "its row in the ledger starts at its service's creation and ends when its container has
    exited, with the end reason not in the hub's database"; docs/end-reasons.md, "The reasons":
    "The hub's database has no such server"."""
    world = World(tmp_path)
    world.leftover("erin")  # started after the dump: the swarm runs it, the database has no row of it
    started = created_at(erins_service(world))
    assert started is not None
    caplog.set_level(logging.INFO, logger=HOLDINGS_LOG)
    await stopped_as_unknown(world, caplog)
    [row] = Ledger(world.db_url).history(user="erin")
    assert (row.service, row.devices, row.end_reason) == ("jupyter-erin", ("GPU-b0",), NOT_IN_HUB_DATABASE)
    assert row.started_at == started and row.ended_at is not None and row.ended_at >= started
    # One WARNING, naming the user and the server.
    [warning] = holdings_warnings(caplog)
    assert "erin's default server" in warning and "the hub's database does not have" in warning, warning
    assert repr(NOT_IN_HUB_DATABASE) in warning


async def test_its_gpu_time_is_recorded_from_its_labels_when_its_device_was_never_offered(tmp_path, caplog):
    """Its node's device is not in the inventory (the agents have not reported since the hub
    started): the row the ledger never had is written at its release, from what its labels
    say it held, and closed with the reason."""
    world = World(tmp_path, inventory=ON_GPU_A)
    world.leftover("erin")
    started = created_at(erins_service(world))
    caplog.set_level(logging.INFO, logger=HOLDINGS_LOG)
    await stopped_as_unknown(world, caplog)
    [row] = Ledger(world.db_url).history(user="erin")
    assert (row.devices, row.host, row.model) == (("GPU-b0",), "gpu-b", A100)
    assert (row.started_at, row.end_reason) == (started, NOT_IN_HUB_DATABASE)


async def test_a_server_the_database_has_keeps_running(tmp_path):
    world = World(tmp_path)
    world.leftover("alice")
    owner = world.owner
    for _ in range(4):
        await owner.reconcile(erin_unknown)
    assert owner.get("jupyter-alice").phase is Phase.RUNNING
    [row] = Ledger(world.db_url).open_allocations()
    assert row.service == "jupyter-alice" and row.started_at == created_at(world.fake.services()[0])


@pytest.fixture
def agents_only(tmp_path):
    """A hub whose inventory is its agents' reports alone; alice's server runs on gpu-b."""
    world = World(tmp_path, gpu_inventory_source=["agent"])
    world.leftover("alice")
    return world


def gpu_b_reports(world: World, *uuids: str) -> None:
    body = report(*(device(i, uuid) for i, uuid in enumerate(uuids)), hostname="gpu-b")
    world.owner.cluster.receive(parse_report(json.dumps(body)))


async def test_before_the_agents_report_a_running_servers_device_is_not_said_missing(agents_only, caplog):
    """A hub's start: the servers' devices are not in the inventory until the agents report.
    That is logged at DEBUG; a WARNING only if the node then reports without the device."""
    world = agents_only
    caplog.set_level(logging.DEBUG, logger=HOLDINGS_LOG)
    await world.owner.reconcile()
    assert holdings_warnings(caplog) == []
    assert any("GPU-b0 is not in the inventory yet" in r.getMessage() for r in caplog.records)
    gpu_b_reports(world, "GPU-b1")  # gpu-b's agent reports, without alice's device
    await world.owner.reconcile()
    await world.owner.reconcile()
    [warning] = holdings_warnings(caplog)
    assert "jupyter-alice: GPU-b0 is not in the inventory, although gpu-b has reported" in warning


async def test_an_adopted_servers_ledger_row_is_written_once_its_devices_are_offered(agents_only):
    """Its row starts at its service's creation, not when the agent's report came."""
    world = agents_only
    owner = world.owner
    await owner.reconcile()
    assert Ledger(world.db_url).open_allocations() == []  # nothing booked yet
    gpu_b_reports(world, "GPU-b0")
    assert [a.uuids for a in [owner.allocator.holding("jupyter-alice")]] == [("GPU-b0",)]
    await owner.reconcile()
    [row] = Ledger(world.db_url).open_allocations()
    assert (row.service, row.devices) == ("jupyter-alice", ("GPU-b0",))
    assert row.started_at == created_at(world.fake.services()[0])


def test_the_swarms_creation_times_are_read_to_the_microsecond_and_never_later_than_now():
    assert created_at({"CreatedAt": "2024-05-01T12:00:00.123456789Z"}).isoformat() == "2024-05-01T12:00:00.123456+00:00"
    assert created_at({"CreatedAt": "2024-05-01T14:00:00+02:00"}).isoformat() == "2024-05-01T12:00:00+00:00"
    future = created_at({"CreatedAt": "3024-05-01T12:00:00Z"})
    assert future is not None and future.year < 3024
    for text in (None, "", "yesterday", "2024-13-01T00:00:00Z", 12):
        assert created_at({"CreatedAt": text}) is None


async def test_a_restored_ledgers_row_of_a_server_stopped_since_the_backup_ends_at_the_restart(tmp_path):
    """Guards docs/backup.md, "Servers started after the backup": "An allocation that was
    still open at the backup and ended after it is open again in the restored ledger: the
    restarted hub finds its service gone and closes it then, as service gone"."""
    world = World(tmp_path)
    ledger = Ledger(world.db_url)
    ledger.open("jupyter-frank", "frank", "", "gpu-b", A100, ["GPU-b0"], [1000])  # as the backup has it
    ledger.note_tasks("jupyter-frank", ["taskendedsince0001"])  # its container has exited since
    before = datetime.now(timezone.utc)
    await world.owner.reconcile()
    [row] = ledger.history(user="frank")
    assert row.end_reason == "service gone" and row.ended_at is not None and row.ended_at >= before
