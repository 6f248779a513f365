"""Fair share in the line (docs/line.md): the decay arithmetic and the order
(gpuspawner.core.fairshare, core.line_order; pure), recent use from a SQLite
ledger, and waiting spawns of the real spawner over the fake swarm served in
that order.

Guards docs/line.md, "Fair share": "Recent use is GPU-hours with each moment weighted by 2^(−age /
half-life)", "It is read from the ledger's allocations of the last ten half-lives" and "when a user
joins the line and at most every 30 s while anyone waits"."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta, timezone

import pytest
from traitlets import TraitError

from gpuspawner.cli import format_usage
from gpuspawner.core.fairshare import FairShare, by_group, decayed_gpu_hours
from gpuspawner.core.line_order import Standing, Waiter, order_reason, ordered
from gpuspawner.hub.settings import GPUSettings
from gpuspawner.ledger.ledger import Ledger
from gpuspawner.web.api import queue_json
from tests.unit.test_holdings import A100, World, ledger_down
from tests.unit.test_line import WAIT, messages, stopped, until

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
WEEK = timedelta(days=7)
FAIR = FairShare(half_life=WEEK, max_wait=timedelta(hours=24))


def hour(at: datetime, gpus: float = 1.0):
    """A holding of ``gpus`` for the hour that ends at ``at``."""
    return (at - timedelta(hours=1), at, gpus)


# -- the decay --------------------------------------------------------------------------


def test_recent_use_is_the_integral_of_the_halving_weight_over_each_holding():
    # Checked against a fine Riemann sum of 2^(-age / half-life), an independent reckoning.
    spans = [(T0 - timedelta(days=3), T0 - timedelta(days=1), 2.0), (T0 - timedelta(hours=5), None, 0.25)]
    steps, total = 20000, 0.0
    for started, ended, gpus in spans:
        end = ended or T0
        dt = (end - started) / steps
        for i in range(steps):
            age = T0 - (started + dt * (i + 0.5))
            total += gpus * 2 ** (-(age / WEEK)) * dt.total_seconds() / 3600
    assert decayed_gpu_hours(spans, T0, WEEK) == pytest.approx(total, rel=1e-6)


def test_an_hour_a_half_life_ago_counts_half_and_a_share_its_fraction():
    """Guards docs/line.md, "Fair share": "a week ago (half-life 7 days) 0.5" and "a share counts as
    its fraction"."""
    now = decayed_gpu_hours([hour(T0)], T0, WEEK)
    assert now == pytest.approx(1.0, rel=3e-3)  # an hour just ended: about 1 GPU-hour
    assert decayed_gpu_hours([hour(T0 - WEEK)], T0, WEEK) == pytest.approx(now / 2, rel=1e-9)
    assert decayed_gpu_hours([hour(T0 - 2 * WEEK)], T0, WEEK) == pytest.approx(now / 4, rel=1e-9)
    assert decayed_gpu_hours([hour(T0, 0.25)], T0, WEEK) == pytest.approx(now / 4, rel=1e-9)


def test_a_holding_still_open_counts_until_now_and_nothing_after_it():
    """Guards docs/line.md, "Fair share": "a server still running counts up to now"."""
    open_one = (T0 - timedelta(hours=1), None, 1.0)
    assert decayed_gpu_hours([open_one], T0, WEEK) == decayed_gpu_hours([hour(T0)], T0, WEEK)
    assert decayed_gpu_hours([(T0 - timedelta(hours=1), T0 + timedelta(days=1), 1.0)], T0, WEEK) == (
        decayed_gpu_hours([hour(T0)], T0, WEEK)
    )
    assert decayed_gpu_hours([(T0 + timedelta(hours=1), None, 1.0)], T0, WEEK) == 0.0


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"gpu_fairshare_half_life_days": -1},
            "gpu_fairshare_half_life_days must be a number of days: 0 (off), or from 0.01 up to 3650, got -1",
        ),
        (
            {"gpu_fairshare_half_life_days": float("inf")},
            "gpu_fairshare_half_life_days must be a number of days: 0 (off), or from 0.01 up to 3650, got inf",
        ),
        ({"gpu_fairshare_half_life_days": 80_000}, "gpu_fairshare_half_life_days must be a number of days: 0 (off)"),
        ({"gpu_fairshare_half_life_days": 1e-9}, "gpu_fairshare_half_life_days must be a number of days: 0 (off)"),
        (
            {"gpu_fairshare_max_wait_hours": 0},
            "gpu_fairshare_max_wait_hours must be a number of hours from 0.01 up to 87600, got 0",
        ),
    ],
)
def test_bad_settings_are_refused_with_their_name(values, message):
    with pytest.raises(TraitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GPUSettings(**values)


def test_fair_share_is_off_by_default_and_on_with_a_half_life():
    assert GPUSettings().fairshare() is None
    on = GPUSettings(gpu_fairshare_half_life_days=7, gpu_fairshare_max_wait_hours=12).fairshare()
    assert on == FairShare(half_life=WEEK, max_wait=timedelta(hours=12))


# -- the order --------------------------------------------------------------------------


def waiter(id_: int, user: str, minutes: float = 0, priority: int = 0) -> Waiter:
    return Waiter(id_, f"s-{user}", user, "", A100, priority, T0 + timedelta(minutes=minutes))


def test_less_recent_use_goes_first_among_equal_priority_then_arrival():
    heavy, light, none, boss = waiter(1, "heavy"), waiter(2, "light", 1), waiter(3, "none", 2), waiter(4, "boss", 3, 5)
    standing = Standing(FAIR, {"heavy": 40.0, "light": 2.5, "boss": 100.0}, T0 + timedelta(minutes=10))
    assert ordered([heavy, light, none, boss], standing) == [boss, none, light, heavy]
    assert ordered([heavy, light, none, boss]) == [boss, heavy, light, none]  # without: arrival
    # Equal use (a tenth of a GPU-second apart counts as equal): arrival decides.
    twins = Standing(FAIR, {"heavy": 3.0, "light": 3.0001}, T0 + timedelta(minutes=10))
    assert ordered([light, heavy], twins) == [heavy, light]
    assert order_reason(light, standing) == "recent use 2.5 GPU-hours"
    assert order_reason(boss, standing) == "priority 5, recent use 100.0 GPU-hours"
    assert order_reason(heavy, None) == "first come, first served"
    assert order_reason(boss, None) == "priority 5, first come, first served"


def test_after_the_longest_wait_a_waiter_goes_by_arrival_ahead_of_lighter_later_ones():
    heavy, light = waiter(1, "heavy"), waiter(2, "light", 60)
    used = {"heavy": 500.0}
    assert ordered([heavy, light], Standing(FAIR, used, T0 + timedelta(hours=23, minutes=59))) == [light, heavy]
    at_24h = Standing(FAIR, used, T0 + timedelta(hours=24))
    assert ordered([heavy, light], at_24h) == [heavy, light]
    assert order_reason(heavy, at_24h) == "in line for 24.0 h: by arrival"
    # A higher priority still goes first.
    vip = waiter(3, "vip", 120, priority=1)
    assert ordered([heavy, light, vip], at_24h) == [vip, heavy, light]


def test_a_heavy_user_who_keeps_asking_is_served_within_the_longest_wait_while_light_users_keep_coming():
    """One GPU, one server ending every hour; a light user (no recent use) joins every
    30 min, a heavy one once. Light users pass the heavy one for max_wait, never longer.

    Guards docs/line.md, "Fair share": "a heavy user is passed by later arrivals for at most that
    long"."""
    fair = FairShare(half_life=WEEK, max_wait=timedelta(hours=6))
    line = [waiter(0, "heavy")]
    used = {"heavy": 300.0}
    served_at = None
    for half_hour in range(1, 60):
        now = T0 + timedelta(minutes=30 * half_hour)
        line.append(waiter(half_hour, f"light{half_hour}", 30 * half_hour))
        if half_hour % 2 == 0:  # a server ends: the head is served
            head = ordered(line, Standing(fair, used, now))[0]
            line.remove(head)
            if head.user == "heavy":
                served_at = now - T0
                break
    assert served_at is not None
    assert fair.max_wait <= served_at <= fair.max_wait + timedelta(hours=1)
    # First come, first served would have served it at the first hour; fair share
    # without the bound never would (light users always come).
    assert len(line) > 1


# -- recent use from the ledger ------------------------------------------------------------


def test_the_ledger_reads_each_users_recent_use_and_none_for_a_user_without_any(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.sqlite")
    ledger.open("s1", "ann", "", "gpu-a", A100, ["GPU-1", "GPU-2"], [1000, 1000], started_at=T0 - timedelta(hours=3))
    ledger.close("s1", T0 - timedelta(hours=1))
    ledger.open("s2", "ann", "x", "gpu-a", A100, ["GPU-3"], [250], started_at=T0 - WEEK - timedelta(hours=1))
    ledger.close("s2", T0 - WEEK)
    ledger.open("s3", "bob", "", "gpu-a", A100, ["GPU-4"], [1000], started_at=T0 - timedelta(hours=1))  # still open
    ledger.open("s4", "old", "", "gpu-a", A100, ["GPU-5"], [1000], started_at=T0 - 11 * WEEK)  # past the horizon
    ledger.close("s4", T0 - 11 * WEEK + timedelta(hours=1))
    used = ledger.recent_use(["ann", "bob", "cy", "old"], FAIR, now=T0)
    expected_ann = decayed_gpu_hours(
        [(T0 - timedelta(hours=3), T0 - timedelta(hours=1), 2.0), (T0 - WEEK - timedelta(hours=1), T0 - WEEK, 0.25)],
        T0,
        WEEK,
    )
    assert used["ann"] == pytest.approx(expected_ann)
    assert used["bob"] == pytest.approx(decayed_gpu_hours([hour(T0)], T0, WEEK))
    assert used["cy"] == 0.0 and used["old"] == 0.0


def test_the_usage_report_shows_recent_use_beside_gpu_hours():
    shown = {
        "by": "user",
        "since": None,
        "until": None,
        "usage": [
            {"key": "ann", "gpu_hours": 12.0, "recent_gpu_hours": 7.25, "peak_memory_mib": None},
            {"key": "bob", "gpu_hours": 1.5, "recent_gpu_hours": 1.5, "peak_memory_mib": 2048},
        ],
    }
    lines = format_usage(shown).splitlines()
    assert lines[1].split() == ["USER", "GPU-HOURS", "RECENT", "PEAK", "GPU", "MEMORY"]
    assert lines[2].split() == ["ann", "12.00", "7.25", "-"]
    assert lines[3].split() == ["bob", "1.50", "1.50", "2.0", "GiB"]


# -- the line of the real spawner ------------------------------------------------------------


async def test_with_fair_share_the_waiter_with_less_recent_use_is_served_first_though_it_came_second(tmp_path):
    """Guards docs/line.md, "Fair share": "bob first with 10 GPU-hours two days ago and carol second
    with none, carol is number 1 and gets the GPU when it frees up"."""
    world = World(tmp_path, gpu_fairshare_half_life_days=7)
    ledger = Ledger(world.db_url)
    earlier = datetime.now(timezone.utc) - timedelta(days=2)
    ledger.open("jupyter-bob-old", "bob", "old", "gpu-b", A100, ["GPU-b0"], [1000], started_at=earlier)
    ledger.close("jupyter-bob-old", earlier + timedelta(hours=10))  # bob used 10 GPU-hours two days ago
    alice = world.spawner("alice", {"gpu_model": A100})
    await world.started(alice)
    bob, carol = world.spawner("bob", WAIT), world.spawner("carol", WAIT)
    bob_start = asyncio.ensure_future(world.started(bob))
    await until(lambda: world.hub.line.place(bob.service_name) == (A100, 1))
    carol_start = asyncio.ensure_future(world.started(carol))
    await until(lambda: world.hub.line.place(carol.service_name) == (A100, 1))  # carol, with none, goes ahead
    assert world.hub.line.place(bob.service_name) == (A100, 2)
    assert any(m.endswith("Fair share orders this line: recent use 0.0 GPU-hours") for m in messages(carol))
    lines = await queue_json(world.hub.line)
    assert [(w["user"], w["order"]) for w in lines[A100]] == [
        ("carol", "recent use 0.0 GPU-hours"),
        ("bob", f"recent use {lines[A100][1]['recent_gpu_hours']:.1f} GPU-hours"),
    ]
    assert 8 < lines[A100][1]["recent_gpu_hours"] < 10  # 10 GPU-hours, two days into a week's half-life
    await stopped(world, alice)
    await carol_start
    assert world.owner.get(carol.service_name) is not None and not bob_start.done()
    bob_start.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await bob_start
    await bob.stop()


async def test_when_the_ledger_cannot_say_recent_use_the_line_keeps_what_it_last_read(tmp_path, monkeypatch):
    """Guards docs/line.md, "Fair share": "When the ledger cannot be read, the line keeps the figures
    it last read" and "reads again at the next serving"."""
    world = World(tmp_path, gpu_fairshare_half_life_days=7)
    line = world.hub.line
    ledger = Ledger(world.db_url)
    earlier = datetime.now(timezone.utc) - timedelta(days=1)
    ledger.open("old", "bob", "old", "gpu-b", A100, ["GPU-b0"], [1000], started_at=earlier)
    ledger.close("old", earlier + timedelta(hours=2))
    alice = world.spawner("alice", {"gpu_model": A100})
    await world.started(alice)
    bob, carol = world.spawner("bob", WAIT), world.spawner("carol", WAIT)
    bob_start = asyncio.ensure_future(world.started(bob))
    await until(lambda: line.place(bob.service_name) == (A100, 1))
    known = dict(line._used)
    assert known["bob"] > 1
    with monkeypatch.context() as m:
        m.setattr(Ledger, "recent_use", ledger_down)
        await line.read_use(now=True)  # logged; the figures stay
        assert line._used == known
        carol_start = asyncio.ensure_future(world.started(carol))  # joins; her use cannot be read: none
        await until(lambda: line.place(carol.service_name) is not None)
        assert line.place(carol.service_name) == (A100, 1) and line._used == known
    await line.read_use(now=True)  # the ledger is back: carol is read (none), bob's stays
    assert line._used["carol"] == 0.0 and line._used["bob"] == pytest.approx(known["bob"], rel=1e-3)
    await stopped(world, alice)
    await carol_start
    for start in (bob_start,):
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await start
    await bob.stop()


# -- a week in the line (benchmarks/bench_fairshare.py) -------------------------------------


def test_over_a_simulated_week_fair_share_shortens_light_users_waits_and_still_serves_heavy_ones():
    from benchmarks import bench_fairshare as week

    fcfs, fair = week.summary(8, 2, None), week.summary(8, 2, FAIR)
    assert fair["light"]["wait_min_p50"] < fcfs["light"]["wait_min_p50"] / 2
    assert fair["light"]["wait_min_p95"] < fcfs["light"]["wait_min_p95"] / 2
    # Heavy users are not starved: they are served about as much as first come, first served serves them.
    assert fair["heavy"]["gpu_hours"] > 0.9 * fcfs["heavy"]["gpu_hours"]
    assert fair["heavy"]["wait_min_p95"] < 24 * 60  # the longest wait bounds who passes them


# -- by group -------------------------------------------------------------------------


def test_by_group_a_waiter_counts_its_most_used_groups_members_together():
    use = {"ann": 1.0, "bea": 2.0, "max": 10.0, "solo": 4.0}
    groups = {"ann": ["physics", "cs"], "bea": ["cs"], "solo": [], "new": ["cs"]}
    members = {"physics": ["ann", "max"], "cs": ["ann", "bea"]}
    figures, whose = by_group(["ann", "bea", "solo", "new"], groups, members, use)
    # ann: physics (1 + 10) is her most-used group, not cs (1 + 2 + new's 0); solo: his own.
    assert figures == {"ann": 11.0, "bea": 3.0, "solo": 4.0, "new": 3.0}
    assert whose == {"ann": "physics", "bea": "cs", "new": "cs"}
    # A waiter JupyterHub does not list as a member yet still counts in its group.
    assert by_group(["ann"], {"ann": ["cs"]}, {"cs": ["bea"]}, use)[0] == {"ann": 3.0}
    standing = Standing(FAIR, figures, T0 + timedelta(minutes=5), whose)
    assert order_reason(waiter(1, "ann"), standing) == "recent use of group physics 11.0 GPU-hours"
    assert order_reason(waiter(2, "solo"), standing) == "recent use 4.0 GPU-hours"
    assert [w.user for w in ordered([waiter(1, "ann"), waiter(2, "bea", 1)], standing)] == ["bea", "ann"]


def test_fair_share_by_group_is_a_setting():
    assert GPUSettings(gpu_fairshare_half_life_days=7).fairshare().by_group is False
    assert GPUSettings(gpu_fairshare_half_life_days=7, gpu_fairshare_by="group").fairshare().by_group is True
    with pytest.raises(TraitError):
        GPUSettings(gpu_fairshare_by="department")


async def test_by_group_the_waiter_whose_group_used_less_goes_first_though_it_came_second(tmp_path):
    """bob has used nothing himself, but his group physics has (max, 10 GPU-hours two
    days ago); carol's group cs has not: carol goes ahead of bob.

    Guards docs/line.md, "Fair share": "a waiter's figure is that of the most-used of its JupyterHub
    groups" and "The order's reason names the group"."""
    world = World(tmp_path, gpu_fairshare_half_life_days=7, gpu_fairshare_by="group")
    line = world.hub.line
    line.groups_of = {"bob": ["physics"], "carol": ["cs"]}.get
    line.members_of = {"physics": ["bob", "max"], "cs": ["carol"]}.get
    ledger = Ledger(world.db_url)
    earlier = datetime.now(timezone.utc) - timedelta(days=2)
    ledger.open("jupyter-max-old", "max", "old", "gpu-b", A100, ["GPU-b0"], [1000], started_at=earlier)
    ledger.close("jupyter-max-old", earlier + timedelta(hours=10))
    alice = world.spawner("alice", {"gpu_model": A100})
    await world.started(alice)
    bob, carol = world.spawner("bob", WAIT), world.spawner("carol", WAIT)
    bob_start = asyncio.ensure_future(world.started(bob))
    await until(lambda: line.place(bob.service_name) == (A100, 1))
    carol_start = asyncio.ensure_future(world.started(carol))
    await until(lambda: line.place(carol.service_name) == (A100, 1))
    lines = await queue_json(line)
    assert lines[A100][1]["user"] == "bob" and lines[A100][1]["order"].startswith("recent use of group physics 8.")
    await stopped(world, alice)
    await carol_start
    assert not bob_start.done()
    bob_start.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await bob_start
    await bob.stop()


async def test_by_group_when_jupyterhub_cannot_say_the_groups_the_line_keeps_what_it_last_read(tmp_path):
    world = World(tmp_path, gpu_fairshare_half_life_days=7, gpu_fairshare_by="group")
    line = world.hub.line
    line.groups_of = {"bob": ["physics"]}.get
    line.members_of = {"physics": ["bob", "max"]}.get
    line._used, line._whose = {"bob": 3.0}, {"bob": "physics"}  # as read before
    line.rows = [waiter(1, "bob")]

    def down(group):
        raise RuntimeError("JupyterHub's database is locked")

    line.members_of = down
    await line.read_use(now=True)  # logged, not raised: serving goes on
    assert (line._used, line._whose) == ({"bob": 3.0}, {"bob": "physics"})
