"""Reservations in the ledger (gpuspawner.ledger.reservations) on a real SQLite file,
migration 0006, which adds their table to a ledger at 0005, and 0007, which adds
share totals.

``ReservationsContract`` holds the behaviour every backend must show, as
tests/unit/test_ledger.py's ``LedgerContract`` does; a subclass provides ``url``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa

from gpuspawner.core.reservations import Reservation
from gpuspawner.ledger import migrations as ledger_migrations
from gpuspawner.ledger.ledger import Ledger, LedgerError

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
TABLE = "gpuspawner_reservations"


def course(**kw) -> Reservation:
    """CS101's 2 A100 every Tuesday 14:00–16:00 in Berlin, from 2026-03-24 (the
    Tuesday before the clocks go forward), unless ``kw`` says otherwise."""
    fields: dict = dict(
        group="cs101",
        model="NVIDIA A100 80GB PCIe",
        count=2,
        start=datetime(2026, 3, 24, 14, 0, tzinfo=BERLIN),
        end=datetime(2026, 3, 24, 16, 0, tzinfo=BERLIN),
        weekly=True,
        timezone="Europe/Berlin",
        name="CS101 lab",
        created_by="admin",
        lend=True,
    )
    fields.update(kw)
    return Reservation(**fields)


def one_off(**kw) -> Reservation:
    """A one-off day of 4 H100 for the thesis group, given in UTC."""
    fields: dict = dict(
        group="thesis",
        model="NVIDIA H100",
        count=4,
        start=datetime(2026, 5, 2, 8, 0, tzinfo=UTC),
        end=datetime(2026, 5, 2, 20, 0, tzinfo=UTC),
        created_by="bob",
    )
    fields.update(kw)
    return Reservation(**fields)


def stored_rows(engine: sa.Engine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT id, group_name, count FROM {TABLE} ORDER BY id"))]


class ReservationsContract:
    """Reservations on any backend; a subclass provides the ``url`` fixture (a fresh,
    empty database for each test)."""

    @pytest.fixture
    def ledger(self, url):
        ledger = Ledger(url)
        yield ledger
        ledger.dispose()

    def test_a_weekly_and_a_one_off_reservation_read_back_as_stored(self, ledger, url):
        made = datetime(2026, 3, 1, 9, 30, 15, 123456, tzinfo=UTC)
        weekly = ledger.add_reservation(course(), created_at=made)
        once = ledger.add_reservation(one_off(), created_at=made + timedelta(minutes=1))
        assert weekly.id is not None and once.id is not None

        again = Ledger(url)  # another Ledger on the same database: nothing is cached
        try:
            back = {r.id: r for r in again.reservations()}
        finally:
            again.dispose()
        w, o = back[weekly.id], back[once.id]
        assert w == weekly and o == once  # every field but created_at (not compared by ==)
        assert w.as_json() == weekly.as_json()  # created_at too, and every field as shown
        assert (w.group, w.model, w.count, w.weekly, w.lend, w.timezone, w.name, w.created_by) == (
            "cs101",
            "NVIDIA A100 80GB PCIe",
            2,
            True,
            True,
            "Europe/Berlin",
            "CS101 lab",
            "admin",
        )
        assert w.start == datetime(2026, 3, 24, 13, 0, tzinfo=UTC)  # 14:00 CET
        assert w.start.tzinfo is UTC and w.created_at == made and w.created_at.tzinfo is UTC
        # The time zone came back: a week on, past the change to summer time, 14:00 local is 12:00 UTC.
        assert w.window(1).start == datetime(2026, 3, 31, 12, 0, tzinfo=UTC)
        assert w.window(1).start.astimezone(BERLIN).hour == 14
        assert (o.weekly, o.lend, o.timezone, o.name, o.label, o.count) == (False, False, "UTC", "", "thesis", 4)
        assert (o.start, o.end) == (datetime(2026, 5, 2, 8, 0, tzinfo=UTC), datetime(2026, 5, 2, 20, 0, tzinfo=UTC))
        assert o.window(1) == o.window(0)  # one-off: only its first window

    def test_a_share_total_reads_back_as_stored_and_counts_whole_gpus_rounded_up(self, ledger, url):
        shares = ledger.add_reservation(one_off(count=2.5, shares=True))
        exact = ledger.add_reservation(one_off(count=3, shares=True))
        back = {r.id: r for r in ledger.reservations()}
        assert back[shares.id] == shares and (back[shares.id].count, back[shares.id].milli) == (2.5, 2500)
        assert back[exact.id].shares and back[exact.id].count == 3 and isinstance(back[exact.id].count, int)
        assert back[shares.id].as_json()["count"] == 2.5 and back[shares.id].as_json()["shares"] is True
        # A hub that predates the share total reads ``count``: the total rounded up, never less.
        assert [row[2] for row in stored_rows(ledger.engine)] == [3, 3]

    def test_a_weekly_reservations_until_reads_back_as_stored(self, ledger):
        ends = ledger.add_reservation(course(until=datetime(2026, 7, 14, 12, 0, tzinfo=BERLIN)))
        (back,) = ledger.reservations()
        assert back == ends and back.until == datetime(2026, 7, 14, 10, 0, tzinfo=UTC) and back.until.tzinfo is UTC
        assert ledger.add_reservation(course()).until is None

    def test_add_returns_distinct_ids_and_sets_created_at(self, ledger):
        before = datetime.now(UTC)
        added = [ledger.add_reservation(one_off(count=n)) for n in (1, 2, 3)]
        after = datetime.now(UTC)
        ids = [r.id for r in added]
        assert all(isinstance(i, int) for i in ids) and len(set(ids)) == 3
        for r in added:
            assert r.created_at is not None and before <= r.created_at <= after
        assert [r.count for r in added] == [1, 2, 3]  # each returned as given, plus id and created_at
        assert sorted(r.id for r in ledger.reservations()) == sorted(ids)

    def test_created_at_is_the_given_one_else_the_reservations_own(self, ledger):
        own = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
        given = datetime(2026, 2, 3, 4, 5, tzinfo=BERLIN)
        assert ledger.add_reservation(one_off(created_at=own)).created_at == own
        stored = ledger.add_reservation(one_off(created_at=own), created_at=given)
        assert stored.created_at == given and stored.created_at.tzinfo is UTC
        assert sorted(r.created_at for r in ledger.reservations()) == [own, given]

    def test_reservations_are_listed_by_start_then_id(self, ledger):
        late = ledger.add_reservation(
            one_off(start=datetime(2026, 6, 1, 8, tzinfo=UTC), end=datetime(2026, 6, 1, 9, tzinfo=UTC))
        )
        early = ledger.add_reservation(course())  # 2026-03-24
        tie_a = ledger.add_reservation(one_off(group="a"))  # 2026-05-02, twice
        tie_b = ledger.add_reservation(one_off(group="b"))
        middle = ledger.add_reservation(
            one_off(start=datetime(2026, 4, 1, 8, tzinfo=UTC), end=datetime(2026, 4, 1, 9, tzinfo=UTC))
        )
        assert tie_a.id < tie_b.id
        assert [r.id for r in ledger.reservations()] == [early.id, middle.id, tie_a.id, tie_b.id, late.id]

    def test_an_empty_ledger_has_no_reservations(self, ledger):
        assert ledger.reservations() == []
        assert ledger.remove_reservation(1) is None

    def test_remove_returns_the_removed_reservation_and_then_none(self, ledger):
        keep = ledger.add_reservation(course())
        gone = ledger.add_reservation(one_off(), created_at=datetime(2026, 1, 1, tzinfo=UTC))
        removed = ledger.remove_reservation(gone.id)
        assert removed == gone and removed.created_at == gone.created_at
        assert ledger.reservations() == [keep]
        assert ledger.remove_reservation(gone.id) is None
        assert ledger.reservations() == [keep]

    def test_the_id_of_a_removed_reservation_is_not_given_again(self, ledger):
        first = ledger.add_reservation(one_off())
        second = ledger.add_reservation(one_off())
        ledger.remove_reservation(second.id)  # the newest: SQLite's plain rowid would give its id again
        third = ledger.add_reservation(one_off())
        assert third.id not in (first.id, second.id)
        assert [r.id for r in ledger.reservations()] == [first.id, third.id]

    @pytest.mark.parametrize(
        "call, message",
        [
            (lambda ledger: ledger.add_reservation("cs101"), "must be a Reservation, not str"),
            (lambda ledger: ledger.add_reservation(replace(one_off(), id=3)), "#3 is in the ledger already"),
            (lambda ledger: ledger.add_reservation(one_off(created_by="x" * 256)), "created_by is longer than 255"),
            (
                lambda ledger: ledger.add_reservation(one_off(), datetime(2026, 1, 1)),
                "created_at must be timezone-aware",
            ),
            (lambda ledger: ledger.remove_reservation("1"), "a whole number, not '1'"),
            (lambda ledger: ledger.remove_reservation(True), "a whole number, not True"),
        ],
    )
    def test_bad_arguments_are_refused_and_change_nothing(self, ledger, call, message):
        kept = ledger.add_reservation(course())
        with pytest.raises(ValueError, match=message):
            call(ledger)
        assert ledger.reservations() == [kept]


class TestReservationsOnSQLite(ReservationsContract):
    @pytest.fixture
    def url(self, tmp_path):
        return f"sqlite:///{tmp_path}/gpuspawner.sqlite"


def test_an_unusable_database_raises_ledger_error(tmp_path):
    folder = tmp_path / "not-yet"
    ledger = Ledger(f"sqlite:///{folder}/gpuspawner.sqlite")
    for call, doing in (
        (lambda: ledger.add_reservation(one_off()), "storing the reservation thesis failed"),
        (ledger.reservations, "reading the reservations failed"),
        (lambda: ledger.remove_reservation(1), "removing reservation #1 failed"),
    ):
        with pytest.raises(LedgerError, match=doing) as e:
            call()
        assert "unable to open database file" in str(e.value) and "\n" not in str(e.value)
    folder.mkdir()  # usable now: the same Ledger works
    assert [r.group for r in [ledger.add_reservation(one_off())]] == ["thesis"]
    assert len(ledger.reservations()) == 1
    ledger.dispose()


def test_0006_adds_the_table_to_a_ledger_at_0005_keeping_its_rows(tmp_path):
    url = f"sqlite:///{tmp_path}/gpuspawner.sqlite"
    engine = sa.create_engine(url)
    start = datetime(2026, 3, 1, 8, 0)  # naive UTC, as the ledger stores times
    try:
        ledger_migrations.upgrade(engine, revision="0005")
        assert TABLE not in sa.inspect(engine).get_table_names()
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO gpuspawner_allocations (id, service, username, server, host, model, started_at,"
                    " end_reason, tasks, peak_memory_mib) VALUES"
                    " (5, 'svc-alice', 'alice', '', 'gpu-a', 'A100', :start, '', 't1', 1234)"
                ),
                dict(start=start),
            )
            conn.execute(
                sa.text(
                    "INSERT INTO gpuspawner_allocation_devices (allocation_id, position, uuid, milli)"
                    " VALUES (5, 0, 'GPU-0', 500)"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO gpuspawner_queue (id, service, username, server, model, priority, since, request)"
                    " VALUES (3, 'svc-bob', 'bob', '', 'A100', 0, :start, '{}')"
                ),
                dict(start=start),
            )

        ledger = Ledger(url)  # upgrades to the head on first use
        try:
            assert ledger.reservations() == []
            assert ledger_migrations.current(engine) == (ledger_migrations.head(),)
            (record,) = ledger.open_allocations()
            assert (record.id, record.service, record.devices, record.milli, record.tasks, record.peak_memory_mib) == (
                5,
                "svc-alice",
                ("GPU-0",),
                (500,),
                ("t1",),
                1234,
            )
            assert record.started_at == start.replace(tzinfo=UTC)
            assert [(w.id, w.service, w.user) for w in ledger.waiting()] == [(3, "svc-bob", "bob")]
            stored = ledger.add_reservation(course())
            assert ledger.reservations() == [stored]
        finally:
            ledger.dispose()

        # Back to 0005: the reservations go, the rest stays.
        ledger_migrations.downgrade(engine, "0005")
        assert ledger_migrations.current(engine) == ("0005",)
        assert TABLE not in sa.inspect(engine).get_table_names()
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT id FROM gpuspawner_allocations")).scalars().all() == [5]
            assert conn.execute(sa.text("SELECT id FROM gpuspawner_queue")).scalars().all() == [3]

        # And up again: an empty table, whose rows the Ledger writes and reads.
        ledger_migrations.upgrade(engine, revision="0006")
        assert stored_rows(engine) == []
    finally:
        engine.dispose()


def test_a_name_left_out_is_stored_as_empty(tmp_path):
    """The name column's default (""), for rows written without one."""
    url = f"sqlite:///{tmp_path}/gpuspawner.sqlite"
    ledger = Ledger(url)
    try:
        ledger.reservations()  # the tables
        with ledger.engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {TABLE} (group_name, model, count, starts_at, ends_at, weekly, timezone,"
                    " created_by, created_at) VALUES ('g', 'A100', 1, :a, :b, 0, 'UTC', '', :a)"
                ),
                dict(a=datetime(2026, 1, 1, 8), b=datetime(2026, 1, 1, 9)),
            )
        (r,) = ledger.reservations()
        assert (r.name, r.label, r.weekly, r.start) == ("", "g", False, datetime(2026, 1, 1, 8, tzinfo=UTC))
    finally:
        ledger.dispose()


def test_0007_adds_share_totals_keeping_the_reservations_of_whole_gpus(tmp_path):
    """Guards docs/reservations.md, "Share totals (--shares)": "keeps a share total as its count
    rounded up to whole GPUs: at least as much is kept"."""
    url = f"sqlite:///{tmp_path}/gpuspawner.sqlite"
    engine = sa.create_engine(url)
    try:
        ledger_migrations.upgrade(engine, revision="0006")
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {TABLE} (id, name, group_name, model, count, starts_at, ends_at, weekly, lend,"
                    " timezone, created_by, created_at) VALUES (4, '', 'thesis', 'NVIDIA H100', 4, :start, :end,"
                    " 0, 0, 'UTC', 'bob', :start)"
                ),
                dict(start=datetime(2026, 5, 2, 8, 0), end=datetime(2026, 5, 2, 20, 0)),
            )
        ledger = Ledger(url)
        try:
            (old,) = ledger.reservations()
            assert ledger_migrations.current(engine) == (ledger_migrations.head(),)
            with engine.connect() as conn:
                made = conn.execute(sa.text(f"SELECT sql FROM sqlite_master WHERE name = '{TABLE}'")).scalar_one()
            assert "AUTOINCREMENT" in made
            assert (old.id, old.count, old.shares, old.milli) == (4, 4, False, 4000)
            ledger.add_reservation(one_off(count=0.75, shares=True))
        finally:
            ledger.dispose()
        ledger_migrations.downgrade(engine, "0006")  # the share total goes; its count (1) stays
        assert stored_rows(engine) == [(4, "thesis", 4), (5, "thesis", 1)]
        with engine.connect() as conn:  # an id is still never given again
            made = conn.execute(sa.text(f"SELECT sql FROM sqlite_master WHERE name = '{TABLE}'")).scalar_one()
        assert "AUTOINCREMENT" in made
    finally:
        engine.dispose()
