"""A week in the line for one GPU model, first come first served against fair
share: who waits how long.

    python -m benchmarks.bench_fairshare                  # 8 GPUs, a week, 5 seeds
    python -m benchmarks.bench_fairshare --gpus 16 --seeds 3 --json

A simulation (no hub, no swarm): the line's own order rules
(:func:`gpuspawner.core.line_order.ordered`) and recent use
(:func:`gpuspawner.core.fairshare.decayed_gpu_hours`) over simulated servers.
Users come in three habits: *heavy* (4 users who ask again soon after each
server ends and keep it 4–8 h), *regular* (16 users, a server or two a day of
1–3 h) and *light* (32 users, one server every two days or so, 0.5–1.5 h), in
working hours (08:00–20:00) on weekdays more than at weekends. Demand is above
what the GPUs give at the day's peak, so a line forms every day. Each server
takes one GPU; a waiter is served when a GPU frees and it is first in line.
Nobody gives up (waits are what is measured).

Printed per habit and order: servers, the median and 95th percentile wait
(minutes), and GPU-hours served; the fair-share run uses a 7-day half-life and
a 24 h longest wait, with each user's use of the week before counted as their
habit suggests.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from gpuspawner.core.fairshare import FairShare
from gpuspawner.core.line_order import Standing, Waiter, ordered

START = datetime(2026, 11, 30, tzinfo=timezone.utc)  # a Monday
WEEK = timedelta(days=7)
# habit: (users, servers a weekday, hours held (low, high), hours until asking again after one ends)
HABITS = {
    "heavy": (4, 3.0, (4.0, 8.0), 0.5),
    "regular": (16, 1.5, (1.0, 3.0), None),
    "light": (32, 0.5, (0.5, 1.5), None),
}


@dataclass(order=True)
class Event:
    at: datetime
    kind: str = field(compare=False)  # "arrive" or "end"
    user: str = field(compare=False)
    hours: float = field(compare=False, default=0.0)


def arrivals(rng: random.Random) -> list[Event]:
    """Each user's first requests of each day, in working hours (weekends: a third as many)."""
    events = []
    for habit, (users, per_day, held, _) in HABITS.items():
        for u in range(users):
            user = f"{habit}-{u}"
            for day in range(7):
                rate = per_day * (1 / 3 if day >= 5 else 1)
                for _ in range(_poisson(rng, rate if habit != "heavy" else min(rate, 1))):
                    at = START + timedelta(days=day, hours=rng.uniform(8, 20))
                    events.append(Event(at, "arrive", user, rng.uniform(*held)))
    return events


def _poisson(rng: random.Random, mean: float) -> int:
    n, p, limit = 0, 1.0, 2.718281828459045**-mean
    while True:
        p *= rng.random()
        if p < limit:
            return n
        n += 1


def simulate(gpus: int, seed: int, fair: FairShare | None) -> dict[str, list[float]]:
    """Wait in minutes of every server served, per habit; and GPU-hours per habit."""
    rng = random.Random(seed)
    events = arrivals(rng)
    heapq.heapify(events)
    spans: dict[str, list[tuple[datetime, datetime | None, float]]] = {}
    for habit, (users, per_day, held, _) in HABITS.items():  # the week before, as the habit goes
        for u in range(users):
            hours = 7 * per_day * statistics.mean(held) * (1 if habit != "light" else 0.5)
            spans[f"{habit}-{u}"] = [(START - timedelta(days=3, hours=hours), START - timedelta(days=3), 1.0)]
    line: list[Waiter] = []
    free, ids = gpus, 0
    waits: dict[str, list[float]] = {h: [] for h in HABITS}
    served_hours: dict[str, float] = dict.fromkeys(HABITS, 0.0)
    end = START + WEEK
    while events:
        ev = heapq.heappop(events)
        if ev.at > end:
            break
        if ev.kind == "end":
            free += 1
            again = HABITS[ev.user.split("-")[0]][3]
            if again is not None and ev.at.hour < 20:
                nxt = ev.at + timedelta(hours=again)
                heapq.heappush(events, Event(nxt, "arrive", ev.user, rng.uniform(*HABITS["heavy"][2])))
        else:
            ids += 1
            line.append(Waiter(ids, f"s{ids}", ev.user, "", "GPU", 0, ev.at, {"hours": ev.hours}))
        while free and line:
            standing = None
            if fair is not None:
                standing = Standing(fair, {w.user: fair.recent_use(spans[w.user], ev.at) for w in line}, ev.at)
            head = ordered(line, standing)[0]
            line.remove(head)
            free -= 1
            habit = head.user.split("-")[0]
            waits[habit].append((ev.at - head.since).total_seconds() / 60)
            until = ev.at + timedelta(hours=head.request["hours"])
            spans[head.user].append((ev.at, until, 1.0))
            served_hours[habit] += head.request["hours"]
            heapq.heappush(events, Event(until, "end", head.user))
    return {**{f"wait:{h}": w for h, w in waits.items()}, **{f"hours:{h}": [v] for h, v in served_hours.items()}}


def summary(gpus: int, seeds: int, fair: FairShare | None) -> dict[str, dict]:
    runs = [simulate(gpus, seed, fair) for seed in range(seeds)]
    out = {}
    for habit in HABITS:
        waits = sorted(w for r in runs for w in r[f"wait:{habit}"])
        out[habit] = {
            "servers": round(len(waits) / seeds),
            "wait_min_p50": round(statistics.median(waits), 1) if waits else 0.0,
            "wait_min_p95": round(waits[int(0.95 * (len(waits) - 1))], 1) if waits else 0.0,
            "gpu_hours": round(statistics.mean(r[f"hours:{habit}"][0] for r in runs), 1),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the one model (default 8)")
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    args = p.parse_args(argv)
    fair = FairShare(half_life=timedelta(days=7), max_wait=timedelta(hours=24))
    result = {
        "gpus": args.gpus,
        "seeds": args.seeds,
        "first come, first served": summary(args.gpus, args.seeds, None),
        "fair share": summary(args.gpus, args.seeds, fair),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"A week in line for {args.gpus} GPUs, {args.seeds} seeds (waits over all of them):")
    print(f"{'order':26}{'habit':9}{'servers':>8}{'p50 wait':>10}{'p95 wait':>10}{'GPU-h':>8}")
    for order in ("first come, first served", "fair share"):
        for habit, r in result[order].items():
            print(
                f"{order:26}{habit:9}{r['servers']:8d}{r['wait_min_p50']:8.1f} m"
                f"{r['wait_min_p95']:8.1f} m{r['gpu_hours']:8.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
