"""Backfill in the hub's line, with the real spawner over the fake swarm: a large
request waits at the head with its planned host kept; a small one behind it, or a
new one, is served at once on another host, never on the kept one; with
``gpu_line_backfill = False`` nobody goes ahead of the head.

Guards docs/line.md, "Backfill": "the host where it would fit first is kept for
it", "a request behind it, or a new one, that fits on another host is served at
once" and "gpu_line_backfill = False: strict order"."""

from __future__ import annotations

import asyncio

import pytest
from jupyterhub.spawner import SpawnException

from gpuspawner.web.api import queue_json
from tests.unit.test_holdings import A100, World
from tests.unit.test_line import WAIT, messages, stopped, until

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
    await until(lambda: world.hub.line.planned.get(bob.service_name) == "gpu-a")
    carol = world.spawner("carol", {**WAIT, "gpu_count": 1})
    await asyncio.wait_for(world.started(carol), 10)  # not in line: gpu-b's A100 fits her
    assert world.owner.get(carol.service_name).held.uuids == ("GPU-b0",)
    assert world.hub.line.place(bob.service_name) == (A100, 1)
    # Gpu-a's free A100 is kept for bob: dave (no gpu_wait) is told the line goes first.
    with pytest.raises(SpawnException) as exc:
        await world.spawner("dave", {"gpu_model": A100}).start()
    assert exc.value.status_code == 503 and "1 request is waiting in line" in exc.value.message
    assert world.owner.get("jupyter-dave") is None
    # Erin waits behind bob: gpu-a is kept for him, gpu-b (carol's) is planned for her.
    erin = world.spawner("erin", {**WAIT, "gpu_count": 1})
    erin_start = asyncio.ensure_future(erin.start())
    await until(lambda: world.hub.line.place(erin.service_name) == (A100, 2))
    lines = await queue_json(world.hub.line)
    assert [(w["user"], w["planned_host"]) for w in lines[A100]] == [("bob", "gpu-a"), ("erin", "gpu-b")]
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
