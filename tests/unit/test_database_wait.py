"""gpuspawner.hub.database_wait on a real DB-API (sqlite3, whose connect fails with
OperationalError while the database's folder is not there, as psycopg's does while
PostgreSQL restarts), with the clock and the sleep taken over: the waits are counted, not
slept. The stack's PostgreSQL restarted under a running hub is in
tests/unit/test_stack_database_down.py."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from gpuspawner.hub.database_wait import (
    RETRY_EVERY,
    WAIT_SECONDS,
    WaitingConnect,
    keep_idle_transaction_ended,
    waiting_connections,
)


class Clock:
    def __init__(self, on_sleep=None):
        self.now, self.slept, self.on_sleep = 0.0, 0, on_sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += 1
        if self.on_sleep:
            self.on_sleep(self.now)


def test_a_database_that_comes_back_within_the_wait_is_a_pause_not_a_failure(tmp_path):
    folder = tmp_path / "db"
    clock = Clock(on_sleep=lambda now: now >= 3 and folder.mkdir(exist_ok=True))
    connect = WaitingConnect(f"sqlite:///{folder}/hub.sqlite", wait=10, clock=clock, sleep=clock.sleep)
    connection = connect()
    assert isinstance(connection, sqlite3.Connection)
    connection.close()
    assert clock.now == 3 and clock.slept == 3 / RETRY_EVERY


def test_a_database_that_stays_down_costs_one_wait_then_fails_fast_until_it_is_back(tmp_path):
    folder = tmp_path / "db"
    clock = Clock()
    connect = WaitingConnect(f"sqlite:///{folder}/hub.sqlite", wait=10, clock=clock, sleep=clock.sleep)
    with pytest.raises(sqlite3.OperationalError):
        connect()
    assert clock.now == 10  # the whole wait, once
    for _ in range(3):
        with pytest.raises(sqlite3.OperationalError):
            connect()
    assert clock.now == 10  # then each try once: no more waiting
    folder.mkdir()
    connect().close()  # back: the next outage is waited out again
    folder.rename(tmp_path / "gone")
    with pytest.raises(sqlite3.OperationalError):
        connect()
    assert clock.now == 20


def test_the_settings_for_jupyterhub_ping_pooled_connections(tmp_path):
    """Guards docs/deploy.md, "How a database restart behaves": "waits up to 30 s for the
    database" and "pings a pooled connection before it uses it"."""
    kwargs = waiting_connections(f"sqlite:///{tmp_path}/hub.sqlite")
    assert kwargs["pool_pre_ping"] is True and isinstance(kwargs["creator"], WaitingConnect)
    assert kwargs["creator"]._wait == 30 == WAIT_SECONDS


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    name: Mapped[str] = mapped_column(primary_key=True)


async def ended_within(db, seconds: float) -> bool:
    for _ in range(int(seconds / 0.01)):
        if not db.in_transaction():
            return True
        await asyncio.sleep(0.01)
    return False


async def test_an_idle_read_transaction_is_ended_and_one_with_a_change_is_left_alone(tmp_path):
    """JupyterHub's shared session (a real SQLAlchemy session on sqlite here): after a read it
    keeps its transaction, which the loop ends; a session holding a change is not touched."""
    engine = create_engine(f"sqlite:///{tmp_path}/hub.sqlite")
    Base.metadata.create_all(engine)
    db = sessionmaker(bind=engine)()
    loop = asyncio.create_task(keep_idle_transaction_ended(lambda: db, every=0.01))
    try:
        db.query(User).all()
        assert db.in_transaction() and await ended_within(db, 1)
        db.add(User(name="alice"))  # a change JupyterHub has not committed yet
        assert not await ended_within(db, 0.2) and db.new
        db.query(User).filter_by(name="bob").all()  # the change is flushed: no longer pending
        assert not db.new and not await ended_within(db, 0.2)
        db.rollback()
        assert db.query(User).count() == 0  # nothing of it was committed
        assert await ended_within(db, 1)  # and a read after it is ended again
    finally:
        loop.cancel()
        db.close()


async def test_a_commit_that_fails_is_rolled_back_and_the_loop_goes_on(tmp_path, monkeypatch):
    """The database went away under the idle transaction: its commit fails, so it is rolled
    back (as JupyterHub does after a database error); a rollback that fails too ends nothing,
    and the next idle transaction is ended as before."""
    engine = create_engine(f"sqlite:///{tmp_path}/hub.sqlite")
    Base.metadata.create_all(engine)
    db = sessionmaker(bind=engine)()
    failures = {"commit": 0, "rollback": 0}
    real = {"commit": db.commit, "rollback": db.rollback}
    calls: list[str] = []

    def failing(name: str):
        def call():
            calls.append(name)
            if failures[name]:
                failures[name] -= 1
                raise sqlite3.OperationalError("server closed the connection unexpectedly")
            real[name]()

        return call

    monkeypatch.setattr(db, "commit", failing("commit"))
    monkeypatch.setattr(db, "rollback", failing("rollback"))
    loop = asyncio.create_task(keep_idle_transaction_ended(lambda: db, every=0.01))
    try:
        failures["commit"] = 1
        db.query(User).all()
        assert await ended_within(db, 1) and calls == ["commit", "rollback"]  # rolled back
        failures["commit"], failures["rollback"] = 1, 1
        calls.clear()
        db.query(User).all()
        assert await ended_within(db, 1) and not loop.done()  # ended at a later round
        assert calls == ["commit", "rollback", "commit"]
    finally:
        loop.cancel()
        db.close()
