"""Variants of the OpenB task lists, made here for tuning placement, so that the published
lists (and bench_trace's seeds 0-9 on them) stay the test:

    python -m benchmarks.trace_variants --trace ../shared/traces/openb --variant pin50 --seeds 13-15
    python -m benchmarks.trace_variants --trace ../shared/traces/openb --variant share90 --policies pack,frag

``pinNN``: the default list with NN % of its GPU requests accepting one model only, drawn
with each model's share of the cluster's GPUs as its weight (the trace does not say which
model a task ran on). ``shareNN``: NN % of its whole 1-GPU requests become one of its
shares, drawn from the list. ``multiNN``: NN % of its whole 1-GPU requests ask for 2, 4 or
8 GPUs, with CPU and memory to match. Each draw is seeded by the variant's name. Printed:
the unallocated GPU % at 100 % arrived per policy (means over the seeds), frag with the mix
it learns by itself (bench_trace ``--mix learned``).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
from pathlib import Path

from benchmarks import bench_trace as bench

VARIANT = re.compile(r"(pin|share|multi)(\d{1,3})")


def variant(nodes: list[bench.Node], tasks: list[bench.Task], name: str) -> list[bench.Task]:
    """``tasks`` (the default list's) made into the variant ``name``; raises ValueError."""
    found = VARIANT.fullmatch(name)
    if found is None or int(found[2]) > 100:
        raise ValueError(f"unknown variant {name!r}: pinNN, shareNN or multiNN, NN a % from 0 to 100")
    kind, fraction = found[1], int(found[2]) / 100
    rng = random.Random(f"{kind} {name}")
    if kind == "pin":
        models = [n.model for n in nodes for _ in range(n.gpus)]
        return [
            bench.Task(t.cpu_milli, t.memory_mib, t.num_gpu, t.gpu_milli, (rng.choice(models),))
            if t.num_gpu and rng.random() < fraction
            else t
            for t in tasks
        ]
    whole = [i for i, t in enumerate(tasks) if t.num_gpu == 1 and t.gpu_milli == bench.UNIT]
    out = list(tasks)
    if kind == "share":
        shares = [t for t in tasks if t.num_gpu == 1 and t.gpu_milli < bench.UNIT]
        for i in whole:
            if rng.random() < fraction:
                out[i] = rng.choice(shares)
        return out
    for i in whole:
        if rng.random() < fraction:
            k, t = rng.choice((2, 4, 8)), tasks[i]
            out[i] = bench.Task(t.cpu_milli * k, t.memory_mib * k, k, bench.UNIT, t.spec)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, required=True, help="the OpenB folder (its CSV files)")
    p.add_argument("--variant", required=True, help="pinNN, shareNN or multiNN (see the doc)")
    p.add_argument("--seeds", default="10-12", help="a range of seeds, FIRST-LAST (default 10-12)")
    p.add_argument("--policies", default="pack,frag", help="comma-separated (default pack,frag)")
    args = p.parse_args(argv)
    first, _, last = args.seeds.partition("-")
    nodes, tasks = bench.read_nodes(args.trace), bench.read_tasks(args.trace, "default")
    try:
        made = variant(nodes, tasks, args.variant)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    capacity = bench.UNIT * sum(n.gpus for n in nodes)
    shapes = bench.typical(made)
    every = bench.learn_every(args.trace, "default", made, capacity)
    seeds = range(int(first), int(last or first) + 1)
    pinned = sum(1 for t in made if t.num_gpu and t.spec) / max(1, sum(1 for t in made if t.num_gpu))
    print(
        f"OpenB variant {args.variant} of the default list ({pinned:.0%} of its GPU requests take one model), "
        f"seeds {seeds.start}-{seeds.stop - 1}; frag's mix learned every {every} requests"
    )
    for policy in args.policies.split(","):
        runs = [bench.replay(nodes, made, policy, seed, shapes, "learned", every) for seed in seeds]
        at_100 = [r["unallocated"][bench.ARRIVED.index(100)] for r in runs]
        print(
            f"gpuspawner {policy:8} unallocated at 100 % arrived: {statistics.mean(at_100):.2f} "
            f"({', '.join(f'{u:.2f}' for u in at_100)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
