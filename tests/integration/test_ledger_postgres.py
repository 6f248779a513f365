"""The allocation ledger on a real PostgreSQL server that these tests start themselves
(devtools/postgres.py): every behaviour of the SQLite tests, the hub's tables in the
same database, and the server stopping and coming back under a running Ledger.

Outside CI the tests are skipped when this machine cannot run a server (no
``postgresql`` package, no psycopg); under ``CI=true`` that is a failure.

Guards docs/ledger.md, "Tests and benchmark": "the same tests again on a real PostgreSQL server" and
"run every SQLite test against it, stop and restart it under a running ledger".
"""

from __future__ import annotations

import itertools

import pytest

from gpuspawner.ledger.ledger import Ledger, LedgerError
from tests.unit.test_ledger import LedgerContract, at, gpu
from tests.unit.test_ledger_reservations import ReservationsContract

_databases = itertools.count(1)


class TestLedgerOnPostgres(LedgerContract):
    @pytest.fixture
    def url(self, pg):
        return pg.create_database(f"ledger_{next(_databases)}")


class TestReservationsOnPostgres(ReservationsContract):
    @pytest.fixture
    def url(self, pg):
        return pg.create_database(f"ledger_{next(_databases)}")


@pytest.fixture
def running(pg):
    """The server, started again after the test whatever the test did to it."""
    yield pg
    if not pg.running():
        pg.start()


def test_a_stopped_database_raises_ledger_error_and_the_same_ledger_recovers(running):
    pg = running
    url = pg.create_database(f"ledger_{next(_databases)}")
    ledger = Ledger(url)
    gpu(ledger, "before")  # tables created, a pooled connection in hand

    pg.stop()
    with pytest.raises(LedgerError) as e:
        gpu(ledger, "during", devices=["GPU-2"], start=1)
    message = str(e.value)
    assert message.startswith(f"GPU ledger database postgresql+psycopg://gpuspawner:***@127.0.0.1:{pg.port}/")
    assert "recording the allocation of during failed" in message
    assert "Connection refused" in message
    assert pg.password not in message and "\n" not in message
    for read in (ledger.open_allocations, ledger.history, ledger.usage):
        with pytest.raises(LedgerError, match="Connection refused"):
            read()
    with pytest.raises(LedgerError, match="closing the allocation of before failed"):
        ledger.close("before")

    pg.start()
    assert [r.service for r in ledger.open_allocations()] == ["before"]  # "during" left nothing
    gpu(ledger, "after", devices=["GPU-3"], start=2)
    assert ledger.close("before", at(3)) is not None
    assert [r.service for r in ledger.open_allocations()] == ["after"]
    ledger.dispose()


def test_a_ledger_made_while_the_database_is_down_creates_its_tables_once_it_is_up(running):
    pg = running
    url = pg.create_database(f"ledger_{next(_databases)}")
    pg.stop()
    ledger = Ledger(url)  # the hub starts while its database is still down
    with pytest.raises(LedgerError, match="Connection refused"):
        ledger.open_allocations()

    pg.start()
    gpu(ledger, "svc")
    assert [r.service for r in ledger.open_allocations()] == ["svc"]
    ledger.dispose()


def test_a_wrong_password_is_reported_without_the_password(pg):
    url = pg.create_database(f"ledger_{next(_databases)}").replace(pg.password, "not-the-password")
    ledger = Ledger(url)
    with pytest.raises(LedgerError, match="password authentication failed") as e:
        ledger.open_allocations()
    assert "not-the-password" not in str(e.value)
    ledger.dispose()
