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


# With departures: three nodes, two models; whole GPUs of one, either or any model, shares
# of a G2 and of a T4, 2 and 4 GPUs on one node, a CPU-only task, each run for its own time,
# and a pending task (no times).
LIFE_NODES = """sn,cpu_milli,memory_mib,gpu,model
n1,8000,65536,2,T4
n2,4000,65536,1,G2
n3,16000,131072,4,T4
"""
LIFE_PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,2000,4096,1,1000,T4|G2,LS,Running,0,600,0
p1,2000,4096,1,1000,,LS,Running,0,1800,0
p2,1000,2048,1,250,G2,LS,Running,0,3600,0
p3,1000,2048,1,500,T4,LS,Running,0,300,0
p4,4000,8192,2,1000,,LS,Running,0,7200,0
p5,8000,16384,4,1000,T4,LS,Running,0,900,0
p6,1000,1024,0,0,,BE,Running,0,1200,0
p7,2000,4096,1,1000,G2,LS,Running,0,36000,0
p8,1000,2048,1,1000,T4,LS,Pending,0,,
"""


@pytest.fixture
def life(tmp_path: Path) -> Path:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(LIFE_NODES)
    (tmp_path / "openb_pod_list_life.csv").write_text(LIFE_PODS)
    (tmp_path / "openb_pod_list_timeless.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,1000\n"
    )
    return tmp_path


def lines_of(task: bench.Task) -> frozenset[str]:
    """The model lines a request waits in (the test's own reading of the rule)."""
    return frozenset() if task.num_gpu == 0 else frozenset(task.spec) or frozenset({"T4", "G2"})


@pytest.mark.parametrize("policy", ["strict", "pack", "spread", "frag", "default"])
def test_with_departures_the_line_and_the_devices_keep_their_rules(life, policy):
    nodes, tasks = bench.read_nodes(life), bench.read_tasks(life, "life")
    durations = bench.read_durations(life, "life")
    assert durations == [600, 1800, 3600, 300, 7200, 900, 1200, 36000]  # the pending task has none
    capacity = 7000
    draws = bench.draw(tasks, durations, capacity, seed=1, load=1.0, patience=7200, upto=20)
    assert draws.running and len(draws.asks) > 100 and draws.span == draws.asks[-1].at
    run = bench.live(nodes, draws, policy, bench.typical(tasks))

    # Each request is served, gave up or still waits, exactly once; those running at the start were placed or left out.
    served = [a.id for a, _, _ in run.served]
    assert sorted(served + [a.id for a, _ in run.gave_up] + [a.id for a in run.waiting]) == [a.id for a in draws.asks]
    assert sorted([a.id for a, _ in run.running] + [a.id for a in run.left_out]) == [a.id for a in draws.running]
    # Waits are never negative; a give-up is at once (it does not wait) or after its patience.
    assert all(start >= a.at for a, start, _ in run.served)
    assert all(when in (a.at, a.at + a.patience) for a, when in run.gave_up)
    assert any(start > a.at for a, start, _ in run.served) and any(when > a.at for a, when in run.gave_up)

    # No device is booked above 1000 thousandths, nor a node's CPU above what it has, at any start.
    held = [(0.0, a.duration, got) for a, got in run.running] + [(s, s + a.duration, got) for a, s, got in run.served]
    cpus = {n.name: n.cpu_milli for n in nodes}
    for t in sorted({s for s, _, _ in held}):
        booked: dict[str, int] = {}
        cpu: dict[str, int] = {}
        for s, e, got in held:
            if s <= t < e:
                for gpu, milli in got.booking().items():
                    booked[gpu.uuid] = booked.get(gpu.uuid, 0) + milli
                cpu[got.host] = cpu.get(got.host, 0) + got.cpu_milli
        assert max(booked.values(), default=0) <= 1000
        assert all(used <= cpus[host] for host, used in cpu.items())

    # Strict: nobody starts while one that came before it for one of its models still waits;
    # one that waits for other models only does not hold it up. Backfill: one that starts
    # while an earlier one of its models still waits is placed around the hosts kept for
    # those ahead (never on one of them), and that happens.
    order = {a.id: i for i, (a, _, _) in enumerate(run.served)}
    gave_up = {a.id: when for a, when in run.gave_up}
    waiting = {a.id for a in run.waiting}
    passed = backfilled = 0
    for r, start, got in run.served:
        for w in draws.asks:
            if w.at < r.at and (
                order.get(w.id, -1) > order[r.id] or gave_up.get(w.id, -1.0) > start or w.id in waiting
            ):
                if policy == "strict":
                    assert not lines_of(w.task) & lines_of(r.task), (w, r)
                    passed += start > r.at and bool(lines_of(r.task))
                elif lines_of(w.task) & lines_of(r.task):
                    assert run.kept_from[r.id] and got.host not in run.kept_from[r.id], (w, r)
                    backfilled += 1
    assert passed if policy == "strict" else backfilled  # went ahead of an earlier waiter, as the rule allows
    waited = {a.id for a, start, _ in run.served if start > a.at} | set(gave_up) | waiting
    assert run.refused and run.refused <= waited  # a refused request waits (or gives up at once)

    # GPU-hours: none served beyond what was asked; the use is a share of the cluster.
    for a, start, _ in run.served:
        assert bench.in_span(a, start, draws.span) <= bench.in_span(a, a.at, draws.span)
    figures = bench.figures([(draws, run)], capacity)
    assert 0 < figures["served_gpu_h_pct"] <= 100 and 0 < figures["gpu_use_pct"] <= 100
    assert figures["gave_up"] == len(run.gave_up) and figures["wait_min_p95"] >= figures["wait_min_p50"] >= 0


def test_with_departures_the_command_reports_every_policy(life, capsys):
    argv = ["--trace", str(life), "--list", "life", "--departures", "--seeds", "2", "--span", "5", "--json"]
    assert bench.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["gpus"], result["durations"], result["load"], result["patience_min"]) == (7, 8, 0.9, 30)
    assert set(result["policies"]) == {"strict", "default", "frag"}
    for r in result["policies"].values():
        assert r["served"] + r["gave_up"] + r["still_waiting"] == pytest.approx(result["requests"], abs=0.5)
        assert r["decision_us_p99"] >= r["decision_us_p50"] > 0
        assert r["decisions"] >= 2 * r["served"]  # one at least for each served, on each of 2 seeds
    assert bench.main(["--trace", str(life), "--list", "timeless", "--departures"]) == 2
    assert "no scheduled and deletion times" in capsys.readouterr().err


def test_the_shares_arrived_by_100_percent_packed_offline_by_size_leave_what_best_fit_leaves():
    """Two 0.7s, a 0.3 and a 0.2 with a whole GPU, on 3 GPUs: largest first, each on the
    device with least room that takes it: 0.3 beside a 0.7, 0.2 beside the other: 0.1 of
    3 GPUs unused. The share arriving past 100 % is not counted."""
    share = lambda milli: bench.Task(1000, 1024, 1, milli, ())  # noqa: E731
    order = [share(200), share(700), bench.Task(1000, 1024, 1, 1000, ()), share(300), share(700), share(900)]
    assert bench.shares_packed_offline(order, 3000) == pytest.approx(100 * 100 / 3000)
    assert bench.shares_packed_offline(order[1:2], 3000) == pytest.approx(100 * 300 / 3000)


# -- the mix frag places by (--mix) -------------------------------------------------


def test_the_learned_mix_is_learned_online_from_what_was_placed_as_the_ledger_records_it(life):
    """As the servers placed double, and every ``every`` requests, the allocator's mix becomes
    Mix.learned of the servers placed so far, each with its CPU, memory and accepted models;
    from no mix; servers without GPUs and requests that fit nowhere are not recorded (the
    hub's ledger has neither)."""
    from gpuspawner.allocator.fragment import Placed

    nodes = bench.read_nodes(life)
    alloc = bench.build(nodes, "frag")
    assert alloc.mix is None
    learning, learned = bench.Learning(alloc, every=100), []
    asks = [
        bench.Task(2000, 4096, 1, 1000, ("T4", "G2")),
        bench.Task(1000, 2048, 0, 0, ()),  # no GPU: not in the ledger
        bench.Task(1000, 2048, 1, 250, ()),
        bench.Task(64000, 1024, 1, 1000, ()),  # fits nowhere
    ]
    for i, task in enumerate(asks):
        try:
            got = alloc.allocate(f"t{i}", task.request())
        except bench.AllocationRefused:
            got = None
        learning.asked_for(got)
        learned.append(learning.learned)
    assert learned == [1, 1, 2, 2]  # at the first server placed, then as they doubled
    held = [alloc.holding("t0"), alloc.holding("t2")]
    assert learning.placed == [Placed(a.model, a.milli, a.cpu_milli, a.memory_mib, a.accepts) for a in held]
    assert [(p.cpu_milli, p.memory_mib, p.accepts) for p in learning.placed] == [
        (2000, 4096, ("G2", "T4")),
        (1000, 2048, ()),
    ]
    assert learning.learned == 2 and alloc.mix is not None
    assert alloc.mix.shapes == bench.Mix.learned(learning.placed).shapes
    assert {(s.count, s.milli, s.cpu_milli, s.models) for s in alloc.mix.shapes} == {
        (1, 1000, 2000, None),  # any model (Mix.learned)
        (1, 250, 1000, None),
    }
    with pytest.raises(ValueError, match="every N requests, N ≥ 1"):
        bench.Learning(alloc, every=0)


def test_the_mix_is_learned_again_sooner_while_few_servers_were_placed_as_the_hub_does():
    """bench_trace.doubled: due once as many were placed since the last learning as it was
    learned from (the hub's _learn_mix: test_fragment.py); every 2 requests otherwise."""
    assert [bench.doubled(n, 0) for n in (0, 1)] == [False, True]
    assert [bench.doubled(n, 4) for n in (4, 7, 8, 9)] == [False, False, True, True]
    alloc = bench.build([bench.Node("n", 100_000, 1 << 20, 8, "G2")], "frag")
    learning = bench.Learning(alloc, every=3)
    for i in range(8):
        learning.asked_for(alloc.allocate(f"t{i}", bench.Request(count=0 if i > 1 else 1)))
    assert learning.learned == 1 + 1 + 2  # at 1 placed, at 2, then every 3 requests (nothing more placed)


def test_the_mix_is_learned_again_after_an_hours_requests_at_the_departures_rate(life):
    """learn_every: the requests of LEARN_SECONDS at the rate the departures mode asks for
    0.9 of the GPUs; a list without durations takes the default list's, else 1000."""
    from gpuspawner.hub.app import LEARN_SECONDS

    tasks, durations = bench.read_tasks(life, "life"), bench.read_durations(life, "life")
    rate = 0.9 * 7000 / (sum(t.gpu_request for t in tasks) / len(tasks) * sum(durations) / len(durations))
    assert bench.learn_every(life, "life", tasks, 7000) == round(rate * LEARN_SECONDS)
    assert bench.learn_every(life, "timeless", tasks, 7000) == 1000  # no durations, no default list
    (life / "openb_pod_list_default.csv").write_text((life / "openb_pod_list_life.csv").read_text())
    assert bench.learn_every(life, "timeless", tasks, 7000) == round(rate * LEARN_SECONDS)


def test_the_mix_option_gives_frag_the_learned_mix_the_shapes_or_none(trace, capsys):
    def figures(*extra: str) -> dict:
        argv = ["--trace", str(trace), "--list", "tiny", "--seeds", "2", "--policies", "pack,frag", "--json"]
        assert bench.main([*argv, *extra]) == 0
        return json.loads(capsys.readouterr().out)

    learned = figures()  # the default
    tasks = bench.read_tasks(trace, "tiny")
    assert learned["mix"] == "learned" and learned["learn_every"] == bench.learn_every(trace, "tiny", tasks, 3000)
    assert learned["policies"]["frag"]["learned"] > 0  # fewer requests than an hour's, but the servers doubled
    often = figures("--mix", "learned", "--learn-every", "1")
    assert often["learn_every"] == 1 and often["policies"]["frag"]["learned"] > learned["policies"]["frag"]["learned"]
    assert often["policies"]["frag"]["learned_shapes"] >= 1
    none, shapes = figures("--mix", "none"), figures("--mix", "shapes")
    assert (none["mix"], shapes["mix"]) == ("none", "shapes") and "learn_every" not in none
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("decision_us")}  # noqa: E731
    assert strip(none["policies"]["frag"]) == strip(none["policies"]["pack"])  # no mix: frag is pack
    assert bench.main(["--trace", str(trace), "--list", "tiny", "--seeds", "1", "--mix", "none"]) == 0
    assert capsys.readouterr().out.startswith("frag's mix: none (--mix none)")
    with pytest.raises(ValueError, match="unknown mix 'all'"):
        bench.replay(bench.read_nodes(trace), bench.read_tasks(trace, "tiny"), "frag", 0, [], "all")
    assert bench.main(["--trace", str(trace), "--list", "tiny", "--learn-every", "0"]) == 2
    assert "--learn-every must be 1 or more" in capsys.readouterr().err


def test_with_departures_frag_learns_its_mix_from_what_runs_and_again_each_hour(life, monkeypatch):
    """--mix learned (the default): learned once those running at the start are placed,
    then every LEARN_SECONDS of the span, from every server placed so far."""
    from gpuspawner.hub import app

    nodes, tasks = bench.read_nodes(life), bench.read_tasks(life, "life")
    draws = bench.draw(tasks, bench.read_durations(life, "life"), 7000, seed=1, load=1.0, patience=7200, upto=20)
    mixes: list = []
    real = bench.Allocator.set_mix
    monkeypatch.setattr(bench.Allocator, "set_mix", lambda self, mix: (mixes.append(mix), real(self, mix)))
    monkeypatch.setattr(app, "LEARN_SECONDS", draws.span / 4)
    run = bench.live(nodes, draws, "frag", bench.typical(tasks), "learned")
    assert len(mixes) >= 4 and all(m is not None for m in mixes)
    placed = [g for _, g in run.running if g.devices]
    learned = bench.Mix.learned(bench.Placed(g.model, g.milli, g.cpu_milli, g.memory_mib, g.accepts) for g in placed)
    assert mixes[0].shapes == learned.shapes  # from those running at the start
    assert mixes[-1].shapes != mixes[0].shapes  # the servers placed since count too
    mixes.clear()
    bench.live(nodes, draws, "frag", bench.typical(tasks), "none")
    assert mixes == []  # frag without a mix: as pack
    with pytest.raises(ValueError, match="unknown mix"):
        bench.live(nodes, draws, "frag", [], "guessed")


def test_the_variants_made_for_tuning_pin_share_or_widen_the_default_lists_gpu_requests(life, capsys):
    from benchmarks import trace_variants

    nodes, tasks = bench.read_nodes(life), bench.read_tasks(life, "life")
    pinned = trace_variants.variant(nodes, tasks, "pin100")
    assert all(len(t.spec) == 1 and t.spec[0] in {"T4", "G2"} for t in pinned if t.num_gpu)
    assert [t for t in pinned if not t.num_gpu] == [t for t in tasks if not t.num_gpu]
    assert trace_variants.variant(nodes, tasks, "pin0") == tasks
    shares = [t for t in tasks if t.num_gpu == 1 and t.gpu_milli < 1000]
    shared = trace_variants.variant(nodes, tasks, "share100")
    assert all(t in shares for t, old in zip(shared, tasks) if old.num_gpu == 1 and old.gpu_milli == 1000)
    wide = trace_variants.variant(nodes, tasks, "multi100")
    for t, old in zip(wide, tasks):
        if old.num_gpu == 1 and old.gpu_milli == 1000:
            assert t.num_gpu in (2, 4, 8) and t.cpu_milli == old.cpu_milli * t.num_gpu and t.spec == old.spec
        else:
            assert t == old
    assert trace_variants.variant(nodes, tasks, "pin50") == trace_variants.variant(nodes, tasks, "pin50")  # seeded
    with pytest.raises(ValueError, match="unknown variant 'pin101'"):
        trace_variants.variant(nodes, tasks, "pin101")
    (life / "openb_pod_list_default.csv").write_text((life / "openb_pod_list_life.csv").read_text())
    assert trace_variants.main(["--trace", str(life), "--variant", "pin50", "--seeds", "1-2"]) == 0
    out = capsys.readouterr().out
    assert "OpenB variant pin50 of the default list" in out and "gpuspawner frag" in out and "gpuspawner pack" in out
    assert trace_variants.main(["--trace", str(life), "--variant", "half"]) == 2
