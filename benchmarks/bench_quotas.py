"""A week of three labs with GPU quotas and a best-effort group: without quotas, with
quotas that nobody may go beyond, and with quotas others borrow while idle.

    python -m benchmarks.bench_quotas                 # 16 GPUs on 4 hosts, a week, 3 seeds
    python -m benchmarks.bench_quotas --seeds 10

A discrete-event simulation (no hub, no swarm) whose decisions are the product's pure
rules (:mod:`gpuspawner.plan.quotas`): which holdings are within a quota and which are
borrowed (``marks``), what a request must leave free for others' quotas and its
borrowing limit (``keep``), and which borrowed servers are taken back for the members
who wait within their quota (``plan_reclaims``). After every event the hub's check runs
(it runs every ``gpu_reclaim_interval``, 10 s by default): the users of the servers
chosen are told, and each is stopped the quota's notice (10 minutes) after it was
first told if it is still chosen then; the line is served in the same step, requests
within their group's quota first (they are not held back by the line), then the rest in
arrival order, each that fits served (backfill), whole GPUs on the fullest host that
has room.

One model, 16 GPUs on 4 hosts of 4. Three labs whose quotas sum to the cluster (lab-a
6, lab-b 5, lab-c 5) and a best-effort group with none; per group (HABITS: users,
requests per weekday each, hours held, mean patience, hours of the day they ask, the
share of requests for 2 GPUs): lab-a 6, 1.5, 3-8 h, 3 h, 08-20, 40 %; lab-b 8, 1.0,
1-3 h, 1.5 h, 08-20, 0; lab-c 12, 1.0, 0.5-2 h, 1 h, 09-21, 0; best-effort 60, 1.5,
2-6 h, 2 h, 00-24, 0: together about what the cluster gives all day, so the best-effort
group alone would fill it. Requests are Poisson per user and day (a third as many at the
weekend), durations uniform, patience exponential and at most the product's
``gpu_wait_timeout`` (4 h). A server taken back is not asked for again.

Modes: *none* (no quotas: the line alone), *no borrowing* (``borrow: 0, lend: 0``: a
group never goes beyond its quota and idle quota is never lent, so the best-effort
group gets nothing), *borrowing* (the defaults: no borrowing limit, all idle quota
lent, 10 minutes' notice). Printed per mode (means per week; waits over all seeds,
minutes): GPU use; per lab, its requests within its quota at arrival, their wait p50
and p95, the share served within the notice + 1 minute (of those that were served or
waited that long); requests served and given up per group; GPU-hours taken back (held
by the servers stopped, until their stop), servers stopped, and stops per borrowed
holding.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import os
import platform
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from benchmarks.bench_week import START, Habit, median, p95, poisson
from gpuspawner.core.quotas import NOTICE, Quota
from gpuspawner.core.sharing import UNIT
from gpuspawner.plan.quotas import Ask as PlanAsk
from gpuspawner.plan.quotas import Borrowed, Waiter, draws_on, in_turn, keep, marks, plan_reclaims, used
from gpuspawner.plan.reservations import Holder

MODEL = "A100"
HOSTS, PER_HOST = 4, 4
WAIT_TIMEOUT = timedelta(hours=4)  # gpu_wait_timeout
BEST_EFFORT = "best-effort"
HABITS = {
    "lab-a": (Habit(6, 1.5, (3.0, 8.0), 3.0, (8, 20)), 0.4),
    "lab-b": (Habit(8, 1.0, (1.0, 3.0), 1.5, (8, 20)), 0.0),
    "lab-c": (Habit(12, 1.0, (0.5, 2.0), 1.0, (9, 21)), 0.0),
    BEST_EFFORT: (Habit(60, 1.5, (2.0, 6.0), 2.0, (0, 24)), 0.0),
}
QUOTAS = {"lab-a": 6, "lab-b": 5, "lab-c": 5}
MODES = ("none", "no borrowing", "borrowing")


def quotas(mode: str) -> list[Quota]:
    if mode == "none":
        return []
    limit = 0 if mode == "no borrowing" else None
    return [Quota(g, MODEL, n * UNIT, borrow=limit, lend=limit) for g, n in QUOTAS.items()]


@dataclass(frozen=True)
class Ask:
    id: int
    user: str
    group: str
    at: datetime
    hours: float
    gpus: int
    patience: timedelta

    @property
    def key(self) -> str:
        return f"s{self.id}"


def draw(days: int, seed: int) -> list[Ask]:
    rng = random.Random(seed)
    out = []
    for group, (h, two) in HABITS.items():
        for u in range(h.users):
            for day in range(days):
                weekday = (START + timedelta(days=day)).weekday() < 5
                for _ in range(poisson(rng, h.per_day if weekday else h.per_day / 3)):
                    at = START + timedelta(days=day, hours=rng.uniform(*h.asks))
                    hours = rng.uniform(*h.hours)
                    gpus = 2 if rng.random() < two else 1
                    patience = min(timedelta(hours=rng.expovariate(1 / (h.patience or 1))), WAIT_TIMEOUT)
                    out.append((at, f"{group}-{u}", group, hours, gpus, patience))
    out.sort(key=lambda a: (a[0], a[1]))
    return [
        Ask(i, user, group, at, hours, gpus, patience)
        for i, (at, user, group, hours, gpus, patience) in enumerate(out, 1)
    ]


@dataclass
class Held:
    ask: Ask
    uuids: list[str]
    start: datetime
    borrowed: bool
    stopped: datetime | None = None


@dataclass
class Run:
    served: list[Held] = field(default_factory=list)
    gave_up: list[Ask] = field(default_factory=list)
    within: dict[int, bool] = field(default_factory=dict)  # ask id -> within its quota at arrival
    busy_h: float = 0.0  # GPU-hours held within the week


class Week:
    def __init__(self, mode: str, days: int):
        self.quotas = quotas(mode)
        self.reference = quotas("borrowing")  # what counts as within a lab's quota, in every mode
        self.end = START + timedelta(days=days)
        self.devices: dict[str, str | None] = {f"h{h}-{d}": None for h in range(HOSTS) for d in range(PER_HOST)}
        self.holding: dict[str, Held] = {}
        self.line: list[Ask] = []
        self.told: dict[str, tuple[datetime, str]] = {}  # key -> (when told, the waiter it is taken back for)
        self.promised: dict[str, datetime] = {}  # waiter -> when the first notice for it was given
        self.events: list = []
        self.seq = itertools.count()
        self.run = Run()

    def at(self, t: datetime, kind: str, what) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, what))

    # -- what the product's rules see --------------------------------------------------

    def holders(self) -> list[Holder]:
        ordered = sorted(self.holding.values(), key=lambda h: (h.start, h.ask.id))  # oldest first
        return [Holder(h.ask.key, MODEL, len(h.uuids) * UNIT, frozenset({h.ask.group})) for h in ordered]

    def use(self) -> dict[tuple[str, str], int]:
        holders = self.holders()
        return used(self.quotas, holders, marks(self.quotas, holders))

    def waiting_within(
        self, use, quotas: list[Quota] | None = None, line: list[Ask] | None = None
    ) -> tuple[list[Ask], dict[tuple[str, str], int]]:
        """The waiters within their quotas, in line order, and what each quota's members wait
        for within it (of ``line``: by default, the whole line)."""
        of = {q.group: q for q in (self.quotas if quotas is None else quotas)}
        waiting: dict[tuple[str, str], int] = {}
        out = []
        for a in self.line if line is None else line:
            so_far = {g: use.get((g, MODEL), 0) + waiting.get((g, MODEL), 0) for g in of}
            mark = draws_on(of, so_far, {a.group}, a.gpus * UNIT)
            if mark.within and mark.group is not None:
                waiting[(mark.group, MODEL)] = waiting.get((mark.group, MODEL), 0) + a.gpus * UNIT
                out.append(a)
        turn = {w.key: i for i, w in enumerate(in_turn([Waiter(a.key, "", PlanAsk()) for a in out], self.promised))}
        return sorted(out, key=lambda a: turn[a.key]), waiting

    def hosts(self) -> dict[str, dict[str, dict[str, int]]]:
        out: dict[str, dict[str, dict[str, int]]] = {}
        for uuid, key in self.devices.items():
            out.setdefault(uuid.split("-")[0], {})[uuid] = {} if key is None else {key: UNIT}
        return out

    # -- serving and taking back -------------------------------------------------------

    def place(self, a: Ask) -> list[str] | None:
        """Whole GPUs on the fullest host with room, as pack places them."""
        free: dict[str, list[str]] = {}
        for uuid, key in self.devices.items():
            if key is None:
                free.setdefault(uuid.split("-")[0], []).append(uuid)
        fits = [(len(us), h) for h, us in free.items() if len(us) >= a.gpus]
        if not fits:
            return None
        _, host = min(fits)
        return free[host][: a.gpus]

    def serve(self, t: datetime) -> None:
        while True:
            use = self.use()
            within, waiting = self.waiting_within(use)
            for a in within + [a for a in self.line if a not in within]:
                ahead = self.waiting_within(use, line=within[: within.index(a)])[1] if a in within else waiting
                k = keep(self.quotas, use, ahead, {a.group}, {MODEL: a.gpus * UNIT}).get(MODEL)
                uuids = self.place(a)
                if uuids is None:
                    continue
                untouched = sum(1 for k2 in self.devices.values() if k2 is None) - len(uuids)
                if k is not None and not k.met(untouched, untouched * UNIT, a.gpus * UNIT):
                    continue
                self.grant(a, uuids, t, use)
                break
            else:
                return

    def grant(self, a: Ask, uuids: list[str], t: datetime, use) -> None:
        self.line.remove(a)
        of = {q.group: q for q in self.quotas}
        so_far = {g: use.get((g, MODEL), 0) for g in of}
        borrowed = bool(self.quotas) and not draws_on(of, so_far, {a.group}, a.gpus * UNIT).within
        h = Held(a, uuids, t, borrowed)
        for u in uuids:
            self.devices[u] = a.key
        self.holding[a.key] = h
        self.run.served.append(h)
        self.at(t + timedelta(hours=a.hours), "end", h)

    def release(self, h: Held, t: datetime) -> None:
        if self.holding.get(h.ask.key) is not h:
            return
        del self.holding[h.ask.key]
        self.told.pop(h.ask.key, None)
        for u in h.uuids:
            self.devices[u] = None
        self.run.busy_h += len(h.uuids) * (min(t, self.end) - h.start).total_seconds() / 3600

    def take_back(self, t: datetime) -> None:
        """The hub's check: tell the chosen, stop those whose notice has passed."""
        while True:
            use = self.use()
            within, _ = self.waiting_within(use)
            holders = self.holders()
            found = marks(self.quotas, holders)
            borrowed = [
                Borrowed(
                    k.key,
                    k.milli / UNIT * (t - self.holding[k.key].start).total_seconds() / 3600,
                    ((self.told[k.key][0] + NOTICE - t) if k.key in self.told else NOTICE).total_seconds(),
                )
                for k in holders
                if not found[k.key].within
            ]
            of = {q.group: q for q in self.quotas}
            waiters = [
                Waiter(a.key, draws_on(of, {}, {a.group}, a.gpus * UNIT).group or "", PlanAsk(count=a.gpus))
                for a in within
            ]
            chosen = plan_reclaims(waiters, self.hosts(), borrowed)
            for key in set(self.promised) - {w.key for w in waiters}:  # served, or gave up
                del self.promised[key]
            for w in chosen.values():
                self.promised.setdefault(w.key, t)
            for key in set(self.told) - set(chosen):
                del self.told[key]
            for key, w in chosen.items():
                if key not in self.told:
                    self.at(t + NOTICE, "check", None)
                self.told[key] = (self.told[key][0] if key in self.told else t, w.key)
            due = [key for key, (told, _) in self.told.items() if told + NOTICE <= t]
            if not due:
                return
            for key in due:
                h = self.holding[key]
                h.stopped = t
                self.release(h, t)
            self.serve(t)

    def simulate(self, asks: list[Ask]) -> Run:
        for a in asks:
            self.at(a.at, "ask", a)
        while self.events:
            t, _, kind, what = heapq.heappop(self.events)
            if t > self.end:
                break
            if kind == "ask":
                holders = self.holders()  # within the quota with what its members hold and wait for within it
                use = used(self.reference, holders, marks(self.reference, holders))
                _, waiting = self.waiting_within(use, self.reference)
                of = {q.group: q for q in self.reference}
                so_far = {g: use.get((g, MODEL), 0) + waiting.get((g, MODEL), 0) for g in of}
                self.run.within[what.id] = draws_on(of, so_far, {what.group}, what.gpus * UNIT).within
                self.line.append(what)
                self.at(t + what.patience, "give up", what)
            elif kind == "end":
                self.release(what, t)
            elif kind == "give up" and what in self.line:
                self.line.remove(what)
                self.run.gave_up.append(what)
            self.serve(t)
            if self.quotas:
                self.take_back(t)
        for h in list(self.holding.values()):
            self.release(h, self.end)
        return self.run


def figures(runs: list[Run], days: int) -> dict:
    seeds = len(runs)
    notice_min = NOTICE.total_seconds() / 60 + 1
    out: dict = {"use": sum(r.busy_h for r in runs) / (seeds * HOSTS * PER_HOST * days * 24)}
    for group in HABITS:
        served = [h for r in runs for h in r.served if h.ask.group == group]
        gave_up = [a for r in runs for a in r.gave_up if a.group == group]
        within = [(h, r) for r in runs for h in r.served if h.ask.group == group and r.within.get(h.ask.id)]
        waits = [(h.start - h.ask.at).total_seconds() / 60 for h, _ in within]
        late_gave_up = sum(
            1
            for r in runs
            for a in r.gave_up
            if a.group == group and r.within.get(a.id) and a.patience.total_seconds() / 60 >= notice_min
        )
        in_time = sum(1 for w in waits if w <= notice_min)
        out[group] = {
            "served": len(served) / seeds,
            "gave_up": len(gave_up) / seeds,
            "within": (len(within) + late_gave_up) / seeds,
            "wait_p50": median(waits),
            "wait_p95": p95(waits),
            "in_time": in_time / (len(waits) + late_gave_up) if waits or late_gave_up else math.nan,
        }
    stopped = [h for r in runs for h in r.served if h.stopped is not None]
    borrowed = [h for r in runs for h in r.served if h.borrowed]
    out["taken_back_h"] = sum(len(h.uuids) * (h.stopped - h.start).total_seconds() / 3600 for h in stopped) / seeds
    out["stops"] = len(stopped) / seeds
    out["per_borrowed"] = len(stopped) / len(borrowed) if borrowed else 0.0
    return out


def run_all(seeds: int, days: int) -> dict[str, dict]:
    out: dict[str, list[Run]] = {m: [] for m in MODES}
    for seed in range(seeds):
        asks = draw(days, seed)
        for mode in MODES:
            out[mode].append(Week(mode, days).simulate(asks))
    return {m: figures(rs, days) for m, rs in out.items()}


def table(result: dict[str, dict], seeds: int, days: int) -> str:
    quota = ", ".join(f"{g} {n}" for g, n in QUOTAS.items())
    lines = [
        f"{days} days, {HOSTS * PER_HOST} GPUs on {HOSTS} hosts; quotas {quota}; {seeds} seeds "
        "(means per week; waits over all seeds, minutes)",
        "within: requests within the lab's quota at arrival; in time: of those, served within the notice + 1 min",
        f"{'mode':14}{'use':>6}"
        + "".join(f"{g + ' within':>15}{'p50':>6}{'p95':>7}{'in time':>8}" for g in QUOTAS)
        + f"{'taken back GPU-h':>18}{'stops':>7}{'per borrowed':>13}",
    ]
    for mode in MODES:
        r = result[mode]
        row = f"{mode:14}{r['use'] * 100:5.1f}%"
        for g in QUOTAS:
            x = r[g]
            in_time = "-" if math.isnan(x["in_time"]) else f"{x['in_time'] * 100:.1f}%"
            row += f"{x['within']:15.1f}{x['wait_p50']:6.1f}{x['wait_p95']:7.1f}{in_time:>8}"
        row += f"{r['taken_back_h']:18.1f}{r['stops']:7.1f}{r['per_borrowed']:13.3f}"
        lines.append(row)
    lines.append("requests served / given up per group")
    lines.append(f"{'mode':14}" + "".join(f"{g:>20}" for g in HABITS))
    for mode in MODES:
        cells = "".join(f"{result[mode][g]['served']:11.1f} /{result[mode][g]['gave_up']:7.1f}" for g in HABITS)
        lines.append(f"{mode:14}{cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    p.add_argument("--days", type=int, default=7, help="days simulated from a Monday (default 7)")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.days < 1:
        print("--seeds and --days must be at least 1", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    result = run_all(args.seeds, args.days)
    took = time.perf_counter() - t0
    print(table(result, args.seeds, args.days))
    print(f"took {took:.1f} s (Python {platform.python_version()}, {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
