"""Allocator benchmark: a realistic mix of decisions on a large inventory.

    python -m benchmarks.bench_allocator                  # 1000 nodes × 8 GPUs, 200k ops, pack and spread
    python -m benchmarks.bench_allocator --json           # the same figures as JSON
    python -m benchmarks.bench_allocator --profile pack   # where the time goes (cProfile, top functions)
    python -m benchmarks.bench_allocator --shares 0.5     # half of the requests ask for a share of a GPU

The mix (after an untimed warm-up to 60 % of the devices in use):

* ~55 % allocate, ~45 % release of a random current holder; the allocate share
  leans up or down to follow a utilisation target that swings between 60 % and
  90 % over the run, so hosts fragment and refill;
* allocation sizes 1 / 2 / 4 / 8 GPUs weighted toward 1, ~1 % ``count="all"``;
* ~12 % any-model requests, ~3 % pinned to a random host (and, 9 times in 10,
  asking for the model that host has); owners drawn from a
  user population, with ``max_per_owner`` passed on every request as the
  spawner does (``--max-per-owner 0`` for none);
* refusals happen naturally: a model runs out, large requests find no host with
  enough free, pinned hosts are busy.

Each decision is timed alone with ``time.perf_counter_ns``. Throughput is the
number of decisions over the sum of their times (the allocator's own cost), and
the wall-clock rate of the whole loop is given too. Memory is what
``tracemalloc`` sees allocated while building the allocator from a ready list
of GPU records (the records themselves are counted apart).

``--shares F`` turns sharing on (every model: quantum 0.05, splitting
allowed) and makes a fraction F of the allocations share requests: mostly
0.1-0.5 of a GPU, some 0.75 or 1, a few 1.2-2.5 split over devices of one
host. Utilisation then counts shares (0.25 in use is a quarter device).

``--extras`` (on by default) also times the calls the spawner makes around a
decision: ``summary()`` (every form render and start), ``set_available_hosts``
with the same hosts (every start) and with one node drained, rebuilding all
holdings with ``adopt`` as after a hub restart, and what the allocation map
asks of every device (``booked_on()``).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import math
import platform
import pstats
import random
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass, field

from gpuspawner.allocator.allocator import ALL, AllocationRefused, Allocator, Request
from gpuspawner.core.inventory import GPU

# (model, memory MiB, share of nodes)
MODELS = [
    ("NVIDIA GeForce GTX 1070", 8192, 0.35),
    ("NVIDIA A100 80GB PCIe", 81920, 0.30),
    ("NVIDIA Tesla T4", 15360, 0.25),
    ("NVIDIA H100 80GB HBM3", 81920, 0.10),
]
SIZES = [(1, 0.62), (2, 0.20), (4, 0.11), (8, 0.06), (ALL, 0.01)]
SHARE_SIZES = [  # (thousandths of a GPU, weight)
    (100, 0.2),
    (250, 0.25),
    (300, 0.1),
    (500, 0.25),
    (750, 0.06),
    (1000, 0.04),
    (1200, 0.05),
    (1500, 0.03),
    (2500, 0.02),
]
SHARING = {"*": {"quantum": 0.05, "split": True}}
ANY_MODEL = 0.12
PINNED = 0.03

pc = time.perf_counter_ns


def build_inventory(nodes: int, gpus_per_node: int, seed: int) -> list[GPU]:
    """``nodes`` hosts of ``gpus_per_node`` devices; one model per host."""
    rng = random.Random(seed)
    names = [m for m, _, _ in MODELS]
    weights = [w for _, _, w in MODELS]
    memory = {m: mib for m, mib, _ in MODELS}
    gpus = []
    for n in range(nodes):
        host = f"gpu-{n:04d}"
        model = rng.choices(names, weights)[0]
        for i in range(gpus_per_node):
            uuid = f"GPU-{rng.getrandbits(32):08x}-{n:04x}-4{i:03x}-8000-{rng.getrandbits(48):012x}"
            gpus.append(GPU(host, i, uuid, model, memory[model]))
    return gpus


def percentile(sorted_ns: list[int], q: float) -> float:
    if not sorted_ns:
        return float("nan")
    return sorted_ns[min(len(sorted_ns) - 1, max(0, math.ceil(q * len(sorted_ns)) - 1))]


@dataclass
class Stats:
    count: int = 0
    per_s: float = 0.0
    p50_us: float = 0.0
    p99_us: float = 0.0
    p999_us: float = 0.0
    max_us: float = 0.0
    mean_us: float = 0.0

    @classmethod
    def of(cls, ns: list[int]) -> Stats:
        if not ns:
            return cls()
        s = sorted(ns)
        total = sum(s)
        return cls(
            count=len(s),
            per_s=len(s) / (total / 1e9) if total else float("inf"),
            p50_us=percentile(s, 0.50) / 1e3,
            p99_us=percentile(s, 0.99) / 1e3,
            p999_us=percentile(s, 0.999) / 1e3,
            max_us=s[-1] / 1e3,
            mean_us=total / len(s) / 1e3,
        )


@dataclass
class Result:
    policy: str
    nodes: int
    gpus: int
    ops: int
    seed: int
    max_per_owner: int | None
    share_mix: float = 0.0
    build_bytes: int = 0
    build_peak_bytes: int = 0
    inventory_bytes: int = 0
    build_ms: float = 0.0
    wall_s: float = 0.0
    wall_per_s: float = 0.0
    decisions: Stats = field(default_factory=Stats)
    by_kind: dict[str, Stats] = field(default_factory=dict)
    granted: int = 0
    refused: int = 0
    refused_retry: int = 0
    refusal_reasons: dict[str, int] = field(default_factory=dict)
    released: int = 0
    utilisation_min: float = 0.0
    utilisation_mean: float = 0.0
    utilisation_max: float = 0.0
    extras: dict[str, dict] = field(default_factory=dict)


def measure_build(gpus: list[GPU], policy: str) -> tuple[Allocator, int, int, float]:
    gc.collect()
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    alloc = Allocator(gpus, policy)
    after, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t0 = pc()
    Allocator(gpus, policy)  # timed without tracemalloc's overhead
    return alloc, after - before, peak - before, (pc() - t0) / 1e6


def measure_inventory_bytes(nodes: int, gpus_per_node: int, seed: int) -> int:
    gc.collect()
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    gpus = build_inventory(nodes, gpus_per_node, seed)
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del gpus
    return after - before


class Workload:
    """Generates the requests; keeps the bookkeeping out of the timed calls."""

    def __init__(self, gpus: list[GPU], seed: int, users: int, share_mix: float = 0.0):
        self.rng = random.Random(seed ^ 0x5EED)
        self.share_mix = share_mix
        self.models = sorted({g.model for g in gpus})
        model_weight = {m: w for m, _, w in MODELS}
        self.model_weights = [model_weight.get(m, 1.0) for m in self.models]
        self.hosts = sorted({g.host for g in gpus})
        self.host_model = {g.host: g.model for g in gpus}
        self.users = [f"user{u:05d}" for u in range(users)]
        self.sizes = [s for s, _ in SIZES]
        self.size_weights = [w for _, w in SIZES]
        self.serial = 0

    def request(self) -> tuple[str, Request]:
        rng = self.rng
        self.serial += 1
        model = None if rng.random() < ANY_MODEL else rng.choices(self.models, self.model_weights)[0]
        count = rng.choices(self.sizes, self.size_weights)[0]
        host = rng.choice(self.hosts) if rng.random() < PINNED else None
        if host is not None and model is not None and rng.random() < 0.9:
            model = self.host_model[host]  # mostly a user who knows what the host has
        # Some users far busier than others: owners drawn with a power-law skew
        # (the busiest of 5000 gets ~0.3 % of requests; the form keeps users
        # within their limit, so limit refusals stay a small share).
        owner = self.users[int(len(self.users) * rng.random() ** 1.5)]
        share = None
        if self.share_mix and rng.random() < self.share_mix:  # no draw at all without shares
            share = rng.choices([s for s, _ in SHARE_SIZES], [w for _, w in SHARE_SIZES])[0]
        return f"{owner}/srv{self.serial}", Request(model=model, count=count, host=host, owner=owner, milli=share)


REASONS = [
    ("per-user limit", ("per user", "your limit still allows")),
    ("pinned host lacks it", ("of that model",)),
    ("model none free", ("is free right now",)),
    ("no single host has room", ("free on any single host",)),
    ("never fits one host", ("no host has more than",)),
    ("no whole host free (ALL)", ("every host has some in use",)),
    ("pinned host busy", ("free there",)),
    ("pinned host unavailable", ("is not available right now",)),
    ("share: no room on a device or host", ("not that much is free",)),
    ("share: less free in all", ("is free in all right now",)),
    ("share: no even split", ("no even split fits",)),
]


def refusal_reason(message: str) -> str:
    for name, needles in REASONS:
        if any(n in message for n in needles):
            return name
    return "other"


def run_mix(
    alloc: Allocator, gpus: list[GPU], ops: int, seed: int, max_per_owner: int | None, users: int, result: Result
) -> None:
    total = len(gpus)
    work = Workload(gpus, seed, users, result.share_mix)
    rng = random.Random(seed)
    holders: list[str] = []
    in_use = 0

    def do_allocate(timed: bool) -> tuple[int, str]:
        nonlocal in_use
        holder, req = work.request()
        t0 = pc()
        try:
            a = alloc.allocate(holder, req, max_per_owner=max_per_owner)
        except AllocationRefused as exc:
            t1 = pc()
            result.refused += timed
            result.refused_retry += timed and exc.retry
            if timed:
                why = refusal_reason(exc.message)
                result.refusal_reasons[why] = result.refusal_reasons.get(why, 0) + 1
            outcome = "refused"
        else:
            t1 = pc()
            holders.append(holder)
            in_use += a.total_milli / 1000
            result.granted += timed
            outcome = "granted"
        if req.milli is not None:
            kind = "allocate share" if req.milli <= 1000 else "allocate share > 1"
        elif req.count == ALL:
            kind = "allocate ALL"
        elif req.host is not None:
            kind = "allocate pinned"
        elif req.model is None:
            kind = "allocate any model"
        else:
            kind = "allocate"
        return t1 - t0, f"{kind}: {outcome}"

    def do_release() -> int:
        nonlocal in_use
        i = rng.randrange(len(holders))
        holders[i], holders[-1] = holders[-1], holders[i]
        holder = holders.pop()
        t0 = pc()
        a = alloc.release(holder)
        t1 = pc()
        in_use -= a.total_milli / 1000
        result.released += 1
        return t1 - t0

    # Untimed warm-up to 60 % in use.
    guard = 0
    while in_use < 0.6 * total and guard < 10 * total:
        do_allocate(timed=False)
        guard += 1

    latencies: list[int] = []
    by_kind: dict[str, list[int]] = {}
    util_sum, util_min, util_max = 0.0, 1.0, 0.0
    t_wall = pc()
    for n in range(ops):
        util = in_use / total
        util_sum += util
        util_min, util_max = min(util_min, util), max(util_max, util)
        # Utilisation target: one slow swing 60 % -> 90 % -> 60 % -> 90 % over the run.
        target = 0.75 - 0.15 * math.cos(4 * math.pi * n / ops)
        p_allocate = 0.65 if util < target else 0.45
        if holders and rng.random() >= p_allocate:
            ns, kind = do_release(), "release"
        else:
            ns, kind = do_allocate(timed=True)
        latencies.append(ns)
        by_kind.setdefault(kind, []).append(ns)
    wall = (pc() - t_wall) / 1e9

    result.wall_s = wall
    result.wall_per_s = ops / wall
    result.decisions = Stats.of(latencies)
    result.by_kind = {k: Stats.of(v) for k, v in sorted(by_kind.items())}
    result.utilisation_min, result.utilisation_max = util_min, util_max
    result.utilisation_mean = util_sum / max(ops, 1)


def time_calls(fn, n: int) -> dict:
    ns = []
    for _ in range(n):
        t0 = pc()
        fn()
        ns.append(pc() - t0)
    return asdict(Stats.of(ns))


def run_extras(alloc: Allocator, gpus: list[GPU], policy: str, samples: int) -> dict[str, dict]:
    hosts = alloc.hosts()
    out = {
        "summary()": time_calls(alloc.summary, samples),
        "set_available_hosts(same hosts)": time_calls(lambda: alloc.set_available_hosts(hosts), samples),
    }
    drained = [hosts[:-1], hosts]
    flip = iter(range(10**9))
    out["set_available_hosts(one node drained/back)"] = time_calls(
        lambda: alloc.set_available_hosts(drained[next(flip) % 2]), samples
    )
    alloc.set_available_hosts(None)
    holdings = list(alloc.holdings().values())
    fresh = Allocator(gpus, policy, sharing=alloc.sharing)
    t0 = pc()
    per = []
    for a in holdings:
        t1 = pc()
        fresh.adopt(a.holder, a.owner, a.host, a.uuids, a.milli)
        per.append(pc() - t1)
    total_s = (pc() - t0) / 1e9
    stats = asdict(Stats.of(per))
    stats["holdings"] = len(holdings)
    stats["total_s"] = total_s
    out["adopt() rebuild of every holding"] = stats
    uuids = [g.uuid for g in gpus]
    out["booked_on() of every device"] = time_calls(lambda: [alloc.booked_on(u) for u in uuids], max(1, samples // 20))
    return out


def bench(policy: str, args) -> Result:
    gpus = build_inventory(args.nodes, args.gpus_per_node, args.seed)
    limit = args.max_per_owner or None
    result = Result(
        policy=policy,
        nodes=args.nodes,
        gpus=len(gpus),
        ops=args.ops,
        seed=args.seed,
        max_per_owner=limit,
        share_mix=args.shares,
    )
    result.inventory_bytes = measure_inventory_bytes(args.nodes, args.gpus_per_node, args.seed)
    alloc, result.build_bytes, result.build_peak_bytes, result.build_ms = measure_build(gpus, policy)
    if args.shares:
        alloc.set_sharing(SHARING)
    run_mix(alloc, gpus, args.ops, args.seed, limit, args.users, result)
    if args.extras:
        result.extras = run_extras(alloc, gpus, policy, args.extra_samples)
    return result


def profile(policy: str, args) -> str:
    gpus = build_inventory(args.nodes, args.gpus_per_node, args.seed)
    alloc = Allocator(gpus, policy, sharing=SHARING if args.shares else None)
    result = Result(
        policy=policy,
        nodes=args.nodes,
        gpus=len(gpus),
        ops=args.ops,
        seed=args.seed,
        max_per_owner=args.max_per_owner or None,
        share_mix=args.shares,
    )
    prof = cProfile.Profile()
    prof.enable()
    run_mix(alloc, gpus, args.ops, args.seed, args.max_per_owner or None, args.users, result)
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(18)
    stats.sort_stats("cumulative").print_stats("allocator", 18)
    return buf.getvalue()


def fmt_table(results: list[Result], args) -> str:
    lines = []
    r0 = results[0]
    lines.append(
        f"Allocator benchmark: {r0.nodes} nodes, {r0.gpus} GPUs, {r0.ops} timed decisions, seed {r0.seed}, "
        f"max_per_owner={r0.max_per_owner}, {args.users} users"
        f"{f', {100 * r0.share_mix:.0f} % share requests' if r0.share_mix else ''}; Python {platform.python_version()}"
    )
    lines.append("")
    head = (
        f"{'policy':<7} {'decisions/s':>12} {'wall ops/s':>11} {'p50 µs':>8} {'p99 µs':>8} {'p99.9 µs':>9} "
        f"{'max µs':>9} {'build MiB':>10} {'build ms':>9} {'granted':>8} {'refused':>8} {'util %':>14}"
    )
    lines.append(head)
    lines.append("-" * len(head))
    for r in results:
        d = r.decisions
        lines.append(
            f"{r.policy:<7} {d.per_s:>12,.0f} {r.wall_per_s:>11,.0f} {d.p50_us:>8.1f} {d.p99_us:>8.1f} "
            f"{d.p999_us:>9.1f} {d.max_us:>9.1f} {r.build_bytes / 2**20:>10.2f} {r.build_ms:>9.1f} "
            f"{r.granted:>8} {r.refused:>8} "
            f"{100 * r.utilisation_min:>4.0f}/{100 * r.utilisation_mean:.0f}/{100 * r.utilisation_max:.0f}"
        )
    lines.append("")
    lines.append(
        "util %: min/mean/max of devices in use. build MiB: tracemalloc, allocator only; "
        f"the GPU records themselves: {r0.inventory_bytes / 2**20:.2f} MiB."
    )
    for r in results:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(r.refusal_reasons.items(), key=lambda kv: -kv[1]))
        lines.append(f"[{r.policy}] refusals ({r.refused_retry} of {r.refused} with retry): {reasons}")
    for r in results:
        lines.append("")
        lines.append(f"[{r.policy}] by kind of decision")
        sub = f"  {'kind':<34} {'count':>8} {'p50 µs':>8} {'p99 µs':>8} {'max µs':>9} {'mean µs':>8}"
        lines.append(sub)
        for kind, s in r.by_kind.items():
            lines.append(
                f"  {kind:<34} {s.count:>8} {s.p50_us:>8.1f} {s.p99_us:>8.1f} {s.max_us:>9.1f} {s.mean_us:>8.1f}"
            )
        for name, s in r.extras.items():
            extra = f"  (total {s['total_s']:.2f} s for {s['holdings']} holdings)" if "total_s" in s else ""
            lines.append(
                f"  {name:<34} {s['count']:>8} {s['p50_us']:>8.1f} {s['p99_us']:>8.1f} "
                f"{s['max_us']:>9.1f} {s['mean_us']:>8.1f}{extra}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_allocator", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--ops", type=int, default=200_000, help="timed decisions (allocate + release)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policy", choices=["pack", "spread", "both"], default="both")
    ap.add_argument("--max-per-owner", type=int, default=8, help="passed on every allocate; 0: no limit")
    ap.add_argument("--users", type=int, default=5000, help="size of the user population")
    ap.add_argument(
        "--shares",
        type=float,
        default=0.0,
        help="fraction of allocations that ask for a share of a GPU (turns sharing on)",
    )
    ap.add_argument(
        "--no-extras",
        dest="extras",
        action="store_false",
        help="skip timing summary()/set_available_hosts()/adopt rebuild",
    )
    ap.add_argument("--extra-samples", type=int, default=200)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--profile", choices=["pack", "spread"], help="cProfile the mix for one policy and print it")
    args = ap.parse_args(argv)

    if args.profile:
        print(profile(args.profile, args))
        return 0
    policies = ["pack", "spread"] if args.policy == "both" else [args.policy]
    results = [bench(p, args) for p in policies]
    if args.json:
        json.dump({"python": platform.python_version(), "results": [asdict(r) for r in results]}, sys.stdout, indent=2)
        print()
    else:
        print(fmt_table(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
