"""Share-heavy allocator benchmark: fractional shares at cluster scale.

    python -m benchmarks.bench_shares              # every part below, pack and spread
    python -m benchmarks.bench_shares --json       # the same figures as JSON
    python -m benchmarks.bench_shares --ops 20000 --seeds 50   # a quicker run

Sharing is open on one model, the A100 (quantum 0.01, split allowed). Two mixes
of share requests: ``uniform`` draws 0.1, 0.2 ... 1.5 (a third above one GPU);
``70/30`` draws 0.1-0.5 seven times in ten, else 0.6-1.5.

* ``churn``: 1,000 nodes × 8 A100, warmed up (untimed) to 60 % of the GPUs
  booked, then allocate and release so that booked share follows a target that
  swings between 60 % and 90 %; each allocate is one decision, timed alone.
  ``splits``: the granted requests that span several devices.
* ``fill``: the empty cluster fed requests of the mix until the first refusal.
* ``split cost``: hosts of 8 A100, every device half booked, one 1.2 request
  (allocated and released again) on 1, 100 and 1,000 such hosts; the ratio is
  the median time on 1,000 hosts over that on 1.
* ``one node``: 8 A100 on one host, the churn of each mix, against the
  whole-GPU path on the same host (1 or 2 GPUs, the same churn).
* ``packing``: one node of 8 A100 fed random requests of the mix until the
  first refusal, over many seeds: the share placed, of 8.0.

``--clock cpu`` times each decision by the thread's CPU time, which leaves out
what other processes of a busy machine take. ``--uneven`` also allows uneven splits where no even split fits;
``--split-small`` lets a share of at most one GPU be split too (by default it
stays on one device).

Throughput is decisions over the sum of their times (the allocator's own cost).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from benchmarks.bench_allocator import Stats, pc
from gpuspawner.allocator import allocator
from gpuspawner.core import inventory as core_inventory

MODEL = "NVIDIA A100 80GB PCIe"
SHARING = {MODEL: {"quantum": 0.01, "split": True}}
UNIFORM = [100 * k for k in range(1, 16)]  # thousandths: 0.1 .. 1.5 GPUs
SMALL, LARGE = UNIFORM[:5], UNIFORM[5:]


@dataclass(frozen=True)
class Impl:
    """What the churn runs on: the allocator, or a stand-in with its interface
    (benchmarks/bench_floor.py's floor)."""

    name: str
    Allocator: type
    Request: type
    Refused: type
    GPU: type

    def share(self, milli: int) -> object:
        """A request for a share of ``milli`` thousandths."""
        return self.Request(milli=milli)

    def shares(self, milli: list[int]) -> list[int]:
        """Per-device shares for ``adopt``."""
        return milli


THIS = Impl("allocator", allocator.Allocator, allocator.Request, allocator.AllocationRefused, core_inventory.GPU)

CLOCKS = {"wall": pc, "cpu": time.thread_time_ns}
clock = pc  # what times a decision: wall time, or this thread's CPU time (``--clock cpu``) on a busy machine


def draw(rng: random.Random, mix: str) -> int:
    if mix == "uniform":
        return rng.choice(UNIFORM)
    return rng.choice(SMALL) if rng.random() < 0.7 else rng.choice(LARGE)


def inventory(nodes: int, per_node: int = 8, impl: Impl = THIS) -> list:
    return [
        impl.GPU(f"gpu-{n:04d}", i, f"GPU-{n:04x}{i:04x}-0000-4000-8000-000000000000", MODEL, 81920)
        for n in range(nodes)
        for i in range(per_node)
    ]


@dataclass
class Churn:
    mix: str
    policy: str
    decisions: Stats
    splits: Stats
    granted: int
    refused: int
    utilisation: float  # mean booked share over the run, of all devices


def churn(
    nodes: int,
    mix: str,
    policy: str,
    ops: int,
    seed: int,
    whole: bool = False,
    impl: Impl = THIS,
    times_out: list[int] | None = None,
) -> Churn:
    """Allocate and release around a swinging utilisation target (see the module
    docstring); ``times_out`` gets each timed decision's time (ns), in order."""
    gpus = inventory(nodes, impl=impl)
    alloc = impl.Allocator(gpus, policy, sharing=SHARING)
    Request, AllocationRefused = impl.Request, impl.Refused  # noqa: N806
    rng = random.Random(seed)
    capacity = len(gpus) * 1000
    live: list[str] = []
    booked = 0
    times: list[int] = []
    split_times: list[int] = []
    granted = refused = serial = 0
    util_sum = 0.0

    def one(timed: bool) -> None:
        nonlocal booked, granted, refused, serial
        serial += 1
        holder = f"s{serial}"
        req = Request(count=rng.choice((1, 1, 1, 2))) if whole else impl.share(draw(rng, mix))
        t0 = clock()
        try:
            a = alloc.allocate(holder, req)
        except AllocationRefused:
            a = None
        dt = clock() - t0
        if a is not None:
            live.append(holder)
            booked += a.total_milli
        if not timed:
            return
        times.append(dt)
        if a is None:
            refused += 1
            return
        granted += 1
        if len(a.devices) > 1 and a.total_milli < len(a.devices) * 1000:  # a split
            split_times.append(dt)

    def release() -> None:
        nonlocal booked
        i = rng.randrange(len(live))
        live[i], live[-1] = live[-1], live[i]
        booked -= alloc.release(live.pop()).total_milli

    while booked < 0.6 * capacity:
        before = booked
        one(False)
        if booked == before:
            break
    for step in range(ops):
        target = 0.75 + 0.15 * ((step // 500) % 2 * 2 - 1) * min(1.0, (step % 500) / 250)
        if live and (booked > target * capacity or rng.random() < 0.3):
            release()
        one(True)
        util_sum += booked / capacity
    if times_out is not None:
        times_out.extend(times)
    return Churn(mix, policy, Stats.of(times), Stats.of(split_times), granted, refused, util_sum / max(1, ops))


def fill(nodes: int, mix: str, policy: str, seed: int, impl: Impl = THIS) -> tuple[Stats, int]:
    """The empty cluster fed requests until the first refusal: the decisions and the share placed (milli)."""
    alloc = impl.Allocator(inventory(nodes, impl=impl), policy, sharing=SHARING)
    rng = random.Random(seed)
    times: list[int] = []
    placed = 0
    while True:
        req = impl.share(draw(rng, mix))
        t0 = clock()
        try:
            a = alloc.allocate(f"s{len(times)}", req)
        except impl.Refused:
            times.append(clock() - t0)
            return Stats.of(times), placed
        times.append(clock() - t0)
        placed += a.total_milli


def split_cost(hosts: int, repeat: int, impl: Impl = THIS) -> float:
    """Median µs of a 1.2 request with every device of ``hosts`` hosts half booked."""
    alloc = impl.Allocator(inventory(hosts, impl=impl), "pack", sharing=SHARING)
    for gpu in inventory(hosts, impl=impl):
        alloc.adopt(f"half-{gpu.uuid}", "u", gpu.host, [gpu.uuid], impl.shares([500]))
    times = []
    for i in range(repeat):
        t0 = clock()
        alloc.allocate(f"big{i}", impl.share(1200))
        times.append(clock() - t0)
        alloc.release(f"big{i}")
    return statistics.median(times) / 1e3


def packing(mix: str, seeds: int, impl: Impl = THIS) -> float:
    """Mean share placed (GPUs, of 8.0) on one node of 8 until the first refusal."""
    return statistics.mean(fill(1, mix, "pack", seed, impl)[1] for seed in range(seeds)) / 1000


def most(mix: str, seed: int, capacity: int = 8000) -> int:
    """The most any allocator can place (milli) in :func:`fill` on one node
    over the seed's requests: each is placed while the free room in all
    (``capacity`` less the requests before) takes it, and the first that is
    larger than all that is free is refused whatever the devices look like."""
    rng, total = random.Random(seed), 0
    while (share := draw(rng, mix)) <= capacity - total:
        total += share
    return total


def bound(mix: str, seeds: int) -> float:
    """The mean of :func:`most` over the seeds of :func:`packing` (GPUs, of 8.0)."""
    return statistics.mean(most(mix, seed) for seed in range(seeds)) / 1000


def run(args, impl: Impl = THIS) -> dict:
    out: dict = {
        "python": platform.python_version(),
        "churn": [],
        "fill": [],
        "one_node": [],
        "packing": {},
        "bound": {},
    }
    for mix in ("uniform", "70/30"):
        for policy in ("pack", "spread"):
            out["churn"].append(asdict(churn(args.nodes, mix, policy, args.ops, args.seed, impl=impl)))
            stats, placed = fill(args.nodes, mix, policy, args.seed, impl)
            out["fill"].append({"mix": mix, "policy": policy, "decisions": asdict(stats), "placed": placed / 1000})
    costs = {h: split_cost(h, args.repeat, impl) for h in (1, 100, 1000)}
    out["split_cost_us"] = costs
    out["split_cost_ratio"] = costs[1000] / costs[1]
    whole = churn(1, "uniform", "pack", args.ops, args.seed, whole=True, impl=impl)
    for mix in ("uniform", "70/30"):
        shares = churn(1, mix, "pack", args.ops, args.seed, impl=impl)
        out["one_node"].append(
            {
                "mix": mix,
                "share_per_s": shares.decisions.per_s,
                "whole_per_s": whole.decisions.per_s,
                "ratio": shares.decisions.per_s / whole.decisions.per_s,
            }
        )
        out["packing"][mix] = packing(mix, args.seeds, impl)
        out["bound"][mix] = bound(mix, args.seeds)
    return out


def table(out: dict, args) -> str:
    us = lambda v: f"{v:.0f} µs" if v < 1000 else f"{v / 1000:.2f} ms"  # noqa: E731
    lines = [
        f"{args.nodes} nodes × 8 A100, quantum 0.01, split allowed{', uneven' if args.uneven else ''}"
        f"{', split_small' if args.split_small else ''}; "
        f"{args.ops:,} decisions per churn run; "
        f"Python {out['python']}",
        "",
        "| mix | policy | churn decisions/s | p50 | p99 | splits p50 / p99 | mean utilisation | fill decisions/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, f in zip(out["churn"], out["fill"]):
        d, s = c["decisions"], c["splits"]
        lines.append(
            f"| {c['mix']} | {c['policy']} | {d['per_s']:,.0f} | {us(d['p50_us'])} | {us(d['p99_us'])} "
            f"| {us(s['p50_us'])} / {us(s['p99_us'])} | {100 * c['utilisation']:.0f} % "
            f"| {f['decisions']['per_s']:,.0f} |"
        )
    costs = out["split_cost_us"]
    lines += [
        "",
        "split cost (1.2, every device half booked): "
        + ", ".join(f"{h} host(s) {us(v)}" for h, v in costs.items())
        + f"; ratio 1,000 / 1 = {out['split_cost_ratio']:.1f}",
        "",
        "| one node × 8, mix | share decisions/s | whole-GPU decisions/s | ratio | placed of 8.0 "
        f"({args.seeds} seeds) | the most any allocator places |",
        "|---|---|---|---|---|---|",
    ]
    for o in out["one_node"]:
        lines.append(
            f"| {o['mix']} | {o['share_per_s']:,.0f} | {o['whole_per_s']:,.0f} | {o['ratio']:.2f} "
            f"| {out['packing'][o['mix']]:.4f} | {out['bound'][o['mix']]:.4f} |"
        )
    return "\n".join(lines)


def add_clock(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--clock",
        choices=CLOCKS,
        default="wall",
        help="time each decision by the wall clock (default) or by this thread's CPU time, "
        "which leaves out the time other processes of a busy machine take",
    )


def set_clock(name: str) -> None:
    global clock
    clock = CLOCKS[name]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--ops", type=int, default=50_000, help="decisions per churn run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", type=int, default=200, help="seeds of the one-node packing test")
    p.add_argument("--repeat", type=int, default=200, help="1.2 requests per split-cost point")
    p.add_argument("--uneven", action="store_true", help="allow uneven splits where no even split fits")
    p.add_argument("--split-small", action="store_true", help="let shares of at most 1 GPU be split too")
    add_clock(p)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    set_clock(args.clock)
    if args.uneven:
        SHARING[MODEL]["uneven"] = True
    if args.split_small:
        SHARING[MODEL]["split_small"] = True
    out = run(args)
    print(json.dumps(out, indent=2) if args.json else table(out, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
