"""The churn of :mod:`benchmarks.bench_shares`, this tree against another
commit, alternating in one process (so both see the same machine):

    python -m benchmarks.bench_shares_ab --against main            # 3 rounds
    python -m benchmarks.bench_shares_ab --against main --uneven --split-small
    python -m benchmarks.bench_shares_ab --against main --rounds 5 --ops 20000 --json
    python -m benchmarks.bench_shares_ab --against main --clock cpu   # on a busy machine

Each round runs every figure once for each allocator, the order swapped
every round: share churn at 1,000 nodes (both mixes, pack and spread), the
same churn of whole-GPU requests (1 or 2 GPUs), and one node of 8 (shares of
each mix, whole GPUs). The table gives each figure's range over the rounds
and the median of the per-round ratios (this tree over the other), and
"least times": decisions over the sum of each decision's least time over
the rounds (the seed makes the same decisions every round), the cost with
most of what other work on the machine adds left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from benchmarks import bench_shares
from benchmarks.bench_shares import churn
from benchmarks.impl import THIS, Impl, load

CASES = [
    *(
        (f"{n} nodes, {mix}, {pol}", n, mix, pol, False)
        for n in (1000,)
        for mix in ("uniform", "70/30")
        for pol in ("pack", "spread")
    ),
    *((f"1000 nodes, whole GPUs, {pol}", 1000, "uniform", pol, True) for pol in ("pack", "spread")),
    ("one node, uniform", 1, "uniform", "pack", False),
    ("one node, 70/30", 1, "70/30", "pack", False),
    ("one node, whole GPUs", 1, "uniform", "pack", True),
]


def one_round(impl: Impl, ops: int, seed: int, least: dict[str, list[int]]) -> dict[str, dict[str, float]]:
    """Every case once; ``least``: per case, each decision's least time over the rounds so far."""
    out = {}
    for name, nodes, mix, policy, whole in CASES:
        times: list[int] = []
        c = churn(nodes, mix, policy, ops, seed, whole=whole, impl=impl, times_out=times)
        out[name] = {"per_s": c.decisions.per_s, "p99_us": c.decisions.p99_us, "split_p99_us": c.splits.p99_us}
        least[name] = list(map(min, least[name], times)) if name in least else times
    return out


def compare(other: Impl, rounds: int, ops: int, seed: int) -> dict[str, list]:
    """Both allocators, alternating; ``least_per_s``: decisions over the sum of
    each decision's least time over the rounds (the same seed makes the same
    decisions every round), which leaves out most of what a busy machine adds."""
    runs: dict[str, list] = {"before": [], "after": []}
    least: dict[str, dict[str, list[int]]] = {"before": {}, "after": {}}
    for r in range(rounds):
        order = [("before", other), ("after", THIS)]
        for key, impl in order if r % 2 == 0 else order[::-1]:
            runs[key].append(one_round(impl, ops, seed, least[key]))
    runs["least_per_s"] = [{k: len(t) / sum(t) * 1e9 for k, t in least[key].items()} for key in ("before", "after")]
    return runs


def table(runs: dict[str, list], other: str) -> str:
    def span(values: list[float], fmt: str) -> str:
        lo, hi = min(values), max(values)
        return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}–{hi:{fmt}}"

    lines = [
        f"| case | decisions/s, {other} | this tree | ratio (median) | least times: {other} → this (ratio) "
        f"| p99, {other} → this | splits p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    least_before, least_after = runs["least_per_s"]
    for name, *_ in CASES:
        before = [r[name] for r in runs["before"]]
        after = [r[name] for r in runs["after"]]
        ratio = statistics.median(a["per_s"] / b["per_s"] for a, b in zip(after, before))
        split = ""
        if after[0]["split_p99_us"]:
            split = f"{span([b['split_p99_us'] for b in before], '.0f')} → {span([a['split_p99_us'] for a in after], '.0f')} µs"
        lb, la = least_before[name], least_after[name]
        lines.append(
            f"| {name} | {span([b['per_s'] for b in before], ',.0f')} | {span([a['per_s'] for a in after], ',.0f')} "
            f"| {ratio:.2f} | {lb:,.0f} → {la:,.0f} ({la / lb:.2f}) "
            f"| {span([b['p99_us'] for b in before], '.0f')} → {span([a['p99_us'] for a in after], '.0f')} µs "
            f"| {split} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", default="main", help="the commit to compare with (default: main)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ops", type=int, default=50_000, help="decisions per churn run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--uneven", action="store_true", help="allow uneven splits where no even split fits")
    p.add_argument("--split-small", action="store_true", help="let shares of at most 1 GPU be split too")
    bench_shares.add_clock(p)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    bench_shares.set_clock(args.clock)
    model = bench_shares.SHARING[bench_shares.MODEL]
    for key, on in (("uneven", args.uneven), ("split_small", args.split_small)):
        if on:
            model[key] = True
        else:  # left out, not False: an older commit may not know the key
            model.pop(key, None)
    runs = compare(load(args.against), args.rounds, args.ops, args.seed)
    print(json.dumps(runs, indent=2) if args.json else table(runs, args.against))
    return 0


if __name__ == "__main__":
    sys.exit(main())
