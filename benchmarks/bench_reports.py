"""Hub-side cost of one agent report: validate the body, update the node.

    python -m benchmarks.bench_reports               # 1000 nodes × 8 GPUs, 20k reports
    python -m benchmarks.bench_reports --nodes 100 --json

Every node has reported once (untimed); then reports arrive from random nodes,
each a JSON body as gpuspawner-agent posts it for 8 GPUs. Timed alone with
``perf_counter_ns``: ``parse_report`` + ``GPUCluster.receive`` (what the
endpoint does after authentication). Two kinds:

* routine: nothing changed but the readings (temperature, utilisation);
* health change: one GPU of the node turns unhealthy (ECC errors) or
  recovers, so the allocator's offer changes.

HTTP and JupyterHub's token check are not included (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from gpuspawner.cluster.cluster import GPUCluster, InventorySettings
from gpuspawner.core.reports import parse_report


def body(host: int, temperature: int, sick: int | None) -> bytes:
    devices = [
        {
            "index": i,
            "uuid": f"GPU-{host:04d}-{i}",
            "name": "NVIDIA A100 80GB PCIe",
            "memory_total_mib": 81920,
            "memory_used_mib": 1024,
            "utilization_gpu": 50,
            "temperature_c": temperature,
            "lost": False,
            "ecc_uncorrected": 3 if i == sick else 0,
            "processes": [{"pid": 100 + i, "used_mib": 1000}],
            "mig_mode": False,
            "healthy": i != sick,
            "problems": [],
            "mig_devices": [],
        }
        for i in range(8)
    ]
    report = {
        "hostname": f"node{host:04d}",
        "interval": 15,
        "agent_version": "0.1.0",
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
        "device_count": 8,
        "healthy": sick is None,
        "devices": devices,
    }
    return json.dumps(report).encode()


def percentile(values: list[int], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] / 1000  # µs


def run(nodes: int, reports: int, seed: int) -> dict:
    rng = random.Random(seed)
    cluster = GPUCluster(InventorySettings(sources=("agent",)))
    for h in range(nodes):
        cluster.receive(parse_report(body(h, 40, None)), now=0.0)
    routine, change = [], []
    sick: dict[int, int | None] = {}
    for n in range(reports):
        h = rng.randrange(nodes)
        flip = rng.random() < 0.01  # one report in a hundred changes a GPU's health
        if flip:
            sick[h] = None if sick.get(h) is not None else rng.randrange(8)
        data = body(h, rng.randrange(30, 80), sick.get(h))
        t0 = time.perf_counter_ns()
        cluster.receive(parse_report(data), now=n / 1000)
        (change if flip else routine).append(time.perf_counter_ns() - t0)
    out = {"nodes": nodes, "gpus": nodes * 8, "report_bytes": len(body(0, 40, None))}
    for name, times in (("routine", routine), ("health_change", change)):
        out[name] = {
            "reports": len(times),
            "p50_us": percentile(times, 0.5),
            "p99_us": percentile(times, 0.99),
            "mean_us": statistics.fmean(times) / 1000,
        }
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--reports", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = run(args.nodes, args.reports, args.seed)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['nodes']} nodes × 8 GPUs, reports of {result['report_bytes']} bytes")
    for name in ("routine", "health_change"):
        r = result[name]
        print(
            f"  {name:14} {r['reports']:6} reports  p50 {r['p50_us']:8.1f} µs  p99 {r['p99_us']:8.1f} µs"
            f"  mean {r['mean_us']:8.1f} µs"
        )


if __name__ == "__main__":
    main()
