"""The hub's side of idle reclaim (gpuspawner/reclaim/reclaimer.py) over the real spawner,
holdings and SQLite ledger on the in-process Docker fake: reports read per holder,
what a node may and may not make the hub believe, warnings, the stop and the
ledger's end reason, with a fake clock."""

from __future__ import annotations

import json
import re

import pytest

from gpuspawner.core.idle import Limits
from gpuspawner.core.reports import parse_report
from gpuspawner.ledger.ledger import Ledger
from tests.unit.test_holdings import A100, World, driven
from tests.unit.test_reports import device, report

TWO_GPUS = {
    "gpu-b": [
        {"uuid": "GPU-b0", "model": A100, "memory_mib": 81920},
        {"uuid": "GPU-b1", "model": A100, "memory_mib": 81920},
    ]
}
LIMITS = Limits(idle_timeout=60, idle_warning=20)


class Clock:
    now = 5000.0

    def __call__(self):
        return self.now


def reading(util: dict, procs: dict, hostname="gpu-b"):
    """A report of gpu-b: each GPU's utilization and its processes' services."""
    devices = [
        device(
            i,
            uuid,
            utilization_gpu=util.get(uuid, 0),
            processes=[
                {"pid": 100 + n, "used_mib": 500, "holder": {"service": s} if s else None}
                for n, s in enumerate(procs.get(uuid, []))
            ],
        )
        for i, uuid in enumerate(("GPU-b0", "GPU-b1"))
    ]
    return parse_report(json.dumps(report(*devices, hostname=hostname)))


async def two_servers(tmp_path, shares=None, memory=None):
    """alice and bob each hold an A100 (or ``shares`` of one: both on GPU-b0); the
    A100's gpu_sharing entry has ``memory``'s keys too."""
    clock = Clock()
    world = World(
        tmp_path,
        inventory=TWO_GPUS,
        clocks=dict(clock=clock, wall=lambda: 1_700_000_000.0 + clock.now),
        gpu_sharing={A100: {"quantum": 0.05, **(memory or {})}},
    )
    spawners = {}
    for user in ("alice", "bob"):
        options = {"gpu_model": A100, **({"gpu_share": shares} if shares else {})}
        spawners[user] = s = world.spawner(user, options)
        await world.started(s)
    owner = world.owner
    found = world.hub.reclaimer  # the one the hub's allocation map reads
    found.limits_for = lambda h: LIMITS
    stopped = stop_through_spawners(world, spawners)
    return world, owner, found, clock, stopped


def stop_through_spawners(world, spawners) -> list:
    """The reclaimer stops a server as the hub does, through its spawner (``spawners``
    by user); the (user, reason) of each stop are listed in the list returned."""
    stopped = []

    async def stop(h, reason):
        stopped.append((h.user, reason))

        def exits():  # its container exits once asked to
            for task, (service, _node, _visible) in world.fake.running_containers().items():
                if service == h.name:
                    world.fake.exit_container(task)

        await driven(spawners[h.user].stop(), exits)  # as JupyterHub's user.stop() calls it
        return True

    world.hub.reclaimer.stop = stop
    return stopped


def uuid_of(owner, user):
    [h] = [h for h in owner.all().values() if h.user == user]
    return h.name, h.held.uuids[0]


async def test_an_idle_holder_is_warned_then_stopped_with_end_reason_idle(tmp_path):
    world, owner, found, clock, stopped = await two_servers(tmp_path)
    a_name, a_gpu = uuid_of(owner, "alice")
    b_name, b_gpu = uuid_of(owner, "bob")
    await found.check()
    for _ in range(5):  # 50 s: alice idle, bob busy with his own process
        clock.now += 10
        found.observe(reading({b_gpu: 80}, {a_gpu: [a_name], b_gpu: [b_name]}))
        await found.check()
    [notice] = found.notices_for("alice")
    assert notice["reason"] == "idle" and notice["seconds_left"] == 20
    assert "will be stopped at 2023-11-14T23:37:50Z unless" in notice["message"]
    assert found.notices_for("bob") == [] and stopped == []
    assert [r["user"] for r in found.idle_now()] == ["alice"]
    for _ in range(2):
        clock.now += 10
        found.observe(reading({b_gpu: 80}, {a_gpu: [a_name], b_gpu: [b_name]}))
        await found.check()
    assert stopped == [("alice", "idle")]
    assert owner.get(a_name) is None and owner.get(b_name) is not None
    [closed] = Ledger(world.db_url).history(user="alice")
    assert closed.end_reason == "idle"


async def test_a_node_cannot_make_the_hub_believe_another_holder_is_busy(tmp_path):
    world, owner, found, clock, stopped = await two_servers(tmp_path)
    a_name, a_gpu = uuid_of(owner, "alice")
    b_name, b_gpu = uuid_of(owner, "bob")
    # bob's GPU is busy, and the node says alice's service runs there: she holds
    # nothing on it, so it is a stray process, and alice stays idle.
    for _ in range(8):
        clock.now += 10
        found.observe(reading({b_gpu: 90}, {b_gpu: [a_name]}))
        await found.check()
    assert ("alice", "idle") in stopped
    assert found.unattributed["gpu-b"] == [{"uuid": b_gpu, "pid": 100, "used_mib": 500, "service": a_name}]
    # A report from another host speaks of none of gpu-b's holders.
    found.observe(reading({b_gpu: 90}, {b_gpu: [b_name]}, hostname="gpu-a"))
    assert found.timers.last_active(b_name) == clock.now  # still only from gpu-b's own report


async def test_on_a_shared_gpu_a_holder_without_processes_is_idle(tmp_path):
    world, owner, found, clock, stopped = await two_servers(tmp_path, shares=0.5)
    a_name, a_gpu = uuid_of(owner, "alice")
    b_name, b_gpu = uuid_of(owner, "bob")
    assert a_gpu == b_gpu
    for _ in range(8):
        clock.now += 10
        found.observe(reading({a_gpu: 70}, {a_gpu: [b_name]}))
        await found.check()
    assert stopped == [("alice", "idle")]
    assert found.activity(b_name)["idle_seconds"] is None
    assert found.activity(b_name)["last_gpu_activity"] == "2023-11-14T23:38:00Z"


async def test_held_time_counts_from_the_ledgers_start(tmp_path):
    world, owner, found, clock, stopped = await two_servers(tmp_path)
    found.limits_for = lambda h: Limits(max_held=3600, max_held_warning=600)
    found.wall = lambda: Ledger(world.db_url).open_allocations()[0].started_at.timestamp() + 3300
    await found.check()  # both held 3300 s by the ledger: inside the warning
    assert [n["reason"] for n in found.notices_for("alice")] == ["max_hours"]
    clock.now += 599
    await found.check()
    assert stopped == []
    clock.now += 1
    await found.check()
    assert sorted(stopped) == [("alice", "max_hours"), ("bob", "max_hours")]
    assert {r.end_reason for r in Ledger(world.db_url).history()} == {"max_hours"}


async def test_the_allocation_map_and_gpu_page_show_each_holders_gpu_activity(tmp_path):
    import jinja2

    from gpuspawner.hubconfig import TEMPLATES

    world, owner, found, clock, stopped = await two_servers(tmp_path)
    a_name, a_gpu = uuid_of(owner, "alice")
    b_name, b_gpu = uuid_of(owner, "bob")
    for _ in range(3):
        clock.now += 10
        found.observe(reading({b_gpu: 80}, {b_gpu: [b_name]}))
    views = owner.cluster.views
    [alice] = views.holders_of(a_gpu)
    [bob] = views.holders_of(b_gpu)
    assert (alice["user"], alice["idle_seconds"], alice["last_gpu_activity"]) == ("alice", 20, None)
    assert (bob["user"], bob["idle_seconds"], bob["last_gpu_activity"]) == ("bob", None, "2023-11-14T23:37:10Z")
    card = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True).get_template("gpus_host.html")
    devices = {
        a_gpu: {
            "index": 0,
            "model": A100,
            "memory_mib": 81920,
            "allocated": 1,
            "health": "ok",
            "problems": [],
            "holders": [alice],
            "temperature_c": None,
            "utilization_gpu": 0,
        },
        b_gpu: {
            "index": 1,
            "model": A100,
            "memory_mib": 81920,
            "allocated": 1,
            "health": "ok",
            "problems": [],
            "holders": [bob],
            "temperature_c": None,
            "utilization_gpu": 80,
        },
    }
    html = card.render(host="gpu-b", devices=devices, stale=None)
    assert 'title="last GPU activity: never seen">idle 0 min</span>' in html
    assert "GPU active 2023-11-14T23:37:10Z" in html


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("gpu_idle_timeout", -1, "gpu_idle_timeout must be a number of seconds from 0 up"),
        ("gpu_idle_timeout", "2h", "gpu_idle_timeout must be a number of seconds from 0 up to 31536000, got '2h'"),
        ("gpu_idle_warning", float("nan"), "gpu_idle_warning must be a number of seconds from 0 up"),
        ("gpu_max_hours", float("inf"), "gpu_max_hours must be a number of hours from 0 up"),
        ("gpu_idle_threshold", {"util": 3}, "unknown key 'util'; it takes memory_mib, utilization"),
        (
            "gpu_idle_threshold",
            {"utilization": 101},
            "gpu_idle_threshold['utilization'] must be a number from 0 to 100",
        ),
        ("gpu_idle_threshold", {"memory_mib": True}, "gpu_idle_threshold['memory_mib'] must be a number"),
    ],
)
def test_a_bad_reclaim_setting_stops_the_hub_at_start_with_one_line(setting, value, message):
    from traitlets.config import Config

    from gpuspawner.hub.settings import validate_config

    c = Config()
    setattr(c.GPUSwarmSpawner, setting, value)
    with pytest.raises(SystemExit, match=re.escape(message)):
        validate_config(c)


def test_the_settings_become_the_limits_of_each_server():
    from gpuspawner.spawn.spawner import GPUSwarmSpawner

    s = GPUSwarmSpawner(
        gpu_idle_timeout=7200, gpu_idle_threshold={"memory_mib": 500}, gpu_max_hours=8, gpu_max_hours_warning=60
    )
    assert s.reclaim_limits() == Limits(
        idle_timeout=7200,
        idle_warning=900,
        idle_utilization=5,
        idle_memory_mib=500,
        max_held=8 * 3600,
        max_held_warning=60,
    )
    assert GPUSwarmSpawner().reclaim_limits() == Limits()  # off by default


async def test_a_gpu_in_mig_mode_is_not_judged(tmp_path):
    world, owner, found, clock, stopped = await two_servers(tmp_path)
    a_name, a_gpu = uuid_of(owner, "alice")
    mig = device(0, a_gpu, mig_mode=True, utilization_gpu=0)
    for _ in range(10):
        clock.now += 10
        found.observe(parse_report(json.dumps(report(mig))))
        await found.check()
    assert found.activity(a_name) == {"last_gpu_activity": None, "idle_seconds": None} and stopped == []


def test_a_users_access_rules_set_their_idle_and_held_time_limits():
    from types import SimpleNamespace

    from gpuspawner.spawn.spawner import GPUSwarmSpawner

    rules = {
        "students": {"models": "*", "max_gpus": 1, "max_hours": 4, "idle_timeout": 1800, "idle_threshold": 10},
        "*": {"models": "*", "max_gpus": 1},
    }

    def spawner(*groups):
        user = SimpleNamespace(name="u", id=1, url="/user/u/", groups=[SimpleNamespace(name=g) for g in groups])
        return GPUSwarmSpawner(user=user, gpu_access=rules, gpu_idle_timeout=7200, gpu_max_hours=8)

    student = spawner("students").reclaim_limits()
    assert (student.idle_timeout, student.idle_utilization, student.max_held) == (1800, 10, 4 * 3600)
    other = spawner().reclaim_limits()  # "*" sets none of them: the hub's own settings
    assert (other.idle_timeout, other.idle_utilization, other.max_held) == (7200, 5, 8 * 3600)
    # In students and a group that leaves them to the hub: the more generous of each.
    rules["labs"] = {"models": "*", "max_gpus": 2}
    both = spawner("students", "labs").reclaim_limits()
    assert (both.idle_timeout, both.idle_utilization, both.max_held) == (7200, 5, 8 * 3600)


async def test_the_home_page_shows_each_server_its_gpu_share_memory_use_and_what_would_stop_it(tmp_path):
    from types import SimpleNamespace

    from gpuspawner.spawn.form import _templates
    from gpuspawner.web.home_gpus import server_rows, servers_var

    world, owner, found, clock, _ = await two_servers(tmp_path, shares=0.5)
    alice, carol = (SimpleNamespace(name=n, kind="user") for n in ("alice", "carol"))
    a_name, a_gpu = uuid_of(owner, "alice")
    await found.check()  # timing begins
    clock.now += 600
    report = reading({a_gpu: 37}, {a_gpu: [a_name]})
    world.hub.holdings.cluster.receive(report)  # the node's latest report, as the page reads it
    found.observe(report)
    [row] = server_rows(world.hub, "alice")
    assert (row["server"], row["model"], row["host"], row["phase"], row["held_for"]) == (
        "",
        A100,
        "gpu-b",
        "running",
        "10 min",
    )
    assert row["devices"] == [
        {"uuid": a_gpu, "share": "0.5 of the GPU", "entitled_mib": 40960, "used_mib": 500, "utilization": 37}
    ]
    assert row["stops"] == ["idle limit: after 60 s without GPU use"]  # busy now: the whole timeout is left
    html = " ".join(
        _templates(())
        .get_template("gpuspawner_servers.html")
        .render(gpuspawner_servers=servers_var(world.hub)(alice), user=alice)  # as JupyterHub calls it
        .split()
    )
    assert "Your GPUs" in html and "Default server" in html and f"{A100} on gpu-b · held for 10 min" in html
    assert f'<code class="user-select-all">{a_gpu}</code>: 0.5 of the GPU, 40 GiB of memory' in html
    assert "in use by this server: 0.5 GiB · GPU busy 37 %" in html
    assert "Stops at the idle limit: after 60 s without GPU use." in html
    nobody = (
        _templates(())
        .get_template("gpuspawner_servers.html")
        .render(gpuspawner_servers=servers_var(world.hub)(carol), user=carol)
    )
    assert "Your GPUs" not in nobody  # no GPU server: nothing shown
