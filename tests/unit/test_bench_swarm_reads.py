"""benchmarks/bench_swarm_reads.py, run small: the swarm it builds is read back by the
hub's own code as the specs say (summed per node, the hub's servers counted once),
the read happens at most once a second however many spawns ask, and its table has
a row per size with figures in order."""

from __future__ import annotations

import asyncio
import json
import logging

from benchmarks import bench_swarm_reads as bench
from gpuspawner.cluster.swarm import Swarm

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
        await asyncio.sleep(1.05)
        await cluster.read_reservations(built.swarm, LOG)
        assert reads() == (before[0] + 2, before[1] + 2)
        assert cluster.allocator.resources.free(host) == expected_free(built, host)
    finally:
        built.close()


def test_the_benchmark_gives_a_row_per_size_with_its_figures_in_order(capsys):
    assert bench.main(["--nodes", "4", "8", "--services", "20", "50", "--repeats", "3", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [(r["nodes"], r["services"], r["running_tasks"]) for r in results] == [(4, 20, 20), (8, 50, 50)]
    for r in results:
        assert 0 < r["hub_servers"] < r["services"] and r["repeats"] == 3
        assert r["services_json_bytes"] > 1000 * r["services"] // 2 and r["tasks_json_bytes"] > 0
        for key in ("read", "read_gc_off", "fake_lists", "hub_reservations", "set_host_reserved", "decode", "free_all"):
            assert 0 <= r[key]["p50_ms"] <= r[key]["p95_ms"] <= r[key]["max_ms"], key
    assert results[1]["tasks_json_bytes"] > results[0]["tasks_json_bytes"]
    rows = bench.table(results).splitlines()
    assert len(rows) == 4 and rows[2].startswith("| 4 | 20 (") and rows[3].startswith("| 8 | 50 (")
    assert bench.main(["--nodes", "4", "8", "--services", "20"]) == 2  # one count per size
