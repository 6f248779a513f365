"""Idle reclaim's stops against the user's own Stop and spawn, the reconcile and
GPU activity, under the deterministic scheduler (tests/interleave.py): the real
spawner, holdings, reclaimer, ``hub_port.stop_server`` and SQLite ledger over the
Docker fake, with JupyterHub's user and proxy as small fakes. Under every
schedule explored, alice's holding is released at most once and her ledger row
closed at most once with one reason, and bob's server is not touched."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from jupyterhub import orm

from gpuspawner import hub_port
from gpuspawner.core.idle import IDLE, Limits
from gpuspawner.holdings.holdings import Phase
from gpuspawner.ledger.ledger import Ledger
from gpuspawner.reclaim import reclaimer as reclaim
from tests.interleave import Run, Scenario, explore, random_schedules, scaled
from tests.unit.test_holdings import A100, World, clean
from tests.unit.test_reclaim import TWO_GPUS, Clock, reading

LIMITS = Limits(idle_timeout=60, idle_warning=20)


class User:
    """JupyterHub's user, as far as a stop goes: no start or stop of the server
    while a stop is pending, and its server row cleared after it."""

    def __init__(self, spawner):
        self.spawners = {"": spawner}
        self.groups: list = []  # JupyterHub's groups: none

    async def stop(self, server: str) -> None:
        s = self.spawners[server]
        s._stop_pending = True
        try:
            await s.stop()
            s.orm_spawner.server = None
        finally:
            s._stop_pending = False


def running_row(user: str) -> orm.Server:
    return orm.Server(proto="http", ip="gpu-b", port=1, base_url=f"/user/{user}/", cookie_name="c")


class Hub:
    """One hub: alice (idle, her warning run out) and bob (busy) on gpu-b's two
    GPUs, adopted from the swarm; the reclaimer sees them through ``setup``."""

    def __init__(self, tmp_path, run: Run, monkeypatch):
        self.world = w = World(tmp_path, run.executor, inventory=TWO_GPUS)
        w.leftover("alice", uuids=("GPU-b0",))
        w.leftover("bob", uuids=("GPU-b1",))
        self.alice, self.bob = w.spawner("alice"), w.spawner("bob")
        for s in (self.alice, self.bob):
            s.orm_spawner.server = running_row(s.user.name)
        self.users = {"alice": User(self.alice), "bob": User(self.bob)}
        app = SimpleNamespace(users=self.users, proxy=SimpleNamespace(delete_user=self._unroute))
        monkeypatch.setattr(hub_port, "running_hub", lambda: app)
        self.owner = w.owner
        self.clock = Clock()
        self.clock.now = 0.0
        self.found = reclaim.Reclaimer(self.owner, clock=self.clock, wall=lambda: 1_700_000_000.0 + self.clock.now)
        self.found.limits_for = lambda h: LIMITS
        self.found.stop = self._reclaim_stop
        self.reclaim_stops: list[object] = []  # what each hub_port.stop_server of the reclaim gave
        self.ready = asyncio.Event()

    async def _reclaim_stop(self, h, reason) -> bool:
        try:
            stopped = await hub_port.stop_server(hub_port.running_hub(), h.held.user, h.held.server)
        except Exception:
            self.reclaim_stops.append("raised")
            raise
        self.reclaim_stops.append(stopped)
        return stopped

    async def _unroute(self, user, server) -> None:
        await asyncio.sleep(0)

    def report(self, alice_busy: bool = False) -> None:
        util = {"GPU-b1": 80, **({"GPU-b0": 80} if alice_busy else {})}
        self.found.observe(reading(util, {"GPU-b0": ["jupyter-alice"], "GPU-b1": ["jupyter-bob"]}))

    async def setup(self) -> None:
        """Adopt both servers; alice idle 80 s (warned at 40 s), bob busy."""
        await self.owner.reconcile()
        await self.found.check()
        self.report()
        self.clock.now = 50
        await self.found.check()
        assert [n["reason"] for n in self.found.notices_for("alice")] == [IDLE]
        self.clock.now = 80
        self.report()
        self.ready.set()

    async def after_setup(self, op):
        await self.ready.wait()
        return await op()

    async def user_stops(self, user: str = "alice") -> None:
        """The user's Stop, as JupyterHub's DELETE: it waits for a stop under way."""
        s = self.users[user].spawners[""]
        if s.pending or not s.active:
            return
        await self.users[user].stop("")

    def exit_removed(self) -> None:
        """The containers of removed services exit, as their nodes stop them."""
        names = set(self.world.fake.service_names())
        for task, (service, _node, _visible) in self.world.fake.running_containers().items():
            if service not in names:
                self.world.fake.exit_container(task)

    def exit_on_remove(self) -> None:
        """From now on a removed service's container exits at once."""
        remove = self.world.fake.remove_service

        def remove_and_exit(service):
            removed = remove(service)
            self.exit_removed()
            return removed

        self.world.fake.remove_service = remove_and_exit

    def check(self, outcome, reasons=("idle", "server stopped"), expected: str | None = None) -> None:
        """The invariants after a schedule; ``expected``: the end reason alice's row must
        have if closed (default: idle where the reclaim's stop began, else the user's)."""
        clean(outcome)
        self.world.ledger_matches()
        rows = Ledger(self.world.db_url).history(user="alice")
        closed = [r for r in rows if r.ended_at is not None]
        assert len(closed) <= 1, f"alice's allocation closed {len(closed)} times: {closed}"
        assert all(r.end_reason in reasons for r in closed), [r.end_reason for r in closed]
        if closed:  # the reclaim's reason where its stop began, else the user's
            began = any(r is True or r == "raised" for r in self.reclaim_stops)
            expected = expected or ("idle" if began else "server stopped")
            assert closed[0].end_reason == expected, (closed, self.reclaim_stops)
        bob = self.owner.get("jupyter-bob")
        assert bob is not None and bob.phase is Phase.RUNNING, "bob's holding was touched"
        assert "jupyter-bob" in self.world.fake.service_names(), "bob's service was removed"
        assert self.bob.active and not [r for r in Ledger(self.world.db_url).history(user="bob") if r.ended_at]


@pytest.mark.explore
def test_a_reclaim_racing_the_users_stop_and_a_reconcile(tmp_path, monkeypatch):
    reasons = set()  # the end reasons the schedules came to

    def scenario(run: Run) -> Scenario:
        hub = Hub(tmp_path, run, monkeypatch)
        hub.exit_on_remove()  # the lingering container: the next test

        def check(outcome):
            hub.check(outcome)
            reasons.update(r.end_reason for r in Ledger(hub.world.db_url).history(user="alice") if r.ended_at)

        return Scenario(
            ops={"setup": hub.setup, "reconcile": lambda: hub.after_setup(hub.owner.reconcile)},
            # events: each begins at any point, so either may be first
            events={
                "reclaim": lambda: hub.after_setup(hub.found.check),
                "stop": lambda: hub.after_setup(hub.user_stops),
            },
            invariant=hub.world.invariant,
            check=check,
        )

    stats = random_schedules(scenario, seed=11, n=100)
    assert stats.schedules == scaled(100) and reasons == {"idle", "server stopped"}  # both won some schedules


def test_a_users_stop_racing_a_reconcile_is_closed_as_stopped(tmp_path, monkeypatch):
    """The reconcile lists the swarm after the stop removed alice's service, and closes
    what it does not hold while the stop closes her allocation: one reason, the stop's."""

    def scenario(run: Run) -> Scenario:
        hub = Hub(tmp_path, run, monkeypatch)
        hub.exit_on_remove()

        def check(outcome):
            hub.check(outcome, reasons=("server stopped",))
            assert hub.owner.get("jupyter-alice") is None

        return Scenario(
            ops={
                "setup": hub.setup,
                "stop": lambda: hub.after_setup(hub.user_stops),
                "reconcile": lambda: hub.after_setup(hub.owner.reconcile),
            },
            check=check,
        )

    stats = explore(scenario, max_schedules=300)
    assert stats.schedules >= 20


def test_a_reclaim_whose_container_lingers_keeps_its_reason_when_the_reconcile_ends_it(tmp_path, monkeypatch):
    """The reclaim's stop gives up while alice's container still runs; the reconcile
    releases her GPU once it has exited, and the ledger says why it ended: idle."""

    def scenario(run: Run) -> Scenario:
        hub = Hub(tmp_path, run, monkeypatch)

        async def reclaim_then_reconcile():
            await hub.after_setup(hub.found.check)
            assert hub.owner.get("jupyter-alice").phase is Phase.REMOVING
            hub.exit_removed()
            await hub.owner.reconcile()
            assert hub.owner.get("jupyter-alice") is None

        def check(outcome):
            hub.check(outcome, reasons=("idle",))
            [row] = Ledger(hub.world.db_url).history(user="alice")
            assert row.end_reason == "idle"

        return Scenario(ops={"setup": hub.setup, "reclaim": reclaim_then_reconcile}, check=check)

    stats = random_schedules(scenario, seed=12, n=5)
    assert stats.schedules == scaled(5)


@pytest.mark.explore
def test_activity_between_the_decision_and_the_stop_keeps_the_server(tmp_path, monkeypatch):
    """bob, also idle past his warning, uses his GPU while alice's stop runs (his
    reading lands as alice's route is taken off the proxy): he stays."""

    def scenario(run: Run) -> Scenario:
        hub = Hub(tmp_path, run, monkeypatch)
        idle = {"GPU-b0": ["jupyter-alice"], "GPU-b1": ["jupyter-bob"]}

        async def setup():
            await hub.owner.reconcile()
            await hub.found.check()
            hub.found.observe(reading({}, idle))
            hub.clock.now = 50
            await hub.found.check()
            hub.clock.now = 80
            hub.found.observe(reading({}, idle))
            hub.ready.set()

        async def unroute(user, server):
            await asyncio.sleep(0)
            if user is hub.users["alice"]:
                hub.report()  # bob busy now

        hub._unroute = unroute
        app = hub_port.running_hub()
        app.proxy.delete_user = unroute
        return Scenario(
            ops={"setup": setup, "reclaim": lambda: hub.after_setup(hub.found.check)},
            events={"exit_removed": hub.exit_removed},
            check=hub.check,
        )

    stats = random_schedules(scenario, seed=13, n=60)
    assert stats.schedules == scaled(60)


@pytest.mark.explore
def test_a_respawn_during_the_reclaim_starts_its_idle_time_afresh(tmp_path, monkeypatch):
    """The user stops alice's server as the reclaim is about to, and starts it
    again before the next check: the new server is not stopped for the old one's
    idle time, and no warning of the old one is shown for it."""

    def scenario(run: Run) -> Scenario:
        hub = Hub(tmp_path, run, monkeypatch)
        hub.exit_on_remove()

        async def stop_and_respawn():
            await hub.after_setup(hub.user_stops)
            await asyncio.wait([run.task("reclaim")])
            alice = hub.world.spawner("alice", {"gpu_model": A100})
            await hub.world.started(alice)
            alice.orm_spawner.server = running_row("alice")
            hub.users["alice"] = User(alice)
            hub.report()  # the new server's first reading: idle
            assert await hub.found.check() == []
            assert hub.found.notices_for("alice") == []
            assert hub.owner.get("jupyter-alice").phase is Phase.RUNNING

        return Scenario(
            ops={"setup": hub.setup, "respawn": stop_and_respawn, "reclaim": lambda: hub.after_setup(hub.found.check)},
            check=lambda outcome: clean(outcome),
        )

    stats = random_schedules(scenario, seed=14, n=60)
    assert stats.schedules == scaled(60)
