"""Multi-GPU servers on well linked GPUs: how often a server that asks for several GPUs
gets a set whose farthest pair is as well linked as the best its host had free, with
the allocator told each host's topology and without (index order), side by side on the
same requests.

The cluster: ``--nodes`` of each of the fake NVML's three multi-GPU nodes
(``devtools.fakenvml.topologies``: a DGX-1 with V100s, NVLink-bridged RTX A6000 pairs on
two sockets, H100s on NVSwitches). Requests of 1, 2, 4 and 8 GPUs of any model (the
trace's own mix of sizes is heavy on 1: ``--mix``), arriving as a Poisson process at
the rate that asks for ``--load`` of the GPUs, each holding its GPUs for an exponential
time; a request that fits nowhere is dropped. Only the allocator runs (no hub).

    python -m benchmarks.bench_topology --nodes 20 --seeds 3
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence

from devtools.fakenvml import topologies
from gpuspawner.agent.topology import Seen, nvlinks_between
from gpuspawner.allocator.allocator import AllocationRefused, Allocator, Request
from gpuspawner.core.inventory import GPU
from gpuspawner.core.topology import Link, Path, Topology

NODES = {"dgx1": topologies.dgx1, "pairs": topologies.pcie_pairs, "nvswitch": topologies.nvswitch}


def topology_of(devices: list[dict]) -> Topology:
    """What the hub would take from this node's agent: its links, as the fake NVML serves
    them (each device's ``nvlinks``: a peer's index, or "switch", per link), counted by
    the agent's own rule."""
    uuids = [d["uuid"] for d in devices]
    seen: dict[str, Seen] = {}
    for d in devices:
        ends = d.get("nvlinks", [])
        seen[d["uuid"]] = (Counter(uuids[p] for p in ends if p != "switch"), ends.count("switch"))
    links = {}
    for i, a in enumerate(devices):
        for j in range(i + 1, len(devices)):
            b = devices[j]
            links[frozenset((a["uuid"], b["uuid"]))] = Link(
                Path(a["paths"][j]), nvlinks_between(seen, a["uuid"], b["uuid"])
            )
    return Topology(links, {d["uuid"]: d["numa"] for d in devices})


def cluster(nodes: int, name: str = "{kind}-{n:03d}") -> tuple[list[GPU], dict[str, Topology]]:
    """``nodes`` nodes of each kind, named by ``name``, and how each one's GPUs are linked."""
    gpus, tops = [], {}
    for kind, make in NODES.items():
        for n in range(nodes):
            host = name.format(kind=kind, n=n)
            devices = make(f"{n:04d}{list(NODES).index(kind):04d}")
            gpus += [GPU(host, d["index"], d["uuid"], d["name"], d["memory_total_mib"]) for d in devices]
            tops[host] = topology_of(devices)
    return gpus, tops


def best_worst(topology: Topology, free: Sequence[str], n: int) -> int:
    """The best farthest-pair score of any ``n`` of ``free`` (what the host had to give)."""
    return max(
        min(topology.score(a, b) for a, b in itertools.combinations(s, 2)) for s in itertools.combinations(free, n)
    )


def run(nodes: int, seed: int, aware: bool, load: float, mix: dict[int, float], requests: int) -> dict:
    gpus, tops = cluster(nodes)
    alloc = Allocator(gpus, "pack")
    if aware:
        for host, topology in tops.items():
            alloc.set_host_topology(host, topology)
    rng = random.Random(seed)
    sizes, weights = zip(*sorted(mix.items()))
    mean_size = sum(s * w for s, w in mix.items()) / sum(weights)
    hold = 3600.0
    rate = load * len(gpus) / (mean_size * hold)
    events: list[tuple[float, int, str, str | int]] = []
    seq = itertools.count()
    t = 0.0
    for _ in range(requests):
        t += rng.expovariate(rate)
        heapq.heappush(events, (t, next(seq), "ask", rng.choices(sizes, weights)[0]))
    best = total = dropped = nvlinked = across = 0
    times: list[float] = []
    while events:
        now, _, kind, what = heapq.heappop(events)
        if kind == "end":
            alloc.release(str(what))
            continue
        n = int(what)
        name = f"s{next(seq)}"
        start = time.perf_counter()
        try:
            got = alloc.allocate(name, Request(count=n))
        except AllocationRefused:
            dropped += 1
            continue
        times.append(time.perf_counter() - start)
        heapq.heappush(events, (now + rng.expovariate(1 / hold), next(seq), "end", name))
        if n >= 2:
            topology = tops[got.host]
            held = {u for a in alloc.holdings().values() if a.host == got.host and a.holder != name for u in a.uuids}
            free_then = [g.uuid for g in gpus if g.host == got.host and g.uuid not in held]
            pairs = [topology.link(a, b) for a, b in itertools.combinations(got.uuids, 2)]
            chosen = min(link.score for link in pairs)
            total += 1
            best += chosen == best_worst(topology, free_then, n)
            nvlinked += all(link.nvlinks for link in pairs)
            across += any(link.path is Path.CROSS_CPU and not link.nvlinks for link in pairs)
    return {
        "multi": total,
        "best": best,
        "nvlinked": nvlinked,
        "across": across,
        "dropped": dropped,
        "p50_us": statistics.median(times) * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_topology", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=20, help="nodes of each of the three kinds (default 20)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--load", type=float, default=0.8, help="share of the GPUs asked for on average (default 0.8)")
    p.add_argument("--requests", type=int, default=4000, help="requests per run (default 4000)")
    p.add_argument("--mix", default="1:6,2:2,4:1,8:1", help="SIZE:WEIGHT,... (default 1:6,2:2,4:1,8:1)")
    args = p.parse_args(argv)
    mix = {int(k): float(v) for k, v in (part.split(":") for part in args.mix.split(","))}
    print(
        f"{args.nodes} nodes each of {', '.join(NODES)}; {args.requests} requests of {args.mix} GPUs at load "
        f"{args.load}, {args.seeds} seeds, pack"
    )
    print(
        "multi-GPU servers: how many; best linked: their farthest pair as good as the best set their host had "
        "free; all NVLink: every pair joined by NVLink; a pair across CPUs: some pair only across the sockets"
    )
    print(
        f"  {'placement':12} {'multi-GPU':>9} {'best linked':>12} {'all NVLink':>11} {'across CPUs':>12}"
        f" {'dropped':>8} {'p50 µs':>7}"
    )
    for aware in (False, True):
        runs = [run(args.nodes, seed, aware, args.load, mix, args.requests) for seed in range(args.seeds)]
        multi = max(1, sum(r["multi"] for r in runs))
        share = {k: 100 * sum(r[k] for r in runs) / multi for k in ("best", "nvlinked", "across")}
        print(
            f"  {'by links' if aware else 'index order':12} {multi:9} {share['best']:11.1f}% {share['nvlinked']:10.1f}%"
            f" {share['across']:11.1f}% {statistics.mean(r['dropped'] for r in runs):8.1f}"
            f" {statistics.mean(r['p50_us'] for r in runs):7.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
