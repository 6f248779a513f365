"""Ledger benchmark: what a spawn and a stop cost, and usage reports over a long history.

    python -m benchmarks.bench_ledger                        # SQLite file in a temporary folder
    python -m benchmarks.bench_ledger --url postgresql+psycopg://user:pw@127.0.0.1/db  # an EMPTY database
    python -m benchmarks.bench_ledger --history 100000 --json

* open + close: ``--ops`` allocations (1 to 4 devices, some shared) opened and closed one
  after another through the Ledger, each call timed alone (a spawn and a stop each make one);
* usage / history: ``--history`` past allocations over one year, written in bulk, then
  ``usage()`` by user and by model over the whole year and over its last month, and
  ``history(device=...)`` for one device.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone

from gpuspawner.ledger.ledger import Ledger
from gpuspawner.ledger.schema import allocation_devices, allocations

MODELS = ["NVIDIA GeForce GTX 1070", "NVIDIA A100 80GB PCIe", "NVIDIA Tesla T4", "NVIDIA H100 80GB HBM3"]


def _devices(rng: random.Random) -> tuple[list[str], list[int]]:
    count = rng.choice([1, 1, 1, 2, 4])
    devices = [f"GPU-{rng.randrange(8000):05d}" for _ in range(count)]
    devices = list(dict.fromkeys(devices))
    milli = [rng.choice([1000, 1000, 500, 250]) if len(devices) == 1 else 1000 for _ in devices]
    return devices, milli


def _ms(samples: list[float]) -> dict:
    samples = sorted(samples)
    return {
        "p50_ms": round(statistics.median(samples) * 1000, 2),
        "p99_ms": round(samples[int(len(samples) * 0.99) - 1] * 1000, 2),
    }


def bench_open_close(ledger: Ledger, ops: int, rng: random.Random) -> dict:
    ledger.open_allocations()  # schema in place before timing
    opens, closes = [], []
    for i in range(ops):
        devices, milli = _devices(rng)
        t = time.perf_counter()
        ledger.open(f"bench-open-{i}", f"user{rng.randrange(500)}", "", "gpu-a", rng.choice(MODELS), devices, milli)
        opens.append(time.perf_counter() - t)
        t = time.perf_counter()
        ledger.close(f"bench-open-{i}")
        closes.append(time.perf_counter() - t)
    return {"open": _ms(opens), "close": _ms(closes)}


def fill_history(ledger: Ledger, count: int, rng: random.Random, end: datetime) -> None:
    start = end - timedelta(days=365)
    rows, device_rows = [], []
    for i in range(count):
        begun = start + timedelta(seconds=rng.uniform(0, 365 * 86400))
        devices, milli = _devices(rng)
        rows.append(
            dict(
                id=1_000_000 + i,
                service=f"bench-{i}",
                username=f"user{rng.randrange(500)}",
                server="",
                host=f"node{rng.randrange(100)}",
                model=rng.choice(MODELS),
                started_at=begun,
                ended_at=min(end, begun + timedelta(hours=rng.expovariate(1 / 6))),
                end_reason="stopped",
            )
        )
        device_rows += [
            dict(allocation_id=1_000_000 + i, position=p, uuid=u, milli=m)
            for p, (u, m) in enumerate(zip(devices, milli))
        ]
    with ledger.engine.begin() as conn:
        conn.execute(allocations.insert(), rows)
        conn.execute(allocation_devices.insert(), device_rows)


def bench_reports(ledger: Ledger, count: int, rng: random.Random) -> dict:
    end = datetime.now(timezone.utc)
    t = time.perf_counter()
    fill_history(ledger, count, rng, end)
    result = {"history_rows": count, "fill_s": round(time.perf_counter() - t, 2)}
    for name, call in [
        ("usage_by_user_year_s", lambda: ledger.usage(end - timedelta(days=365), end)),
        ("usage_by_model_year_s", lambda: ledger.usage(end - timedelta(days=365), end, by="model")),
        ("usage_by_user_month_s", lambda: ledger.usage(end - timedelta(days=30), end)),
        ("history_of_one_device_s", lambda: ledger.history(device="GPU-00042")),
    ]:
        t = time.perf_counter()
        call()
        result[name] = round(time.perf_counter() - t, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_ledger", description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="an empty database (default: a new SQLite file)")
    ap.add_argument("--ops", type=int, default=500, help="timed open + close pairs")
    ap.add_argument("--history", type=int, default=50_000, help="past allocations for the usage reports")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(args.url or f"sqlite:///{tmp}/gpuspawner.sqlite")
        rng = random.Random(args.seed)
        result = {
            "python": platform.python_version(),
            "database": ledger.engine.dialect.name,
            "open_close": bench_open_close(ledger, args.ops, rng),
            "reports": bench_reports(ledger, args.history, rng),
        }
        ledger.dispose()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        oc, rep = result["open_close"], result["reports"]
        print(f"ledger on {result['database']} (Python {result['python']})")
        print(f"open:  p50 {oc['open']['p50_ms']} ms, p99 {oc['open']['p99_ms']} ms ({args.ops} calls)")
        print(f"close: p50 {oc['close']['p50_ms']} ms, p99 {oc['close']['p99_ms']} ms")
        print(f"{rep['history_rows']} past allocations written in {rep['fill_s']} s")
        for key, value in rep.items():
            if key.endswith("_s") and key != "fill_s":
                print(f"  {key[:-2].replace('_', ' ')}: {value} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
