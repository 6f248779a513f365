"""The home page's countdowns (web/home_gpus.py): what would stop a server, and when, as the
user reads it under "Your GPUs", for a fixed clock. The limits are the hub's settings
(``gpu_max_hours``, ``gpu_idle_timeout``), as a server without access rules of its own has
them; over the real spawner, holdings and reclaimer on the in-process Docker fake."""

from __future__ import annotations

from types import SimpleNamespace

from gpuspawner.spawn.form import _templates
from gpuspawner.web.home_gpus import server_rows, servers_var
from tests.unit.test_holdings import A100, World
from tests.unit.test_reclaim import TWO_GPUS, Clock, reading, uuid_of


async def holder(tmp_path, **settings):
    """alice holds an A100 under the hub's ``settings``; the reclaimer has begun timing."""
    clock = Clock()
    world = World(
        tmp_path, inventory=TWO_GPUS, clocks=dict(clock=clock, wall=lambda: 1_700_000_000.0 + clock.now), **settings
    )
    await world.started(world.spawner("alice", {"gpu_model": A100}))
    await world.hub.reclaimer.check()  # timing begins
    return world, clock


def shown(world) -> str:
    alice = SimpleNamespace(name="alice", kind="user")
    page = _templates(()).get_template("gpuspawner_servers.html")
    return " ".join(page.render(gpuspawner_servers=servers_var(world.hub)(alice), user=alice).split())


async def test_the_held_time_limit_counts_down_from_gpu_max_hours(tmp_path):
    world, clock = await holder(tmp_path, gpu_max_hours=2)
    clock.now += 1500  # 25 min of its 2 h
    [row] = server_rows(world.hub, "alice")
    assert row["held_for"] == "25 min"
    assert row["stops"] == ["held-time limit in 1.6 h"]  # 7200 - 1500 = 5700 s
    assert "held-time limit in 1.6 h" in shown(world)
    clock.now += 5700 - 30 * 60  # 30 min left
    [row] = server_rows(world.hub, "alice")
    assert (row["held_for"], row["stops"]) == ("1.5 h", ["held-time limit in 30 min"])
    clock.now += 30 * 60 - 45
    assert server_rows(world.hub, "alice")[0]["stops"] == ["held-time limit in 45 s"]


async def test_the_idle_limit_counts_down_while_the_gpu_is_unused_and_comes_first_when_sooner(tmp_path):
    world, clock = await holder(tmp_path, gpu_max_hours=2, gpu_idle_timeout=3600)
    found = world.hub.reclaimer
    name, gpu = uuid_of(world.owner, "alice")
    clock.now += 600
    found.observe(reading({gpu: 90}, {gpu: [name]}))  # busy: the idle timer does not run
    [row] = server_rows(world.hub, "alice")
    assert row["stops"] == ["held-time limit in 1.8 h", "idle limit: after 60 min without GPU use"]
    found.observe(reading({gpu: 0}, {}))  # unused from here
    clock.now += 900
    [row] = server_rows(world.hub, "alice")
    assert row["held_for"] == "25 min"
    # Idle for 15 min of its hour: 45 min left, sooner than the held-time limit's 95 min (1.6 h).
    assert row["stops"] == ["idle limit in 45 min unless its GPU is used", "held-time limit in 1.6 h"]
    assert "idle limit in 45 min unless its GPU is used" in shown(world)
    clock.now += 44 * 60 + 20
    assert server_rows(world.hub, "alice")[0]["stops"][0] == "idle limit in 40 s unless its GPU is used"
    found.observe(reading({gpu: 90}, {gpu: [name]}))  # used again: the whole hour is left
    assert server_rows(world.hub, "alice")[0]["stops"][-1] == "idle limit: after 60 min without GPU use"
