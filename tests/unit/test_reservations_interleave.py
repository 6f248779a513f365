"""A reservation's stop against the user's own Stop, the idle reclaim's stop and the
reconcile, under the deterministic scheduler (tests/interleave.py), on the hub of
test_reclaim_interleave (the real spawner, holdings, reclaimer, ``hub_port.stop_server``
and SQLite ledger over the Docker fake; JupyterHub's user and proxy as small fakes).

gpu-b's two A100s: bob, a member of cs101, holds one; alice, idle past her warning,
the other. CS101's window for 2 A100s is open, so alice's server must make room.
Under every schedule explored, her holding is released at most once and her ledger
row closed at most once with one reason (whichever stop began first), and bob's
server is not touched."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpuspawner.core.reservations import RESERVATION, Reservation
from gpuspawner.ledger.ledger import Ledger
from gpuspawner.reclaim.reservations import ReservationKeeper
from tests.interleave import Run, Scenario, random_schedules, scaled
from tests.unit.test_holdings import A100
from tests.unit.test_reclaim_interleave import Hub

NOW = datetime(2026, 12, 8, 13, 0, tzinfo=timezone.utc)


def keeper_of(hub: Hub, stop) -> ReservationKeeper:
    Ledger(hub.world.db_url).add_reservation(
        Reservation("cs101", A100, 2, NOW - timedelta(minutes=1), NOW + timedelta(hours=1), name="CS101")
    )
    return ReservationKeeper(
        hub.owner,
        groups_of=lambda user: ["cs101"] if user == "bob" else [],
        stop=stop,
        wall=lambda: NOW,
        clock=lambda: 0.0,
    )


@pytest.mark.explore
def test_a_reservations_stop_racing_the_users_stop_the_idle_reclaim_and_a_reconcile(tmp_path, monkeypatch):
    reasons = set()  # the end reasons the schedules came to

    def scenario(run: Run) -> Scenario:
        hub = Hub(tmp_path, run, monkeypatch)
        hub.exit_on_remove()
        begun: list[str] = []  # the reason of each stop through the hub that began, in order

        def recorded(reason):
            async def stop(h, _reason):
                stopped = await hub._reclaim_stop(h, _reason)
                if stopped:
                    begun.append(reason)
                return stopped

            return stop

        hub.found.stop = recorded("idle")
        keeper = keeper_of(hub, recorded(RESERVATION))

        def check(outcome):
            # alice's row, if closed: the reason of the first stop that began, else the user's
            hub.check(outcome, ("idle", RESERVATION, "server stopped"), begun[0] if begun else "server stopped")
            reasons.update(r.end_reason for r in Ledger(hub.world.db_url).history(user="alice") if r.ended_at)

        async def setup():
            await keeper.refresh(force=True)  # read before: its next read is 30 s away
            await hub.setup()

        return Scenario(
            ops={"setup": setup, "reconcile": lambda: hub.after_setup(hub.owner.reconcile)},
            events={
                "reservation": lambda: hub.after_setup(keeper.check),
                "reclaim": lambda: hub.after_setup(hub.found.check),
                "stop": lambda: hub.after_setup(hub.user_stops),
            },
            invariant=hub.world.invariant,
            check=check,
        )

    stats = random_schedules(scenario, seed=26, n=150)
    assert stats.schedules == scaled(150)
    assert reasons == {"idle", RESERVATION, "server stopped"}  # each stop won some schedules
