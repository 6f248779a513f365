"""The trace benchmark (benchmarks/bench_trace.py) on a tiny trace in OpenB's format
whose figures are known by hand: the published experiment's order, the unallocated
GPU %, the fragmentation rate, and that tasks go through the real allocator with
their CPU, memory and models (pure: files in a temporary folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_trace as bench

NODES = """sn,cpu_milli,memory_mib,gpu,model
n1,8000,65536,2,T4
n2,4000,65536,1,G2
"""
# Two whole T4-or-G2 GPUs, a quarter of a G2 (only G2), a CPU-only task, and a task
# whose 16 CPUs fit on no node.
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,2000,1024,1,1000,T4|G2,LS,Running,0,1,0
p1,2000,1024,1,1000,,LS,Running,0,1,0
p2,1000,1024,1,250,G2,LS,Running,0,1,0
p3,1000,1024,0,0,,LS,Running,0,1,0
p4,16000,1024,1,1000,,LS,Running,0,1,0
"""


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES)
    (tmp_path / "openb_pod_list_tiny.csv").write_text(PODS)
    return tmp_path


def test_tasks_become_requests_with_their_cpu_memory_and_models(trace):
    tasks = bench.read_tasks(trace, "tiny")
    assert [t.gpu_request for t in tasks] == [1000, 1000, 250, 0, 1000]
    share, cpu_only = tasks[2].request(), tasks[3].request()
    assert (share.milli, share.models, share.cpu_milli) == (250, ("G2",), 1000)
    assert (cpu_only.count, cpu_only.milli, cpu_only.memory_mib) == (0, None, 1024)
    assert tasks[0].request().models == ("T4", "G2") and tasks[1].request().models is None


def test_the_order_is_the_shuffled_list_then_draws_until_130_percent(trace):
    tasks = bench.read_tasks(trace, "tiny")
    order = bench.arrivals(tasks, 3000, seed=4)
    assert sorted(order[: len(tasks)], key=tasks.index) == tasks  # every task once, shuffled
    asked = sum(t.gpu_request for t in order)
    assert asked >= 3900 and asked - order[-1].gpu_request < 3900  # stops once 130 % is reached
    assert bench.arrivals(tasks, 3000, seed=4) == order  # a seed gives the same order
    thinned = bench.arrivals(tasks * 10, 3000, seed=4)  # asks for 3250 % of the cluster: thinned
    assert 3900 <= sum(t.gpu_request for t in thinned) < 3900 + 1000


def test_fragmentation_counts_free_gpu_each_typical_task_could_not_use(trace):
    nodes = bench.read_nodes(trace)
    alloc = bench.build(nodes, "pack")
    alloc.allocate("a", bench.Task(7000, 1024, 1, 1000, ()).request())  # n1: 1 T4 and 1 CPU left
    alloc.allocate("b", bench.Task(1000, 1024, 1, 600, ("G2",)).request())  # 0.6 of n2's G2
    whole = bench.Task(2000, 1024, 1, 1000, ())  # n1 lacks the CPU; n2 has no whole GPU
    small = bench.Task(500, 1024, 1, 300, ())  # fits on n1's T4 and in n2's 0.4
    # Free: n1 1000 (unusable by `whole`: too little CPU), n2 400 (too small for `whole`).
    assert bench.fragmentation(alloc, nodes, [(whole, 1.0)]) == 1.0
    assert bench.fragmentation(alloc, nodes, [(small, 1.0)]) == 0.0
    assert bench.fragmentation(alloc, nodes, [(whole, 0.5), (small, 0.5)]) == 0.5


def test_the_replay_reports_unallocated_gpu_and_drops_what_fits_nowhere(trace, capsys):
    assert bench.main(["--trace", str(trace), "--list", "tiny", "--seeds", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["nodes"], result["gpus"], result["tasks"]) == (2, 3, 5)
    for policy in ("pack", "spread"):
        r = result["policies"][policy]
        assert len(r["unallocated"]) == len(bench.ARRIVED)
        # Never more than all GPUs placed; unallocated falls (or stays) as more arrives.
        assert all(0 <= u <= 100 for u in r["unallocated"]) and r["unallocated"] == sorted(
            r["unallocated"], reverse=True
        )
        assert r["dropped"] >= 1  # the 16-CPU task, at least, fits nowhere
        assert r["decision_us_p99"] >= r["decision_us_p50"] > 0


def test_frag_is_given_the_typical_task_shapes_as_its_mix(trace, capsys):
    nodes, tasks = bench.read_nodes(trace), bench.read_tasks(trace, "tiny")
    alloc = bench.build(nodes, "frag", bench.typical(tasks))
    assert alloc.mix is not None and sorted((s.count, s.milli, sorted(s.models or ())) for s in alloc.mix.shapes) == [
        (0, 1000, []),
        (1, 250, ["G2"]),
        (1, 1000, []),
        (1, 1000, []),  # the 16-CPU one: a shape of its own
        (1, 1000, ["G2", "T4"]),
    ]
    assert bench.build(nodes, "pack", bench.typical(tasks)).mix is not None  # (pack ignores it)
    assert bench.main(["--trace", str(trace), "--list", "tiny", "--seeds", "2", "--policies", "frag", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policies"]["frag"]["dropped"] >= 1


def test_a_missing_trace_is_said_plainly(tmp_path, capsys):
    assert bench.main(["--trace", str(tmp_path)]) == 2
    assert "give the OpenB trace's folder" in capsys.readouterr().err
