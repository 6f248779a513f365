"""The allocation ledger (gpuspawner.ledger.ledger) on a real SQLite file.

``LedgerContract`` holds the behaviour every backend must show; it runs here on SQLite
and in tests/integration/test_ledger_postgres.py on a real PostgreSQL server.

Guards docs/ledger.md, "Tests and benchmark": "The ledger's tests run on a SQLite file, and the same
tests again on a real PostgreSQL server".
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gpuspawner.ledger import migrations as ledger_migrations
from gpuspawner.ledger.ledger import SUPERSEDED, Ledger, LedgerError, Usage, default_db_url, hours_within
from gpuspawner.ledger.migrations import VERSION_TABLE
from gpuspawner.ledger.schema import TASKS_MAX, metadata

UTC = timezone.utc
# A fixed past day, so every range below is exact; "now" is well after it.
T0 = (datetime.now(UTC) - timedelta(days=30)).replace(hour=0, minute=0, second=0, microsecond=0)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def gpu(ledger: Ledger, service: str, user: str = "alice", *, devices=("GPU-1",), milli=None, start=0.0, **kw) -> int:
    """Open an allocation with the given (or plain) fields, started ``start`` hours after T0."""
    fields = {"server": "", "host": "gpu-a", "model": "NVIDIA A100 80GB PCIe"}
    fields.update(kw)
    milli = [1000] * len(devices) if milli is None else milli
    return ledger.open(service, user, devices=list(devices), milli=list(milli), started_at=at(start), **fields)


def assert_usable(url: str) -> None:
    """A new Ledger on ``url`` records an allocation and reads it back."""
    ledger = Ledger(url)
    try:
        gpu(ledger, "svc")
        assert [r.service for r in ledger.open_allocations()] == ["svc"]
    finally:
        ledger.dispose()


def ledger_tables(engine: sa.Engine) -> set[str]:
    return {t for t in sa.inspect(engine).get_table_names() if t.startswith("gpuspawner_")}


def columns(engine: sa.Engine, table: str) -> list[str]:
    return [c["name"] for c in sa.inspect(engine).get_columns(table)]


def write_0001(engine: sa.Engine, allocations: list[tuple]) -> None:
    """Rows as revision 0001 stored them: (id, user, model, start, end or None, float
    shares) per allocation, service ``svc-<user>``, devices GPU-0, GPU-1, ..."""
    with engine.begin() as conn:
        for id_, user, model, start, end, shares in allocations:
            conn.execute(
                sa.text(
                    "INSERT INTO gpuspawner_allocations (id, service, username, server, host, model,"
                    " started_at, ended_at, end_reason) VALUES (:id, :service, :user, '', 'gpu-a', :model,"
                    " :start, :end, '')"
                ),
                dict(
                    id=id_,
                    service=f"svc-{user}",
                    user=user,
                    model=model,
                    start=naive(at(start)),
                    end=None if end is None else naive(at(end)),
                ),
            )
            for position, share in enumerate(shares):
                conn.execute(
                    sa.text(
                        "INSERT INTO gpuspawner_allocation_devices (allocation_id, position, uuid, share)"
                        " VALUES (:id, :position, :uuid, :share)"
                    ),
                    dict(id=id_, position=position, uuid=f"GPU-{position}", share=share),
                )


def naive(moment: datetime) -> datetime:
    """As the ledger stores times: naive UTC."""
    return moment.astimezone(UTC).replace(tzinfo=None)


def device_rows(conn: sa.Connection, column: str) -> list[tuple]:
    return [
        tuple(row)
        for row in conn.execute(
            sa.text(
                f"SELECT allocation_id, position, uuid, {column} FROM gpuspawner_allocation_devices"
                " ORDER BY allocation_id, position"
            )
        )
    ]


class LedgerContract:
    """Behaviour of the ledger on any backend; a subclass provides the ``url`` fixture
    (a fresh, empty database for each test)."""

    @pytest.fixture
    def ledger(self, url):
        ledger = Ledger(url)
        yield ledger
        ledger.dispose()

    # --- open / close -------------------------------------------------------------

    def test_open_records_every_field_in_utc(self, ledger):
        cet = timezone(timedelta(hours=1))
        started = datetime(2026, 3, 1, 13, 30, 15, 250000, tzinfo=cet)
        new_id = ledger.open(
            "jupyter-alice-big", "alice", "big", "gpu-b", "A100", ["GPU-b1", "GPU-a0"], [1000, 500], started
        )

        (record,) = ledger.open_allocations()
        assert record.id == new_id
        assert (record.service, record.user, record.server, record.host, record.model) == (
            "jupyter-alice-big",
            "alice",
            "big",
            "gpu-b",
            "A100",
        )
        assert record.devices == ("GPU-b1", "GPU-a0")  # the order given, not sorted
        assert record.milli == (1000, 500)
        assert record.gpus == 1.5
        assert record.tasks == ()
        assert record.started_at == started and record.started_at.tzinfo == UTC
        assert record.started_at.hour == 12  # 13:30 at +01:00
        assert record.ended_at is None and record.end_reason == ""

    def test_open_without_a_start_time_starts_now(self, ledger):
        before = datetime.now(UTC)
        ledger.open("svc", "alice", "", "gpu-a", "A100", ["GPU-1"], [1000])
        (record,) = ledger.open_allocations()
        assert before <= record.started_at <= datetime.now(UTC)

    def test_opening_the_same_allocation_again_returns_the_open_one(self, ledger):
        first = gpu(ledger, "svc", devices=["GPU-1", "GPU-2"], milli=[500, 500])
        again = gpu(ledger, "svc", devices=["GPU-1", "GPU-2"], milli=[500, 500], start=3)
        assert again == first
        (record,) = ledger.history()
        assert record.started_at == at(0)  # the first start counts, not the retry's

    def test_opening_a_different_allocation_supersedes_the_open_one(self, ledger):
        first = gpu(ledger, "svc", devices=["GPU-1"])
        second = gpu(ledger, "svc", devices=["GPU-2"], start=2)
        assert second != first
        old, new = ledger.history()
        assert (old.id, old.ended_at, old.end_reason) == (first, at(2), SUPERSEDED)
        assert (new.id, new.devices, new.ended_at) == (second, ("GPU-2",), None)
        assert [r.id for r in ledger.open_allocations()] == [second]

    def test_a_start_from_before_the_open_row_does_not_take_its_time(self, ledger):
        """An adopted service's row starts at the service's creation; where the ledger
        already has a row open for it (other devices: one was unhealthy at adoption), that
        row counts its time until now and the new row starts now: no GPU time is lost."""
        first = gpu(ledger, "svc", devices=["GPU-1", "GPU-2"])
        before = datetime.now(UTC)
        second = ledger.open("svc", "alice", "", "gpu-a", "A100", ["GPU-1"], [1000], at(-1))
        old, new = ledger.history()
        assert (old.id, old.end_reason, new.id) == (first, SUPERSEDED, second)
        assert before <= old.ended_at == new.started_at <= datetime.now(UTC)

    def test_close_ends_the_allocation_and_is_idempotent(self, ledger):
        gpu(ledger, "svc")
        closed = ledger.close("svc", at(5), reason="stopped")
        assert (closed.ended_at, closed.end_reason) == (at(5), "stopped")
        assert ledger.close("svc", at(9)) is None
        assert ledger.close("never-opened") is None
        (record,) = ledger.history()
        assert (record.ended_at, record.end_reason) == (at(5), "stopped")
        assert ledger.open_allocations() == []

    def test_a_closed_service_can_be_opened_again(self, ledger):
        first = gpu(ledger, "svc")
        ledger.close("svc", at(1))
        second = gpu(ledger, "svc", start=2)
        assert second != first
        assert [(r.id, r.ended_at) for r in ledger.history()] == [(first, at(1)), (second, None)]

    def test_close_before_the_start_is_refused_and_changes_nothing(self, ledger):
        gpu(ledger, "svc", start=4)
        with pytest.raises(ValueError, match="before svc's allocation started"):
            ledger.close("svc", at(3))
        assert len(ledger.open_allocations()) == 1

    def test_close_missing_closes_only_services_that_are_gone(self, ledger):
        gpu(ledger, "kept", devices=["GPU-1"])
        gpu(ledger, "gone", devices=["GPU-2"], start=1)
        closed = ledger.close_missing({"kept"}, at(6), reason="service gone at hub start")
        assert [(r.service, r.ended_at, r.end_reason) for r in closed] == [("gone", at(6), "service gone at hub start")]
        assert [r.service for r in ledger.open_allocations()] == ["kept"]
        assert ledger.close_missing({"kept"}) == []

    def test_an_allocation_without_gpus_is_recorded(self, ledger):
        ledger.open("cpu-svc", "carol", "", "", "", [], [], at(0))
        (record,) = ledger.open_allocations()
        assert (record.devices, record.milli, record.gpus) == ((), (), 0)

    # --- swarm tasks ----------------------------------------------------------------

    def test_note_tasks_adds_ids_in_order_without_repeats(self, ledger):
        gpu(ledger, "svc")
        assert ledger.note_tasks("svc", ["t1", "t2"]) is True
        assert ledger.note_tasks("svc", iter(["t2", "t3", "t1", "t3"])) is True
        assert ledger.note_tasks("svc", []) is True
        (record,) = ledger.open_allocations()
        assert record.tasks == ("t1", "t2", "t3")

    def test_noting_the_same_tasks_again_writes_nothing(self, ledger):
        gpu(ledger, "svc")
        ledger.note_tasks("svc", ["t1", "t2"])
        before = ledger.open_allocations()
        updates = []

        def count_updates(conn, cursor, statement, *args):
            if statement.lstrip().upper().startswith("UPDATE"):
                updates.append(statement)

        sa.event.listen(ledger.engine, "before_cursor_execute", count_updates)
        try:
            assert ledger.note_tasks("svc", ("t2", "t1", "t2")) is True
        finally:
            sa.event.remove(ledger.engine, "before_cursor_execute", count_updates)
        assert updates == []
        assert ledger.open_allocations() == before

    def test_note_tasks_without_an_open_allocation_returns_false(self, ledger):
        assert ledger.note_tasks("never-opened", ["t1"]) is False
        gpu(ledger, "svc")
        ledger.note_tasks("svc", ["t1"])
        ledger.close("svc", at(1))
        assert ledger.note_tasks("svc", ["t2"]) is False
        (record,) = ledger.history()
        assert record.tasks == ("t1",)  # a closed allocation keeps its tasks

    def test_tasks_belong_to_one_allocation(self, ledger):
        gpu(ledger, "svc", devices=["GPU-1"])
        ledger.note_tasks("svc", ["t1"])
        gpu(ledger, "svc", devices=["GPU-1"], start=1)  # the same again: still the open one
        assert [r.tasks for r in ledger.open_allocations()] == [("t1",)]
        gpu(ledger, "svc", devices=["GPU-2"], start=2)  # a different one supersedes it
        ledger.note_tasks("svc", ["t2"])
        old, new = ledger.history()
        assert (old.end_reason, old.tasks) == (SUPERSEDED, ("t1",))
        assert (new.ended_at, new.tasks) == (None, ("t2",))

    def test_tasks_survive_a_hub_restart(self, ledger, url):
        gpu(ledger, "svc")
        ledger.note_tasks("svc", ["k3f9x0q2m1", "ABC123"])
        ledger.dispose()
        restarted = Ledger(url)  # a new hub process on the same database
        try:
            (record,) = restarted.open_allocations()
            assert record.tasks == ("k3f9x0q2m1", "ABC123")
            assert restarted.note_tasks("svc", ["ABC123", "z9"]) is True
            closed = restarted.close("svc", at(1))
            assert closed.tasks == ("k3f9x0q2m1", "ABC123", "z9")
        finally:
            restarted.dispose()
        assert [r.tasks for r in ledger.history()] == [("k3f9x0q2m1", "ABC123", "z9")]

    def test_only_the_newest_tasks_are_kept(self, ledger):
        gpu(ledger, "svc")
        ids = [f"task{i}" for i in range(70)]
        ledger.note_tasks("svc", ids[:40])
        ledger.note_tasks("svc", ids[30:])
        (record,) = ledger.open_allocations()
        assert record.tasks == tuple(ids[-TASKS_MAX:]) and TASKS_MAX == 64

    def test_tasks_noted_by_another_process_meanwhile_are_kept(self, ledger, url):
        # Another Ledger (another process) adds an id between this one's read and write.
        other = Ledger(url)
        gpu(ledger, "svc")
        ledger.note_tasks("svc", ["t1"])
        other.open_allocations()  # its schema check done before the race
        sneaked = []

        def note_first(conn, cursor, statement, *args):
            if statement.lstrip().upper().startswith("UPDATE") and not sneaked:
                sneaked.append(other.note_tasks("svc", ["t2"]))

        sa.event.listen(ledger.engine, "before_cursor_execute", note_first)
        try:
            assert ledger.note_tasks("svc", ["t3"]) is True
        finally:
            sa.event.remove(ledger.engine, "before_cursor_execute", note_first)
            other.dispose()
        assert sneaked == [True]
        (record,) = ledger.open_allocations()
        assert record.tasks == ("t1", "t2", "t3")

    # --- history and usage --------------------------------------------------------

    @pytest.fixture
    def day(self, ledger):
        """alice: A100 × 1 from 0h to 4h and GTX 0.5 + 0.25 from 2h to 3h; bob: A100 × 1
        from 3h, still open; carol: no GPU from 1h to 5h."""
        gpu(ledger, "a", "alice", devices=["GPU-1"], start=0)
        gpu(ledger, "b", "alice", devices=["GPU-2", "GPU-3"], milli=[500, 250], model="GTX 1070", host="gpu-b", start=2)
        gpu(ledger, "c", "bob", devices=["GPU-4"], start=3)
        ledger.open("d", "carol", "", "", "", [], [], at(1))
        ledger.close("a", at(4))
        ledger.close("b", at(3))
        ledger.close("d", at(5))
        return ledger

    def test_history_holds_allocations_overlapping_the_range(self, day):
        def services(**kw):
            return [r.service for r in day.history(**kw)]

        assert services() == ["a", "d", "b", "c"]  # by start
        assert services(user="alice") == ["a", "b"]
        assert services(since=at(4)) == ["d", "c"]  # "a" ended exactly at 4h
        assert services(until=at(2)) == ["a", "d"]  # "b" started exactly at 2h
        assert services(since=at(2.5), until=at(2.6)) == ["a", "d", "b"]
        assert services(user="bob", since=at(100)) == ["c"]  # still open
        assert services(device="GPU-3") == ["b"]
        assert services(device="GPU-3", until=at(1)) == []
        assert services(user="nobody") == []

    def test_usage_sums_overlaps_times_shares(self, day):
        # 1h..6h: alice 3h × 1 (a) + 1h × 0.75 (b); bob 3h × 1 (c, open: counted until 6h)
        assert day.usage(at(1), at(6)) == [Usage("alice", pytest.approx(3.75)), Usage("bob", pytest.approx(3.0))]
        assert day.usage(at(1), at(6), by="model") == [
            Usage("NVIDIA A100 80GB PCIe", pytest.approx(6.0)),
            Usage("GTX 1070", pytest.approx(0.75)),
        ]
        # from the beginning to 2.5h: alice 2.5h × 1 + 0.5h × 0.75; bob had not started
        assert day.usage(None, at(2.5)) == [Usage("alice", pytest.approx(2.875))]
        assert day.usage(at(-10), at(-1)) == []  # before everything
        assert day.usage(at(2.5), at(2.5)) == []  # an empty range

    def test_usage_by_end_reason_counts_idle_gpu_hours_apart(self, day):
        day.close("c", at(6), "idle")
        # 1h..6h: a (3h × 1) and b (1h × 0.75) closed with no reason given; c (3h × 1) stopped idle
        assert day.usage(at(1), at(6), by="reason") == [
            Usage("", pytest.approx(3.75)),
            Usage("idle", pytest.approx(3.0)),
        ]

    def test_usage_of_allocations_written_as_float_shares_is_the_same_after_the_upgrade(self, url):
        # An older gpuspawner (revision 0001) stored shares as floats; usage then was
        # hours × the sum of the floats, computed here by hand.
        engine = sa.create_engine(url)
        try:
            ledger_migrations.upgrade(engine, revision="0001")
            write_0001(
                engine,
                [
                    (1, "alice", "A100", 0, 2.5, [0.6, 0.6]),
                    (2, "bob", "A100", 1, 4, [0.333]),
                    (3, "carol", "T4", 0, 4, [1.0, 0.125]),
                    (4, "alice", "T4", 3, 5, [0.25]),
                ],
            )
        finally:
            engine.dispose()
        ledger = Ledger(url)  # upgrades to milli on first use
        try:
            # alice: 2.5h × 1.2 + 2h × 0.25; bob: 3h × 0.333; carol: 4h × 1.125
            assert ledger.usage(at(0), at(10)) == [
                Usage("carol", pytest.approx(4.5)),
                Usage("alice", pytest.approx(3.5)),
                Usage("bob", pytest.approx(0.999)),
            ]
            assert ledger.usage(at(0), at(10), by="model") == [
                Usage("T4", pytest.approx(5.0)),
                Usage("A100", pytest.approx(3.999)),
            ]
            # 1h..3h: carol 2h × 1.125; alice 1.5h × 1.2 (alice's T4 starts at 3h); bob 2h × 0.333
            assert ledger.usage(at(1), at(3)) == [
                Usage("carol", pytest.approx(2.25)),
                Usage("alice", pytest.approx(1.8)),
                Usage("bob", pytest.approx(0.666)),
            ]
        finally:
            ledger.dispose()

    def test_usage_counts_an_open_allocation_until_now(self, ledger):
        now = datetime.now(UTC)
        ledger.open("svc", "alice", "", "gpu-a", "A100", ["GPU-1", "GPU-2"], [1000, 500], now - timedelta(hours=2))
        ((user, hours, _),) = ledger.usage(now - timedelta(hours=3))  # until defaults to now
        assert user == "alice" and hours == pytest.approx(3.0, abs=0.01)  # 2h × 1.5 GPUs
        ((_, hours, _),) = ledger.usage(now - timedelta(hours=1), now + timedelta(days=1))  # not into the future
        assert hours == pytest.approx(1.5, abs=0.01)

    def test_the_peak_memory_is_the_most_reported_and_usage_shows_each_keys_highest(self, ledger):
        now = datetime.now(UTC)
        ledger.open("a1", "alice", "", "gpu-a", "A100", ["GPU-1"], [500], now - timedelta(hours=2))
        ledger.open("a2", "alice", "big", "gpu-a", "A100", ["GPU-2"], [1000], now - timedelta(hours=2))
        ledger.open("b1", "bob", "", "gpu-a", "A100", ["GPU-1"], [500], now - timedelta(hours=1))
        for service, mib in [("a1", 9000), ("a1", 30000), ("a1", 12000), ("a2", 20000)]:
            ledger.note_peak_memory(service, mib)
        ledger.close("a1", now)
        ledger.note_peak_memory("a1", 70000)  # closed: kept as it ended
        assert {r.service: r.peak_memory_mib for r in ledger.history()} == {"a1": 30000, "a2": 20000, "b1": None}
        usage = {u.key: u.peak_memory_mib for u in ledger.usage(now - timedelta(hours=3))}
        assert usage == {"alice": 30000, "bob": None}

    def test_usage_refuses_bad_arguments(self, ledger):
        with pytest.raises(ValueError, match="usage by 'host': use one of user, model"):
            ledger.usage(by="host")
        with pytest.raises(ValueError, match="is after until"):
            ledger.usage(at(2), at(1))
        with pytest.raises(ValueError, match="since must be timezone-aware"):
            ledger.usage(datetime(2026, 1, 1))

    # --- concurrency ----------------------------------------------------------------

    @staticmethod
    def _race(count, open_one):
        """Run ``open_one(i)`` in ``count`` threads released at once; their results."""
        barrier = threading.Barrier(count)
        results, errors = [None] * count, []

        def run(i):
            try:
                barrier.wait()
                results[i] = open_one(i)
            except Exception as e:  # reported below, with the thread's index
                errors.append((i, e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        return results

    def test_concurrent_opens_of_one_service_give_one_allocation(self, ledger):
        ids = self._race(8, lambda i: gpu(ledger, "svc", devices=["GPU-1"]))
        assert len(set(ids)) == 1
        assert len(ledger.history()) == 1

    def test_concurrent_opens_through_separate_ledgers_give_one_allocation(self, ledger, url):
        # Two Ledger objects on one database behave like two processes: only the
        # database's unique index stops a second open allocation.
        other = Ledger(url)
        ledger.open_allocations()  # the schema is in place before the race
        try:
            ids = self._race(8, lambda i: gpu((ledger, other)[i % 2], "svc", devices=["GPU-1"]))
            assert len(set(ids)) == 1
            different = self._race(8, lambda i: gpu((ledger, other)[i % 2], "svc2", devices=[f"GPU-{i}"]))
        finally:
            other.dispose()
        assert len(set(different)) == 8
        open_now = [r for r in ledger.open_allocations() if r.service == "svc2"]
        assert len(open_now) == 1
        assert sum(r.end_reason == SUPERSEDED for r in ledger.history()) == 7

    def test_concurrent_task_notes_are_all_kept(self, ledger, url):
        gpu(ledger, "svc")
        other = Ledger(url)
        other.open_allocations()
        try:
            noted = self._race(8, lambda i: (ledger, other)[i % 2].note_tasks("svc", [f"t{i}", "shared"]))
        finally:
            other.dispose()
        assert noted == [True] * 8
        (record,) = ledger.open_allocations()
        assert sorted(record.tasks) == sorted([f"t{i}" for i in range(8)] + ["shared"])

    def test_the_database_refuses_a_second_open_allocation_for_a_service(self, ledger):
        gpu(ledger, "svc")
        from gpuspawner.ledger.schema import allocations

        row = dict(service="svc", username="x", server="", host="h", model="m", started_at=at(1), end_reason="")
        with pytest.raises(sa.exc.IntegrityError), ledger.engine.begin() as conn:
            conn.execute(allocations.insert().values(**row))
        with ledger.engine.begin() as conn:  # a closed one is fine
            conn.execute(allocations.insert().values(**row, ended_at=at(2)))

    # --- node agents' tokens ---------------------------------------------------------

    def test_an_agent_token_is_stored_as_its_digest_and_found_by_it(self, ledger):
        assert ledger.set_agent_token("gpu-a", "a" * 64, issued_at=at(1)) is False
        found = ledger.agent_token("a" * 64)
        assert (found.host, found.token_sha256, found.issued_at) == ("gpu-a", "a" * 64, at(1))
        assert ledger.agent_token("b" * 64) is None

    def test_setting_a_hosts_token_again_replaces_the_old_one(self, ledger):
        ledger.set_agent_token("gpu-a", "a" * 64)
        ledger.set_agent_token("gpu-b", "b" * 64)
        assert ledger.set_agent_token("gpu-a", "c" * 64) is True
        assert ledger.agent_token("a" * 64) is None
        assert [(t.host, t.token_sha256) for t in ledger.agent_tokens()] == [("gpu-a", "c" * 64), ("gpu-b", "b" * 64)]

    def test_a_revoked_token_is_gone_and_revoking_twice_says_so(self, ledger):
        ledger.set_agent_token("gpu-a", "a" * 64)
        assert ledger.revoke_agent_token("gpu-a") is True
        assert ledger.agent_token("a" * 64) is None and ledger.agent_tokens() == []
        assert ledger.revoke_agent_token("gpu-a") is False

    def test_one_digest_cannot_belong_to_two_hosts(self, ledger):
        ledger.set_agent_token("gpu-a", "a" * 64)
        with pytest.raises(LedgerError, match="storing the agent token of gpu-b failed"):
            ledger.set_agent_token("gpu-b", "a" * 64)
        assert [t.host for t in ledger.agent_tokens()] == ["gpu-a"]

    @pytest.mark.parametrize(
        "host, digest, message",
        [("", "a" * 64, "host must not be empty"), ("gpu-a", "abc", "SHA-256 in hex"), (7, "a" * 64, "host must be")],
    )
    def test_bad_agent_token_arguments_are_refused_and_change_nothing(self, ledger, host, digest, message):
        with pytest.raises(ValueError, match=message):
            ledger.set_agent_token(host, digest)
        assert ledger.agent_tokens() == []

    # --- schema ---------------------------------------------------------------------

    def test_the_schema_is_created_on_first_use_with_its_own_version_table(self, ledger):
        assert ledger_tables(ledger.engine) == set()  # nothing before first use
        ledger.open_allocations()
        assert ledger_tables(ledger.engine) == {
            "gpuspawner_allocations",
            "gpuspawner_allocation_devices",
            "gpuspawner_agent_tokens",
            "gpuspawner_queue",
            "gpuspawner_reservations",
            VERSION_TABLE,
        }
        assert ledger_migrations.current(ledger.engine) == (ledger_migrations.head(),)
        assert "alembic_version" not in sa.inspect(ledger.engine).get_table_names()

    def test_migrations_build_exactly_the_tables_the_code_uses(self, ledger):
        ledger.open_allocations()
        with ledger.engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            assert compare_metadata(context, metadata) == []

    def test_every_revision_upgrades_and_downgrades_in_turn(self, url):
        engine = sa.create_engine(url)
        try:
            assert ledger_migrations.current(engine) == ()  # an empty database
            for revision in ledger_migrations.revisions():
                ledger_migrations.upgrade(engine, revision=revision)
                assert ledger_migrations.current(engine) == (revision,)
            ledger_migrations.downgrade(engine, "base")
            assert ledger_tables(engine) == {VERSION_TABLE}
            assert ledger_migrations.current(engine) == ()
        finally:
            engine.dispose()
        assert_usable(url)  # a Ledger on the emptied database builds it again

    def test_0002_turns_float_shares_into_milli_and_back(self, url):
        engine = sa.create_engine(url)
        try:
            ledger_migrations.upgrade(engine, revision="0001")
            write_0001(engine, [(7, "alice", "A100", 0, None, [0.6, 0.25, 1.0])])

            ledger_migrations.upgrade(engine, revision="0002")
            assert columns(engine, "gpuspawner_allocation_devices") == ["allocation_id", "position", "uuid", "milli"]
            with engine.connect() as conn:
                assert device_rows(conn, "milli") == [(7, 0, "GPU-0", 600), (7, 1, "GPU-1", 250), (7, 2, "GPU-2", 1000)]
                assert conn.execute(sa.text("SELECT tasks FROM gpuspawner_allocations")).scalars().all() == [""]
            ledger = Ledger(url)
            try:
                (record,) = ledger.open_allocations()
                assert (record.milli, record.tasks, record.gpus) == ((600, 250, 1000), (), 1.85)
            finally:
                ledger.dispose()

            ledger_migrations.downgrade(engine, "0001")
            assert "tasks" not in columns(engine, "gpuspawner_allocations")
            assert columns(engine, "gpuspawner_allocation_devices") == ["allocation_id", "position", "uuid", "share"]
            with engine.connect() as conn:
                assert device_rows(conn, "share") == [(7, 0, "GPU-0", 0.6), (7, 1, "GPU-1", 0.25), (7, 2, "GPU-2", 1.0)]
            # The rebuilt tables keep the rule of one open allocation per service.
            with pytest.raises(sa.exc.IntegrityError):
                write_0001(engine, [(8, "alice", "A100", 1, None, [])])
        finally:
            engine.dispose()

    def test_an_allocations_standing_against_the_quotas_is_recorded_and_counted_by_quota(self, ledger):
        """Guards docs/quotas.md: "the ledger records, for each server, whether it was within
        a group's quota or borrowed" and "gpuspawner usage --by quota"."""
        gpu(ledger, "svc-a", "alice", start=0)
        gpu(ledger, "svc-b", "bob", devices=("GPU-2",), start=0)
        gpu(ledger, "svc-c", "carol", devices=("GPU-3",), start=0)
        gpu(ledger, "svc-d", "dan", devices=("GPU-4",), start=0)
        assert ledger.note_quota("svc-a", "lab-a", False)
        assert ledger.note_quota("svc-b", "lab-a", True)
        assert ledger.note_quota("svc-c", None, True)  # in no group with a quota of the model
        assert not ledger.note_quota("svc-nothing", "lab-a", True)  # nothing open: nothing written
        found = {r.service: (r.quota_group, r.borrowed) for r in ledger.open_allocations()}
        assert found == {
            "svc-a": ("lab-a", False),
            "svc-b": ("lab-a", True),
            "svc-c": (None, True),
            "svc-d": (None, None),  # no quota of its model
        }
        for service in found:
            ledger.close(service, at(2))
        assert ledger.usage(at(0), at(2), by="quota") == [
            Usage("borrowed", pytest.approx(2.0)),
            Usage("lab-a borrowed", pytest.approx(2.0)),
            Usage("lab-a within", pytest.approx(2.0)),
            Usage("no quota", pytest.approx(2.0)),
        ]

    def test_0009_adds_the_quota_columns_and_rows_before_it_read_as_not_recorded(self, url):
        engine = sa.create_engine(url)
        table = "gpuspawner_allocations"
        try:
            ledger_migrations.upgrade(engine, revision="0008")
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        f"INSERT INTO {table} (id, service, username, server, host, model, started_at, end_reason,"
                        " tasks) VALUES (3, 'svc-old', 'alice', '', 'gpu-a', 'A100', :start, '', '')"
                    ),
                    dict(start=naive(at(0))),
                )
            ledger = Ledger(url)  # upgrades to the head on first use
            try:
                (old,) = ledger.open_allocations()
                assert (old.quota_group, old.borrowed) == (None, None)
            finally:
                ledger.dispose()
            ledger_migrations.downgrade(engine, "0008")
            assert not {"quota_group", "borrowed"} & set(columns(engine, table))
            with engine.connect() as conn:
                assert conn.execute(sa.text(f"SELECT service FROM {table}")).scalars().all() == ["svc-old"]
        finally:
            engine.dispose()

    def test_an_allocation_reads_back_with_its_reserved_cpu_memory_and_accepted_models(self, ledger):
        gpu(ledger, "svc-a", cpu_milli=2500, memory_mib=16384, accepts=["T4", "A100", "T4"])
        gpu(ledger, "svc-b", devices=("GPU-2",), cpu_milli=0, memory_mib=0, accepts=[])  # any model
        gpu(ledger, "svc-c", devices=("GPU-3",))  # not known (a holding adopted from the cluster)
        found = {r.service: (r.cpu_milli, r.memory_mib, r.accepts) for r in ledger.history()}
        assert found == {
            "svc-a": (2500, 16384, ("A100", "T4")),  # sorted, once each
            "svc-b": (0, 0, ()),
            "svc-c": (None, None, None),
        }

    def test_0008_records_reserved_cpu_memory_and_accepted_models_and_rows_before_it_read_as_not_recorded(self, url):
        engine = sa.create_engine(url)
        table = "gpuspawner_allocations"
        added = ["reserved_cpu_milli", "reserved_memory_mib", "accepted_models"]
        try:
            ledger_migrations.upgrade(engine, revision="0007")
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        f"INSERT INTO {table} (id, service, username, server, host, model, started_at,"
                        " end_reason, tasks, peak_memory_mib) VALUES"
                        " (5, 'svc-alice', 'alice', '', 'gpu-a', 'A100', :start, '', 't1', 1234)"
                    ),
                    dict(start=naive(at(0))),
                )
                conn.execute(
                    sa.text(
                        "INSERT INTO gpuspawner_allocation_devices (allocation_id, position, uuid, milli)"
                        " VALUES (5, 0, 'GPU-0', 500)"
                    )
                )
            ledger = Ledger(url)  # upgrades to the head on first use
            try:
                (old,) = ledger.open_allocations()
                assert ledger_migrations.current(engine) == (ledger_migrations.head(),)
                assert (old.id, old.milli, old.tasks, old.peak_memory_mib) == (5, (500,), ("t1",), 1234)
                assert (old.cpu_milli, old.memory_mib, old.accepts) == (None, None, None)
                gpu(ledger, "svc-bob", "bob", devices=("GPU-1",), cpu_milli=4000, memory_mib=8192, accepts=["A100"])
                assert {r.service: (r.cpu_milli, r.memory_mib, r.accepts) for r in ledger.open_allocations()} == {
                    "svc-alice": (None, None, None),
                    "svc-bob": (4000, 8192, ("A100",)),
                }
            finally:
                ledger.dispose()

            # Back to 0007: the columns go, the allocations stay, one open per service still.
            ledger_migrations.downgrade(engine, "0007")
            assert ledger_migrations.current(engine) == ("0007",)
            assert not set(added) & set(columns(engine, table))
            with engine.connect() as conn:
                assert conn.execute(sa.text(f"SELECT service FROM {table} ORDER BY service")).scalars().all() == [
                    "svc-alice",
                    "svc-bob",
                ]
            with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
                conn.execute(
                    sa.text(
                        f"INSERT INTO {table} (service, username, server, host, model, started_at, end_reason)"
                        " VALUES ('svc-bob', 'bob', '', 'gpu-a', 'A100', :start, '')"
                    ),
                    dict(start=naive(at(1))),
                )

            # And up again: the columns come back empty for the rows kept.
            ledger_migrations.upgrade(engine, revision="0008")
            assert set(added) <= set(columns(engine, table))
            ledger = Ledger(url)
            try:
                assert sorted((r.service, r.cpu_milli, r.accepts) for r in ledger.open_allocations()) == [
                    ("svc-alice", None, None),
                    ("svc-bob", None, None),
                ]
            finally:
                ledger.dispose()
        finally:
            engine.dispose()

    def test_tables_from_a_newer_gpuspawner_are_refused_with_a_clear_message(self, ledger, url):
        """Guards docs/upgrading.md: "A newer schema than the running gpuspawner knows is
        refused, with nothing changed"."""
        ledger.open_allocations()
        with ledger.engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
        newer = Ledger(url)
        try:
            with pytest.raises(LedgerError, match="schema revision 9999, which this gpuspawner does not know") as e:
                newer.open_allocations()
            assert "upgrade gpuspawner" in str(e.value)
        finally:
            newer.dispose()

    def test_the_hubs_own_tables_and_version_are_left_alone(self, url):
        from alembic.script import ScriptDirectory
        from jupyterhub import dbutil, orm

        # The hub's database as orm.new_session_factory leaves it: its tables, stamped with
        # its head revision in alembic_version (stamped here directly: the hub's alembic
        # env.py takes seconds to import).
        hub_engine = sa.create_engine(url)
        hub_revision = ScriptDirectory(dbutil.ALEMBIC_DIR).get_current_head()
        orm.Base.metadata.create_all(hub_engine)
        with hub_engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"))
            conn.execute(sa.text("INSERT INTO alembic_version VALUES (:v)"), {"v": hub_revision})
        orm.check_db_revision(hub_engine)

        assert_usable(url)

        with hub_engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all() == [hub_revision]
        orm.check_db_revision(hub_engine)  # the hub still accepts its database
        assert {"users", "spawners"} <= set(sa.inspect(hub_engine).get_table_names())
        hub_engine.dispose()


class TestLedgerOnSQLite(LedgerContract):
    @pytest.fixture
    def url(self, tmp_path):
        return f"sqlite:///{tmp_path}/gpuspawner.sqlite"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"service": ""}, "service must not be empty"),
        ({"user": ""}, "user must not be empty"),
        ({"service": "x" * 256}, "longer than 255"),
        ({"model": ""}, "model must not be empty"),
        ({"host": ""}, "host must not be empty"),
        ({"devices": ["GPU-1", "GPU-2"]}, "2 devices but 1 shares"),
        ({"devices": "GPU-1"}, "not one string"),
        ({"devices": ["GPU-1", "GPU-1"], "milli": [500, 500]}, "listed twice"),
        ({"milli": [0]}, "share of GPU-1 must be an integer number of thousandths in 1..1000"),
        ({"milli": [1001]}, "in 1..1000 .*got 1001"),
        ({"milli": [0.5]}, "in 1..1000 .*got 0.5"),
        ({"milli": [1000.0]}, "in 1..1000 .*got 1000.0"),
        ({"milli": [True]}, "in 1..1000 .*got True"),
        ({"milli": ["1000"]}, "in 1..1000 .*got '1000'"),
        ({"devices": ["GPU-1", "GPU-2"], "milli": [500, -1]}, "share of GPU-2 .*got -1"),
        ({"started_at": datetime(2026, 1, 1)}, "started_at must be timezone-aware"),
        ({"started_at": "2026-01-01"}, "started_at must be a datetime"),
        ({"cpu_milli": -1}, "cpu_milli must be a whole number from 0 to 2147483647, or None, got -1"),
        ({"cpu_milli": 1.5}, "cpu_milli must be a whole number .*got 1.5"),
        ({"memory_mib": True}, "memory_mib must be a whole number .*got True"),
        ({"memory_mib": 2**31}, "memory_mib must be a whole number .*got 2147483648"),
        ({"accepts": "A100"}, "accepts must be a list of model names, not one string"),
        ({"accepts": ["A100", ""]}, "an accepted model must not be empty"),
        ({"accepts": ["x" * 256]}, "an accepted model is longer than 255"),
        ({"accepts": [f"M{i}" for i in range(257)]}, "accepts names 257 models; at most 256"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(tmp_path, change, message):
    # Checked before the database is touched: alike on every backend, so on SQLite only.
    ledger = Ledger(f"sqlite:///{tmp_path}/gpuspawner.sqlite")
    args = dict(service="svc", user="alice", server="", host="gpu-a", model="A100", devices=["GPU-1"], milli=[1000])
    args.update(change)
    with pytest.raises(ValueError, match=message):
        ledger.open(**args)
    assert ledger.history() == []
    ledger.dispose()


@pytest.mark.parametrize(
    "service, task_ids, message",
    [
        ("svc", "abc", "not one string"),
        ("svc", [""], "1 to 64 letters and digits, got ''"),
        ("svc", ["ok1", "a-b"], "got 'a-b'"),
        ("svc", ["x" * 65], "1 to 64 letters and digits"),
        ("svc", ["t1,t2"], "got 't1,t2'"),
        ("svc", ["tâche"], "got 'tâche'"),
        ("svc", [5], "got 5"),
        ("svc", [b"abc"], "got b'abc'"),
        ("", ["t2"], "service must not be empty"),
    ],
)
def test_bad_task_ids_are_refused_and_change_nothing(tmp_path, service, task_ids, message):
    ledger = Ledger(f"sqlite:///{tmp_path}/gpuspawner.sqlite")
    gpu(ledger, "svc")
    ledger.note_tasks("svc", ["t1"])
    with pytest.raises(ValueError, match=message):
        ledger.note_tasks(service, task_ids)
    assert [r.tasks for r in ledger.history()] == [("t1",)]
    ledger.dispose()


def test_an_unusable_database_raises_ledger_error_until_it_is_usable(tmp_path):
    folder = tmp_path / "not-yet"
    ledger = Ledger(f"sqlite:///{folder}/gpuspawner.sqlite")
    with pytest.raises(LedgerError) as e:
        ledger.open("svc", "alice", "", "gpu-a", "A100", ["GPU-1"], [1000])
    message = str(e.value)
    assert message.startswith(f"GPU ledger database sqlite:///{folder}/gpuspawner.sqlite: ")
    assert "unable to open database file" in message and "\n" not in message

    folder.mkdir()  # the database becomes usable: the same Ledger works
    ledger.open("svc", "alice", "", "gpu-a", "A100", ["GPU-1"], [1000])
    assert [r.service for r in ledger.open_allocations()] == ["svc"]
    ledger.dispose()


@pytest.mark.parametrize(
    "url, message",
    [
        ("not a url", "cannot be used: Could not parse"),
        ("nosuchdb://x/y", "cannot be used: Can't load plugin"),
        ("postgresql+nosuchdriver://u:secret@h/db", r"u:\*\*\*@h/db cannot be used"),
    ],
)
def test_an_unusable_url_is_refused_at_once(url, message):
    with pytest.raises(LedgerError, match=message) as e:
        Ledger(url)
    assert "secret" not in str(e.value)


@pytest.mark.parametrize(
    "hub_url, cwd, expected",
    [
        ("sqlite:///jupyterhub.sqlite", "/srv/jupyterhub", "/srv/jupyterhub/gpuspawner.sqlite"),
        ("sqlite:///data/jupyterhub.sqlite", "/srv/jupyterhub", "/srv/jupyterhub/data/gpuspawner.sqlite"),
        ("sqlite:////var/lib/hub/jupyterhub.sqlite", "/srv/jupyterhub", "/var/lib/hub/gpuspawner.sqlite"),
        ("sqlite://", "/srv/jupyterhub", "/srv/jupyterhub/gpuspawner.sqlite"),
        ("sqlite:///:memory:", "/srv/jupyterhub", "/srv/jupyterhub/gpuspawner.sqlite"),
        ("postgresql://hub:pw@db/jupyterhub", "/srv/jupyterhub", "/srv/jupyterhub/gpuspawner.sqlite"),
        ("not a url", "/srv/jupyterhub", "/srv/jupyterhub/gpuspawner.sqlite"),
    ],
)
def test_default_db_url_is_beside_the_hubs_sqlite_file(hub_url, cwd, expected):
    assert default_db_url(hub_url, cwd) == f"sqlite:///{expected}"


def test_default_db_url_makes_a_relative_cwd_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert default_db_url("sqlite:///jupyterhub.sqlite", ".") == f"sqlite:///{tmp_path}/gpuspawner.sqlite"


@pytest.mark.parametrize(
    "start, end, since, until, hours",
    [
        (0, 4, 1, 6, 3),  # starts before the range
        (2, 3, 1, 6, 1),  # inside
        (3, 9, 1, 6, 3),  # ends after
        (0, 9, 1, 6, 5),  # covers it
        (0, 1, 1, 6, 0),  # touches it
        (7, 9, 1, 6, 0),  # after it
        (0, 4, None, 2, 2),  # no lower bound
    ],
)
def test_hours_within(start, end, since, until, hours):
    assert hours_within(at(start), at(end), None if since is None else at(since), at(until)) == hours


def test_ledgers_of_two_databases_may_make_their_tables_at_once(tmp_path):
    # Alembic's migration context is one per process: without a lock, the second
    # thread's steps ran on the first's context (a KeyError or a None ``op``).
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def first_use(i: int) -> None:
        ledger = Ledger(f"sqlite:///{tmp_path}/l{i}.sqlite")
        start.wait()
        try:
            assert ledger.reservations() == []
        except BaseException as exc:  # noqa: BLE001 - any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
