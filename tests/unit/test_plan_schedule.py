"""Planned starts hold where the servers' ends are known: no waiter starts later than the
start planned for it when it first headed its line (pure: random schedules run through
the departures benchmark's serving, which serves its line with the product's
:class:`gpuspawner.plan.backfill.Round` and :func:`planned_start`).

Guards docs/line.md, "Backfill": "where every holder has a time limit, the waiter at the
head of the line starts no later than the start planned for it then"."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bench_trace import Ask, Draws, Node, Task, live
from gpuspawner.core.requests import Request
from gpuspawner.core.sharing import UNIT
from gpuspawner.plan.backfill import planned_start

MODEL = "A100"


def test_a_waiter_starts_once_its_cpu_and_memory_are_free_too_not_only_its_gpus():
    devices = {"d0": {"gpu-holder": UNIT}}
    ends = {"gpu-holder": 50.0, "cpu-holder": 100.0, "forever": None}.get
    asks = Request(count=1, cpu_milli=8000, memory_mib=1024)
    room = ((2000, 4096), {"cpu-holder": (6000, 0), "gpu-holder": (0, 0)})
    assert planned_start(asks, devices, ends) == (50.0, "gpu-holder")  # GPUs alone
    assert planned_start(asks, devices, ends, room) == (100.0, "cpu-holder")
    assert planned_start(asks, devices, ends, ((2000, 4096), {"forever": (6000, 0)})) is None  # never known
    assert planned_start(asks, devices, ends, ((8000, 4096), {})) == (50.0, "gpu-holder")  # CPU free now
    assert planned_start(asks, devices, ends, (None, {})) == (50.0, "gpu-holder")  # CPU not limited


def _task(draw) -> Task:
    kind = draw(st.sampled_from(["cpu", "share", "whole"]))
    cpu, mem = draw(st.integers(0, 16)) * 500, draw(st.integers(0, 8)) * 1024
    if kind == "cpu":
        return Task(max(cpu, 500), mem, 0, 0, ())
    if kind == "share":
        return Task(cpu, mem, 1, draw(st.sampled_from([250, 500, 750])), ())
    return Task(cpu, mem, draw(st.integers(1, 4)), UNIT, ())


@st.composite
def schedules(draw) -> tuple[list[Node], Draws]:
    nodes = [
        Node(f"gpu-{i}", draw(st.integers(2, 8)) * 1000, draw(st.integers(2, 8)) * 1024, draw(st.integers(1, 4)), MODEL)
        for i in range(draw(st.integers(1, 4)))
    ]
    running = [Ask(i, _task(draw), 0.0, float(draw(st.integers(1, 50))), 0.0) for i in range(draw(st.integers(0, 8)))]
    asks, at = [], 0.0
    for i in range(len(running), len(running) + draw(st.integers(1, 25))):
        at += draw(st.integers(0, 10))
        patience = float(draw(st.sampled_from([5, 30, 10_000])))
        asks.append(Ask(i, _task(draw), at, float(draw(st.integers(1, 50))), patience))
    return nodes, Draws(running, asks, at + 1000.0)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules(), st.sampled_from(["default", "pack", "spread"]))
def test_no_waiter_starts_later_than_planned_when_it_first_headed_the_line(case, policy):
    nodes, draws = case
    life = live(nodes, draws, policy, [], "none", ends="known")
    assert life.late == []
    for ask, at, _ in life.served:  # and each one planned started when it was planned, or sooner
        planned = life.head_plans.get(ask.id)
        assert planned is None or at <= planned + 1e-6


def test_the_schedules_do_plan_starts_and_serve_ahead_of_a_waiter():
    """The property above is not empty: one schedule where the head's start is planned
    and a later request is served before it on another host."""
    nodes = [Node("gpu-0", 8000, 8192, 4, MODEL), Node("gpu-1", 8000, 8192, 1, MODEL)]
    running = [Ask(0, Task(0, 0, 2, UNIT, ()), 0.0, 100.0, 0.0)]
    asks = [Ask(1, Task(0, 0, 4, UNIT, ()), 1.0, 10.0, 10_000.0), Ask(2, Task(0, 0, 1, UNIT, ()), 2.0, 10.0, 10_000.0)]
    life = live(nodes, Draws(running, asks, 1000.0), "pack", [], "none", ends="known")
    assert life.head_plans[1] == 100.0  # the 4-GPU request: when the 2-GPU server ends
    started = {ask.id: (at, got.host) for ask, at, got in life.served}
    assert started[2] == (2.0, "gpu-1") and started[1] == (100.0, "gpu-0")
    assert life.late == []


def test_a_server_ending_elsewhere_does_not_move_the_heads_plan_to_a_host_that_starts_it_later():
    """Ask 3 (5 GiB) heads the line planned on gpu-a at 43, when the CPU-only server
    there ends. At 42 ask 1 ends on gpu-a, and gpu-b, with fewer untouched GPUs, lacks
    least; planned there (at 44), ask 3 would let ask 4 (3 GiB, until 44) onto gpu-a and
    start at 44. It keeps gpu-a, as planned, and ask 4 waits."""
    nodes = [Node("gpu-a", 2000, 7168, 4, MODEL), Node("gpu-b", 2000, 5120, 4, MODEL)]
    running = [Ask(0, Task(500, 4096, 0, 0, ()), 0.0, 43.0, 0.0)]
    asks = [
        Ask(1, Task(0, 1024, 1, 250, ()), 0.0, 42.0, 5.0),
        Ask(2, Task(0, 3072, 1, 250, ()), 14.0, 30.0, 5.0),
        Ask(3, Task(0, 5120, 1, 250, ()), 14.0, 1.0, 30.0),
        Ask(4, Task(0, 3072, 1, 250, ()), 14.0, 2.0, 30.0),
    ]
    life = live(nodes, Draws(running, asks, 1000.0), "default", [], "none", ends="known")
    assert life.head_plans[3] == 43.0 and life.late == []
    started = {ask.id: (at, got.host) for ask, at, got in life.served}
    assert started[3] == (43.0, "gpu-a") and started[4] == (44.0, "gpu-b")


def test_a_server_without_gpus_goes_on_a_host_no_waiter_is_planned_on_or_is_told_why_not():
    from gpuspawner.allocator.allocator import AllocationRefused, Allocator
    from gpuspawner.allocator.refusals import Refusal
    from gpuspawner.core.inventory import GPU

    alloc = Allocator([GPU(h, 0, f"GPU-{h}", MODEL, 0) for h in ("gpu-a", "gpu-b")])
    for host in ("gpu-a", "gpu-b"):
        alloc.set_host_resources(host, 8000, 8192)
    cpu = Request(count=0, cpu_milli=4000, memory_mib=1024)
    assert alloc.allocate("one", replace(cpu, avoid=frozenset({"gpu-a"}))).host == "gpu-b"
    alloc.allocate("two", replace(cpu, cpu_milli=4000, host="gpu-b"))  # gpu-b's CPUs all held now
    try:
        alloc.allocate("three", replace(cpu, avoid=frozenset({"gpu-a"})))
    except AllocationRefused as exc:
        assert exc.reason is Refusal.HELD_FOR_LINE and "gpu-a" in exc.message and exc.retry
    else:
        raise AssertionError("placed on the host kept for a waiter")
    assert alloc.allocate("three", cpu).host == "gpu-a"  # nobody waits: anywhere with room
