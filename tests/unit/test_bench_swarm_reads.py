"""benchmarks/bench_swarm_reads.py, run small: the swarm it builds is read back by the
hub's own code as the specs say (summed per node, the hub's servers counted once),
the read happens at most once a second however many spawns ask, and its table has
a row per size with figures in order."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from benchmarks import bench_swarm_reads as bench
from gpuspawner.cluster.cluster import READ_WAIT, reservations_max_age
from gpuspawner.cluster.swarm import Swarm, SwarmError

LOG = logging.getLogger(__name__)
HAS = (bench.NODE_CPUS * 1000, bench.NODE_MEMORY_GIB * 1024)


def expected_free(built: bench.Built, host: str) -> tuple[int, int]:
    asked = built.asked.get(host, {}).values()
    return HAS[0] - sum(c for c, _ in asked), HAS[1] - sum(m for _, m in asked)


async def test_the_reservations_read_back_per_node_are_what_the_specs_reserve_summed_per_node():
    built = await bench.build(12, 150, seed=3)
    try:
        cluster = built.cluster
        hub = {n for h in built.asked.values() for n in h if n.startswith("jupyter-")}
        others = {n for h in built.asked.values() for n in h} - hub
        assert hub and others  # both kinds reserve something
        assert max(len(h) for h in built.asked.values()) >= 3  # a node where the sum is a sum
        got = await built.swarm.reservations()
        assert all(cluster.hostname_of(node) is not None for node in got)
        assert {cluster.hostname_of(node): by for node, by in got.items()} == built.asked
        # The hub's part, timed over ready-made lists, reads the same.
        assert await Swarm(bench.Replay(*bench.answers(built.fake)), built.pool).reservations() == got
        await bench.read(built)
        # The hub's servers are booked by their holdings and read from their tasks: counted once.
        for host in cluster.nodes:
            assert cluster.allocator.resources.free(host) == expected_free(built, host), host
    finally:
        built.close()


async def test_the_swarm_is_read_at_most_once_a_second_however_many_spawns_ask():
    """Guards docs/how-it-works.md, "CPU and memory count too": "What other services reserve is read at
    most once a second"."""
    built = await bench.build(6, 40, seed=5)
    try:
        fake, cluster = built.fake, built.cluster

        def reads() -> tuple[int, int]:
            return len(fake.calls_to("services")), len(fake.calls_to("tasks"))

        before = reads()
        await asyncio.gather(*(cluster.read_reservations(built.swarm, LOG) for _ in range(5)))  # a burst
        assert reads() == (before[0] + 1, before[1] + 1)
        host, by = next(
            (h, by) for h, by in sorted(built.asked.items()) if any(not n.startswith("jupyter-") for n in by)
        )
        name = next(n for n in by if not n.startswith("jupyter-"))
        fake.remove_service(name)  # its task is no longer desired running
        del by[name]
        await cluster.read_reservations(built.swarm, LOG)  # within the second: not asked, the figures stay
        assert reads() == (before[0] + 1, before[1] + 1)
        assert cluster.allocator.resources.free(host) != expected_free(built, host)
        await asyncio.sleep(cluster.reserved_max_age + 0.05)
        await cluster.read_reservations(built.swarm, LOG)
        assert reads() == (before[0] + 2, before[1] + 2)
        assert cluster.allocator.resources.free(host) == expected_free(built, host)
    finally:
        built.close()


async def test_a_read_that_takes_long_goes_on_in_the_background_is_made_less_often_and_one_that_fails_keeps_the_figures(
    monkeypatch,
):
    """Guards docs/how-it-works.md, "CPU and memory count too": "a spawn gives a read 0.25 s to finish
    and then goes on with the figures read before, the read finishing meanwhile"."""
    built = await bench.build(4, 16, seed=7)
    try:
        fake, cluster, swarm = built.fake, built.cluster, built.swarm
        host, by = next(
            (h, by) for h, by in sorted(built.asked.items()) if any(not n.startswith("jupyter-") for n in by)
        )
        real = swarm.reservations
        await cluster.read_reservations(swarm, LOG)  # the first read: waited for to its end
        assert cluster.reading is None

        async def slow():
            await asyncio.sleep(0.6)
            return await real()

        monkeypatch.setattr(swarm, "reservations", slow)
        name = next(n for n in by if not n.startswith("jupyter-"))
        fake.remove_service(name)
        del by[name]
        await asyncio.sleep(cluster.reserved_max_age + 0.05)
        t0 = time.monotonic()
        await cluster.read_reservations(swarm, LOG)  # waits READ_WAIT, then goes on with the last figures
        assert READ_WAIT - 0.01 <= time.monotonic() - t0 < READ_WAIT + 0.2
        assert cluster.allocator.resources.free(host) != expected_free(built, host)
        assert cluster.reading is not None
        await cluster.reading  # the read went on
        assert cluster.allocator.resources.free(host) == expected_free(built, host)
        assert cluster.reserved_max_age == 1.0  # by the swarm's size (4 nodes), not by the read's 0.6 s
        await cluster.read_reservations(swarm, LOG)
        assert cluster.reading is None  # the figures are fresh: not read again

        async def down():
            raise SwarmError("the manager does not answer")

        monkeypatch.setattr(swarm, "reservations", down)
        cluster._reserved_at -= cluster.reserved_max_age  # as if that long had passed
        await cluster.read_reservations(swarm, LOG)
        assert cluster.reading is None and cluster.allocator.resources.free(host) == expected_free(built, host)
        monkeypatch.setattr(swarm, "reservations", real)
        await cluster.read_reservations(swarm, LOG)  # the figures are still old: read again at once
        assert cluster.reading is None and cluster.reserved_max_age == 1.0
    finally:
        built.close()


def test_figures_are_kept_a_second_per_hundred_nodes_and_at_least_a_second():
    """Guards docs/how-it-works.md, "CPU and memory count too": "a second per 100 nodes: every 10 s at
    a thousand nodes"."""
    assert [reservations_max_age(n) for n in (0, 3, 100, 250, 1000, 1213)] == [1.0, 1.0, 1.0, 2.5, 10.0, 12.13]


async def test_a_read_cancelled_before_it_began_does_not_stop_later_reads(monkeypatch):
    built = await bench.build(4, 16, seed=9)
    try:
        cluster, swarm = built.cluster, built.swarm
        await cluster.read_reservations(swarm, LOG)  # the first read
        cluster._reserved_at = -float("inf")
        cluster._reading = asyncio.ensure_future(asyncio.sleep(1))  # as a hub's stop leaves one
        cluster._reading.cancel()
        await asyncio.sleep(0)
        reads = len(built.fake.calls_to("tasks"))
        await cluster.read_reservations(swarm, LOG)
        assert len(built.fake.calls_to("tasks")) == reads + 1
    finally:
        built.close()


def test_the_benchmark_gives_a_row_per_size_with_its_figures_in_order(capsys):
    assert bench.main(["--nodes", "4", "8", "--services", "20", "50", "--repeats", "3", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [(r["nodes"], r["services"], r["running_tasks"]) for r in results] == [(4, 20, 20), (8, 50, 50)]
    for r in results:
        assert 0 < r["hub_servers"] < r["services"] and r["repeats"] == 3
        assert r["services_json_bytes"] > 1000 * r["services"] // 2 and r["tasks_json_bytes"] > 0
        keys = ("read", "read_gc_off", "spawn_wait", "fake_lists", "hub_reservations", "set_host_reserved", "decode")
        for key in (*keys, "free_all"):
            assert 0 <= r[key]["p50_ms"] <= r[key]["p95_ms"] <= r[key]["max_ms"], key
        assert r["spawn_wait"]["max_ms"] < 1000 * READ_WAIT + 100  # never the whole read, once one was made
        assert r["max_age_s"] >= 1.0
    assert results[1]["tasks_json_bytes"] > results[0]["tasks_json_bytes"]
    rows = bench.table(results).splitlines()
    assert len(rows) == 4 and rows[2].startswith("| 4 | 20 (") and rows[3].startswith("| 8 | 50 (")
    assert bench.main(["--nodes", "4", "8", "--services", "20"]) == 2  # one count per size
