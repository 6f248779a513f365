"""Backfill in the hub's line, with the real spawner over the fake swarm: a large
request waits at the head with its planned host kept; a small one behind it, or a
new one, is served at once on another host, never on the kept one; with
``gpu_line_backfill = False`` nobody goes ahead of the head.

Guards docs/line.md, "Backfill": "the host where it would fit first is kept for
it", "a request behind it, or a new one, that fits on another host is served at
once" and "gpu_line_backfill = False is strict order"."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime, timedelta, timezone

import pytest
from jupyterhub.spawner import SpawnException

from gpuspawner.spawn.errors import spawn_error
from gpuspawner.web.api import queue_json
from tests.unit.test_holdings import A100, World
from tests.unit.test_line import WAIT, admin_page, messages, stopped, until
from tests.unit.test_reservations_hub import NOW, THREE, Wall, new_hub, reserve, spawner

TWO_HOSTS = {
    "gpu-a": [{"uuid": f"GPU-a{i}", "model": A100, "memory_mib": 81920} for i in range(2)],
    "gpu-b": [{"uuid": "GPU-b0", "model": A100, "memory_mib": 81920}],
}


async def big_at_the_head(world: World):
    """Alice holds one A100 on gpu-a; bob waits for two (only gpu-a has two)."""
    alice = world.spawner("alice", {"gpu_model": A100, "gpu_count": 1, "gpu_host": "gpu-a"})
    await world.started(alice)
    assert world.owner.get(alice.service_name).held.host == "gpu-a"
    bob = world.spawner("bob", {**WAIT, "gpu_count": 2})
    bob_start = asyncio.ensure_future(world.started(bob))
    await until(lambda: world.hub.line.place(bob.service_name) == (A100, 1))
    return alice, bob, bob_start


async def test_a_small_request_behind_a_large_one_is_served_at_once_on_another_host(tmp_path):
    world = World(tmp_path, inventory=TWO_HOSTS, allow_host_choice=True, max_gpus_per_user=2)
    alice, bob, bob_start = await big_at_the_head(world)
    await until(lambda: world.hub.line.planned_host(bob.service_name) == "gpu-a")
    carol = world.spawner("carol", {**WAIT, "gpu_count": 1})
    await asyncio.wait_for(world.started(carol), 10)  # not in line: gpu-b's A100 fits her
    assert world.owner.get(carol.service_name).held.uuids == ("GPU-b0",)
    assert world.hub.line.place(bob.service_name) == (A100, 1)
    # Gpu-a's free A100 is kept for bob: dave (no gpu_wait) is told the line goes first.
    with pytest.raises(SpawnException) as exc:
        await world.spawner("dave", {"gpu_model": A100}).start()
    assert exc.value.status_code == 409 and "1 request is waiting in line" in exc.value.message
    assert world.owner.get("jupyter-dave") is None
    # Erin waits behind bob: gpu-a is kept for him, gpu-b (carol's) is planned for her.
    erin = world.spawner("erin", {**WAIT, "gpu_count": 1})
    erin_start = asyncio.ensure_future(erin.start())
    await until(lambda: world.hub.line.place(erin.service_name) == (A100, 2))
    await until(
        lambda: world.hub.line.planned_host(erin.service_name) is not None
    )  # planned at a serving after she joined
    lines = await queue_json(world.hub.line)
    assert [(w["user"], w["planned_host"]) for w in lines[A100]] == [("bob", "gpu-a"), ("erin", "gpu-b")]
    # Carol was granted ahead of bob: marked in the queue API and on /hub/gpus.
    assert lines[A100][0]["passed_by"] == [{"user": "carol", "server": "", "host": "gpu-b"}]
    assert admin_page(lines)[0][4:] == ["gpu-a", "carol on gpu-b"]
    await stopped(world, alice)
    await asyncio.wait_for(bob_start, 10)
    assert world.owner.get(bob.service_name).held.uuids == ("GPU-a0", "GPU-a1")
    assert world.hub.line.place(erin.service_name) == (A100, 1)
    erin_start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await erin_start
    await erin.stop()
    world.ledger_matches()


async def test_strict_order_serves_nobody_ahead_of_the_head(tmp_path):
    world = World(tmp_path, inventory=TWO_HOSTS, allow_host_choice=True, max_gpus_per_user=2, gpu_line_backfill=False)
    alice, bob, bob_start = await big_at_the_head(world)
    carol = world.spawner("carol", {**WAIT, "gpu_count": 1})
    carol_start = asyncio.ensure_future(world.started(carol))
    await until(lambda: world.hub.line.place(carol.service_name) == (A100, 2))
    assert world.owner.get(carol.service_name) is None  # gpu-b's A100 stays free
    assert any("number 2" in m for m in messages(carol))
    await stopped(world, alice)
    await asyncio.wait_for(bob_start, 10)
    await asyncio.wait_for(carol_start, 10)  # then carol, on gpu-b
    assert world.owner.get(carol.service_name).held.uuids == ("GPU-b0",)
    world.ledger_matches()


@pytest.mark.parametrize("backfill", [True, False], ids=["backfill", "strict"])
async def test_a_reservations_refusal_lets_no_small_request_jump_a_large_one(tmp_path, backfill):
    """Issue 38, "A reservation's refusal lets a small request jump a large one". An open
    window keeps 1 of 3 A100s (one host) and dan holds one: bob's 2 are refused as
    reserved, so he waits first. Carol (no group) asks for 1 after him: she waits behind
    him (without gpu_wait she is refused with the line's message), though the GPU left
    over the kept one is free; alice (CS101) is still granted the kept one. When dan
    stops, bob is served first; carol still waits.

    Guards docs/reservations.md, "One plan with the line": "nobody behind it who is not a
    member of that reservation takes the GPUs it waits for" and "In strict order ... only
    those members are"."""
    world = World(tmp_path, inventory=THREE, max_gpus_per_user=2, gpu_line_backfill=backfill)
    new_hub(world, Wall())
    reserve(world, NOW - timedelta(minutes=30), count=1)
    dan = spawner(world, "dan")
    await world.started(dan)
    line = world.hub.line
    bob = spawner(world, "bob", {**WAIT, "gpu_count": 2})
    bob_start = asyncio.ensure_future(world.started(bob))
    await until(lambda: line.place(bob.service_name) == (A100, 1))
    with pytest.raises(SpawnException) as refused:
        await world.started(spawner(world, "carol"))
    assert refused.value.status_code == 409 and "1 request is waiting in line" in refused.value.message
    assert world.owner.get("jupyter-carol") is None
    carol = spawner(world, "carol", {**WAIT, "gpu_count": 1})
    carol_start = asyncio.ensure_future(world.started(carol))
    await until(lambda: line.place(carol.service_name) == (A100, 2))
    line.poke()  # a serving after she joined: bob is refused as reserved again
    await until(lambda: any("number 2" in m for m in messages(carol)))
    assert world.owner.get(carol.service_name) is None and not carol_start.done()
    assert line.planned_host(bob.service_name) == ("gpu-b" if backfill else None)  # the host kept for him
    await world.started(spawner(world, "alice"))  # a member: the kept GPU is hers
    assert world.owner.get("jupyter-alice").held.uuids
    assert world.owner.get(carol.service_name) is None and line.place(carol.service_name) == (A100, 2)
    await stopped(world, dan)
    await asyncio.wait_for(bob_start, 10)
    assert len(world.owner.get(bob.service_name).held.uuids) == 2
    assert world.owner.get(carol.service_name) is None and line.place(carol.service_name) == (A100, 1)
    carol_start.cancel()
    await asyncio.gather(carol_start, return_exceptions=True)
    world.ledger_matches()


async def test_a_waiter_is_told_when_it_starts_where_the_holders_have_a_time_limit(tmp_path):
    """Guards docs/line.md: "Where the servers it waits for have a time limit ... about when"."""
    world = World(tmp_path, inventory=TWO_HOSTS, allow_host_choice=True, max_gpus_per_user=2, gpu_max_hours=2)
    alice, bob, bob_start = await big_at_the_head(world)
    await until(lambda: any("Planned: about" in m for m in messages(bob)))
    [told] = [m for m in messages(bob) if "Planned: about" in m]
    assert re.fullmatch(
        rf"You are number 1 in line for {A100}\. Planned: about \d\d:\d\d UTC on gpu-a, "
        "when a server there reaches its time limit",
        told,
    )
    [row] = (await queue_json(world.hub.line))[A100]
    start = datetime.fromisoformat(row["planned_start"].replace("Z", "+00:00"))
    # Alice's two hours began a moment ago.
    assert timedelta(hours=1, minutes=59) < start - datetime.now(timezone.utc) <= timedelta(hours=2)
    bob_start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await bob_start


async def test_a_waiter_that_leaves_and_joins_again_is_told_nothing_of_an_old_plan(tmp_path):
    """Its line emptied when it left: the plan made for it then is gone, and it is planned anew."""
    world = World(tmp_path, inventory=TWO_HOSTS, allow_host_choice=True, max_gpus_per_user=2, gpu_max_hours=2)
    alice, bob, bob_start = await big_at_the_head(world)
    line = world.hub.line
    await until(lambda: line.planned_at(bob.service_name) is not None)
    await line.remove("bob", "", spawn_error("taken out", reason="line_removed", status_code=503))
    with pytest.raises(SpawnException):
        await bob_start
    assert line.rows == [] and line._plans == {}
    assert line.planned_at(bob.service_name) is None and line.plan_text(bob.service_name) == ""
    again = asyncio.ensure_future(bob.start())
    await until(lambda: any("Planned: about" in m for m in messages(bob)))
    assert line.planned_host(bob.service_name) == "gpu-a"
    await line.remove("bob", "", spawn_error("taken out", reason="line_removed", status_code=503))
    await asyncio.gather(again, return_exceptions=True)


async def test_a_server_without_gpus_is_kept_off_the_hosts_planned_for_waiters(tmp_path):
    """Guards docs/line.md, "Backfill": "a server without GPUs is not placed on a host kept for a waiter"."""
    world = World(tmp_path, inventory=TWO_HOSTS, allow_host_choice=True, max_gpus_per_user=2)
    alice, bob, bob_start = await big_at_the_head(world)
    await until(lambda: world.hub.line.planned_host(bob.service_name) == "gpu-a")
    assert world.hub.line.kept_by_any() == {"gpu-a"}
    await stopped(world, alice)
    await asyncio.wait_for(bob_start, 10)
    assert world.hub.line.kept_by_any() == frozenset()  # nobody waits: nothing kept


async def test_a_waiter_is_told_what_it_waits_for_and_one_behind_it_that_every_host_is_kept(tmp_path):
    """Guards docs/line.md, "Backfill": the waiting page, the home page and the queue API
    say what each waiter waits for: the host kept for it, how much of what it asked for is
    free there now, and when it starts there or that nobody can say; or that every host that
    could take it is kept for a request ahead of it."""
    from gpuspawner.web.home_gpus import server_rows, waiting_var

    world = World(tmp_path, inventory=TWO_HOSTS, allow_host_choice=True, max_gpus_per_user=2)
    alice, bob, bob_start = await big_at_the_head(world)  # no time limits: no planned start
    carol = world.spawner("carol", {**WAIT, "gpu_count": 2})
    carol_start = asyncio.ensure_future(world.started(carol))
    line = world.hub.line
    await until(lambda: line.place(carol.service_name) == (A100, 2))
    line.poke()
    kept = "Kept for you: gpu-a, where 1 of the 2 GPUs you asked for is free now; no estimate of when: a server there has no time limit"
    behind = "Every host that could take your request is kept for a request ahead of yours"
    await until(lambda: any(kept in m for m in messages(bob)) and any(behind in m for m in messages(carol)))
    assert messages(bob)[-1].startswith(f"You are number 1 in line for {A100}. {kept}")
    assert line.why(bob.service_name) == kept and line.why(carol.service_name) == behind
    queue = await queue_json(line)
    assert [row["why"] for row in queue[A100]] == [kept, behind]
    [home] = server_rows(world.hub, "carol")
    assert home["why"] == behind
    assert waiting_var(world.hub)(None)(bob)["why"] == kept  # the waiting page
    for start in (bob_start, carol_start):
        start.cancel()
    await asyncio.gather(bob_start, carol_start, return_exceptions=True)


def test_what_a_waiter_is_told_of_a_share_and_of_one_gpu():
    from gpuspawner.core.line_order import kept_text

    assert kept_text("gpu-a", 1, 0, "", False) == (
        "Kept for you: gpu-a, where 0 of the 1 GPU you asked for are free now; "
        "no estimate of when: a server there has no time limit"
    )
    assert kept_text("gpu-a", 0, 0, "about 14:20 UTC, when a server there reaches its time limit", False) == (
        "Kept for you: gpu-a, where no device there has room for your share yet; "
        "planned start about 14:20 UTC, when a server there reaches its time limit"
    )
    assert kept_text(None, 0, 0, "", False) == ""  # strict order: the place in line says it


async def test_a_server_ending_elsewhere_leaves_the_head_on_the_host_that_starts_it_soonest(tmp_path):
    """Alice's server on gpu-b began first, so it reaches its limit first: bob (four GPUs)
    is planned there. Dan's server on gpu-a ends; gpu-a then lacks as little as gpu-b and
    comes first by name, but carol's server there ends later: bob stays planned on gpu-b.

    Guards docs/line.md, "Backfill": "A waiter with a planned start keeps its host from one
    serving to the next unless another host would start it sooner"."""
    four = [{"uuid": f"GPU-{{}}{i}", "model": A100, "memory_mib": 81920} for i in range(4)]
    inventory = {h: [{**g, "uuid": g["uuid"].format(h[-1])} for g in four] for h in ("gpu-a", "gpu-b")}
    world = World(tmp_path, inventory=inventory, allow_host_choice=True, max_gpus_per_user=4, gpu_max_hours=2)
    servers = {}
    for user, host in (("alice", "gpu-b"), ("carol", "gpu-a"), ("dan", "gpu-a")):
        servers[user] = world.spawner(user, {"gpu_model": A100, "gpu_count": 1, "gpu_host": host})
        await world.started(servers[user])
    bob = world.spawner("bob", {**WAIT, "gpu_count": 4})
    bob_start = asyncio.ensure_future(world.started(bob))
    line = world.hub.line
    await until(lambda: line.planned_at(bob.service_name) is not None)
    assert line.planned_host(bob.service_name) == "gpu-b"  # lacks 1 GPU, gpu-a 2
    planned = line.planned_at(bob.service_name)
    await stopped(world, servers["dan"])
    since = time.monotonic()
    await until(lambda: line._plans[A100][0] > since)  # the line served again since
    assert line.planned_host(bob.service_name) == "gpu-b"
    assert line.planned_at(bob.service_name) <= planned + timedelta(seconds=1)
    bob_start.cancel()
    await asyncio.gather(bob_start, return_exceptions=True)
