"""A week of one scarce GPU model: the line first come first served against fair
share, with a course's reservation every afternoon.

    python -m benchmarks.bench_week                  # 8 GPUs, a week, 3 seeds
    python -m benchmarks.bench_week --seeds 5 --gpus 16

A discrete-event simulation (no hub, no swarm) whose decisions are the product's
pure rules: the line's order (:func:`gpuspawner.core.line_order.ordered`, with a
:class:`~gpuspawner.core.line_order.Standing` of
:meth:`gpuspawner.core.fairshare.FairShare.recent_use`), what an open reservation
window keeps free (:func:`gpuspawner.plan.reservations.needs`, ``keep_free``) and
whose servers are stopped at its start (``to_stop``, newest first). The line is
served as :mod:`gpuspawner.line.wait` serves it: in order; a waiter refused
because the free GPUs are kept for a reservation is passed over, and the first
that finds no free GPU ends the round. A new request waits whenever anyone waits.

Each order runs twice on the same requests: the reservation not lending, and
lending (``Reservation.lend``) as :class:`gpuspawner.reclaim.reservations.ReservationKeeper`
lends: nothing is stopped at the window's start; ``needs`` with
``members_waiting`` keeps free only as many GPUs as members wait for in line;
after every event the keeper's check runs (the hub runs it every
``gpu_reclaim_interval``, 10 s by default): the servers of others that
``to_stop`` picks (newest first) for those members are told, and each is stopped
:data:`LEND_NOTICE` after it was first told if it is still picked then (decided
again after each stop); the line is served in the same step.

One model, G GPUs, one whole GPU per server. Users per class (CLASSES: users,
requests per weekday each, hours held, mean patience, hours of the day they ask):
*heavy* 6, 2, 6-10 h, 3 h, 08-20; *regular* 24, 1, 1-3 h, 1 h, 08-20; *light*
(students) 60, 0.4, 0.5-1.5 h, 0.5 h, 09-22; and the course *cs101*, 8 members,
1, 0.5-1.5 h, 0.5 h, asking in their group's window: G/2 GPUs reserved every day
14:00-16:00 UTC. Requests are Poisson per user and day (a third as many at the
weekend; the course every day), durations uniform, patience exponential and at
most the product's ``gpu_wait_timeout`` (4 h); a waiter gives up after it. A
weekday's requests ask for about 176 GPU-hours, 1.8 times what 8 GPUs give
between 08:00 and 20:00. Each user's use of the week before counts as their class
suggests. A server stopped for a window is not asked for again. Both orders, in
both modes, see the same requests (the same seed).

Printed per order, mode (lending or not) and class (counts and GPU-hours: means
per week; waits over all seeds, minutes): requests, served, given up, the median
and 95th percentile of the wait of those served and of the time in line of
every request (until served or given up: a give-up's patience counts as its
wait), GPU-hours served; per order and mode, the reserved GPU-hours that members used, that were lent to
others (what others held beyond the GPUs not reserved) and that stayed unused,
the servers stopped at a window's start and how many of those had been granted
at most 15 minutes before it (the notice the hub gives), those stopped at need
for a waiting member (lending), and the members' wait.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from gpuspawner.core.fairshare import FairShare
from gpuspawner.core.line_order import Standing, Waiter, ordered
from gpuspawner.core.reservations import Reservation, conflicts
from gpuspawner.plan.reservations import Candidate, Keep, keep_free, make_room, needs

START = datetime(2026, 11, 30, tzinfo=timezone.utc)  # a Monday
MODEL = "A100"
COURSE = "cs101"
# The product's defaults (gpuspawner.hub.settings; tests/unit/test_bench_week.py checks them).
HALF_LIFE = timedelta(days=7)  # as the docs suggest; 0 (off) is the default
MAX_WAIT = timedelta(hours=2)  # gpu_fairshare_max_wait_hours
WAIT_TIMEOUT = timedelta(hours=4)  # gpu_wait_timeout
NOTICE = timedelta(minutes=15)  # gpuspawner.reclaim.reservations.NOTICE_BEFORE: servers to stop are told this early
LEND_NOTICE = timedelta(minutes=1)  # gpuspawner.reclaim.reservations.LEND_NOTICE: a lent GPU is given back this late


@dataclass(frozen=True)
class Habit:
    users: int
    per_day: float  # requests per user on a weekday (Poisson)
    hours: tuple[float, float]  # hours held (uniform)
    patience: float | None  # mean hours a request waits before giving up (exponential); None: for ever
    asks: tuple[float, float]  # hours of the day (UTC) requests come in (uniform)


CLASSES = {
    "heavy": Habit(6, 2.0, (6.0, 10.0), 3.0, (8, 20)),
    "regular": Habit(24, 1.0, (1.0, 3.0), 1.0, (8, 20)),
    "light": Habit(60, 0.4, (0.5, 1.5), 0.5, (9, 22)),
    COURSE: Habit(8, 1.0, (0.5, 1.5), 0.5, (14, 16)),
}


@dataclass(frozen=True)
class Setup:
    gpus: int = 8
    days: int = 7
    classes: Mapping[str, Habit] = field(default_factory=lambda: dict(CLASSES))
    reserved: int | None = None  # GPUs the course keeps; None: half of them
    half_life: timedelta = HALF_LIFE
    max_wait: timedelta = MAX_WAIT
    wait_timeout: timedelta | None = WAIT_TIMEOUT

    @property
    def end(self) -> datetime:
        return START + timedelta(days=self.days)

    def fair(self) -> FairShare:
        return FairShare(self.half_life, self.max_wait)


@dataclass(frozen=True)
class Ask:
    id: int  # arrival order
    user: str
    cls: str
    at: datetime
    hours: float  # how long the server would run
    patience: timedelta | None  # None: waits until served

    @property
    def service(self) -> str:
        return f"s{self.id}"


START_STOP, NEED_STOP = "at start", "at need"  # why a server was stopped for a reservation


@dataclass
class Served:
    ask: Ask
    start: datetime
    end: datetime  # when it ended or will end (maybe after the week)
    stopped: str = ""  # stopped for a reservation: START_STOP (at a window's start) or NEED_STOP (lent, a member waits)
    told: datetime | None = None  # NEED_STOP: when it was first told (the stop is LEND_NOTICE later)

    @property
    def service(self) -> str:
        return self.ask.service

    @property
    def wait_min(self) -> float:
        return (self.start - self.ask.at).total_seconds() / 60


@dataclass(frozen=True)
class Sample:
    """The state after an event while a window is open (it holds until the next event)."""

    at: datetime
    members: tuple[Ask, ...]  # members waiting in line
    others: int  # others waiting in line
    kept: int  # GPUs kept free for members (the needs' unmet)
    free: int  # GPUs free
    gpus: int  # GPUs of the model
    count: int  # GPUs reserved
    members_hold: int
    others_hold: int

    @property
    def unused(self) -> int:
        """Reserved GPUs that members do not hold and others do not borrow."""
        return self.count - min(self.count, self.members_hold) - self.lent

    @property
    def lent(self) -> int:
        """Reserved GPUs that others hold: what they hold beyond the GPUs not reserved."""
        used = min(self.count, self.members_hold)
        return max(0, min(self.count - used, self.others_hold - (self.gpus - self.count)))


@dataclass
class Run:
    lend: bool = False
    served: list[Served] = field(default_factory=list)
    gave_up: list[Ask] = field(default_factory=list)
    waiting: list[Ask] = field(default_factory=list)  # still in line at the end
    stopped: int = 0  # at a window's start
    stopped_need: int = 0  # lent, for a waiting member
    reserved_h: float = 0.0  # GPU-hours of open windows
    member_h: float = 0.0  # ... of them held by members
    lent_h: float = 0.0  # ... of them held by others
    samples: list[Sample] = field(default_factory=list)

    @property
    def unused_h(self) -> float:
        return self.reserved_h - self.member_h - self.lent_h


def poisson(rng: random.Random, mean: float) -> int:
    n, p, limit = 0, 1.0, math.exp(-mean)
    while True:
        p *= rng.random()
        if p < limit:
            return n
        n += 1


def draw(setup: Setup, seed: int) -> list[Ask]:
    """The week's requests, in arrival order."""
    rng = random.Random(seed)
    out = []
    for cls, h in setup.classes.items():
        for u in range(h.users):
            for day in range(setup.days):
                weekday = (START + timedelta(days=day)).weekday() < 5
                for _ in range(poisson(rng, h.per_day if weekday or cls == COURSE else h.per_day / 3)):
                    at = START + timedelta(days=day, hours=rng.uniform(*h.asks))
                    hours = rng.uniform(*h.hours)
                    patience = None if h.patience is None else timedelta(hours=rng.expovariate(1 / h.patience))
                    if setup.wait_timeout is not None:
                        patience = min(patience or setup.wait_timeout, setup.wait_timeout)
                    out.append((at, f"{cls}-{u}", cls, hours, patience))
    out.sort(key=lambda a: (a[0], a[1]))
    return [Ask(i, user, cls, at, hours, patience) for i, (at, user, cls, hours, patience) in enumerate(out, 1)]


def reservations(setup: Setup, lend: bool = False) -> list[Reservation]:
    """The course's windows: one weekly reservation per day of the week, 14:00-16:00 UTC."""
    count = setup.reserved or max(1, setup.gpus // 2)
    day = START.replace(hour=14)
    rs = [
        Reservation(
            COURSE, MODEL, count, day + timedelta(days=d), day + timedelta(days=d, hours=2), True, lend=lend, id=d + 1
        )
        for d in range(7)
    ]
    for r in rs:
        if conflicts(r, rs, setup.gpus, START):
            raise ValueError(f"{r.describe()} conflicts with the others")
    return rs


def prior_use(setup: Setup) -> dict[str, list[tuple[datetime, datetime, float]]]:
    """Each user's week before, as their class suggests: one span ending three days before START."""
    out = {}
    for cls, h in setup.classes.items():
        days = 7 if cls == COURSE else 5 + 2 / 3
        hours = days * h.per_day * statistics.mean(h.hours)
        ended = START - timedelta(days=3)
        for u in range(h.users):
            out[f"{cls}-{u}"] = [(ended - timedelta(hours=hours), ended, 1.0)]
    return out


def simulate(setup: Setup, asks: list[Ask], fair: FairShare | None, lend: bool = False) -> Run:
    """One run over ``asks``: first come first served (``fair`` None) or fair share;
    the reservation lends its unused GPUs when ``lend``."""
    rs = reservations(setup, lend)
    ids = [r.id for r in rs]
    end = setup.end
    devices: dict[str, dict[str, int]] = {f"gpu{i}": {} for i in range(setup.gpus)}  # uuid -> {service: milli}
    running: dict[str, Served] = {}  # service -> its server
    line: dict[str, Waiter] = {}  # service -> its place
    asked: dict[str, Ask] = {}
    prior = prior_use(setup)
    held: dict[str, list[Served]] = {}  # user -> their servers (a stopped one's end is when it was stopped)
    told: dict[str, datetime] = {}  # service -> when it was first told to give back a lent GPU
    run = Run(lend=lend)
    events: list[tuple[datetime, int, str, Ask | Served | None]] = []
    seq = itertools.count()

    def push(at: datetime, kind: str, what: Ask | Served | None = None) -> None:
        heapq.heappush(events, (at, next(seq), kind, what))  # at the same time: in the order pushed

    for a in asks:
        push(a.at, "ask", a)
    for r in rs:
        for w in r.windows(START, end):
            push(w.start, "open")
            push(w.end, "close")

    def members_hold() -> dict[int, float]:
        n = sum(1 for s in running.values() if s.ask.cls == COURSE)
        return {i: float(n) for i in ids}

    def members_waiting() -> dict[int, int]:  # in thousandths: one GPU each
        n = sum(1 for k in line if asked[k].cls == COURSE)
        return {i: n * 1000 for i in ids}

    def open_needs(now: datetime):
        return [n for n in needs(rs, now, members_hold(), members_waiting=members_waiting()) if now in n.window]

    def free() -> list[str]:
        return [d for d, booked in devices.items() if not booked]

    def newest_others() -> list[str]:
        others = [s for s in running.values() if s.ask.cls != COURSE]
        return [s.service for s in sorted(others, key=lambda s: s.start, reverse=True)]

    def release(s: Served, at: datetime, stopped: str = "") -> None:
        del running[s.service]
        told.pop(s.service, None)
        s.end, s.stopped = at, stopped
        for booked in devices.values():
            booked.pop(s.service, None)

    def in_the_way(now: datetime) -> list[str]:
        """The keeper's must_make_room (the product's ``make_room``): whom the open window
        stops, others' servers newest first (a lending one: for the members waiting)."""
        others = [Candidate(service, (), None) for service in newest_others()]
        room = make_room(
            rs, now, timedelta(0), lambda _: members_hold(), lambda _: devices, lambda *_: others, members_waiting()
        )
        return list(room)

    def must_give_back(now: datetime) -> list[str]:
        """For a lending window: whom to stop for the waiting members."""
        return in_the_way(now) if lend else []

    def check(now: datetime) -> bool:
        """The keeper's check for a lending window: tell those in the way, stop those told
        LEND_NOTICE ago (each decided again after the stop before). True: one was stopped."""
        due = must_give_back(now)
        for service in set(told) - set(due):
            del told[service]  # no longer in the way
        for service in due:
            if service not in told:
                told[service] = now
                push(now + LEND_NOTICE, "lend")
        stopped = False
        for service in due:
            at = told.get(service)
            if at is None or at + LEND_NOTICE > now or service not in must_give_back(now):
                continue
            s = running[service]
            release(s, now, NEED_STOP)
            s.told = at
            run.stopped_need += 1
            stopped = True
        return stopped

    def serve(now: datetime) -> None:
        standing = None
        if fair is not None:
            use = {
                w.user: fair.recent_use(prior[w.user] + [(s.start, s.end, 1.0) for s in held.get(w.user, [])], now)
                for w in line.values()
            }
            standing = Standing(fair, use, now)
        for w in ordered(line.values(), standing):
            untouched = free()
            if not untouched:
                return  # not yet: nobody behind it is served
            mine = ids if asked[w.service].cls == COURSE else []
            kept = keep_free(open_needs(now), mine, now).get(MODEL, Keep())
            if len(untouched) - 1 < kept.devices:
                continue  # kept for a reservation's members: they may be behind it
            a = asked[w.service]
            del line[w.service]
            devices[untouched[0]][w.service] = 1000
            s = running[w.service] = Served(a, now, now + timedelta(hours=a.hours))
            run.served.append(s)
            held.setdefault(a.user, []).append(s)
            push(s.end, "end", s)

    last, rate = START, (0, 0, 0)
    while events and events[0][0] < end:
        now, _, kind, what = heapq.heappop(events)
        hours = (now - last).total_seconds() / 3600
        run.reserved_h += rate[0] * hours
        run.member_h += rate[1] * hours
        run.lent_h += rate[2] * hours
        last = now
        if isinstance(what, Ask) and kind == "ask":
            asked[what.service] = what
            line[what.service] = Waiter(what.id, what.service, what.user, "", MODEL, 0, what.at)
            if what.patience is not None:
                push(what.at + what.patience, "give up", what)
        elif isinstance(what, Ask) and what.service in line:  # gives up
            del line[what.service]
            run.gave_up.append(what)
        elif isinstance(what, Served) and running.get(what.service) is what:  # ends
            release(what, now)
        elif kind == "open" and not lend:  # a lending window stops nothing at its start
            for service in in_the_way(now):
                release(running[service], now, START_STOP)
                run.stopped += 1
        while True:
            stopped = check(now)
            serve(now)
            if not (stopped or check(now)):
                break
        opened = [r for r in rs if r.active(now) is not None]
        if opened:
            mine = sum(1 for s in running.values() if s.ask.cls == COURSE)
            sample = Sample(
                now,
                tuple(asked[k] for k in line if asked[k].cls == COURSE),
                sum(1 for k in line if asked[k].cls != COURSE),
                sum(n.unmet for n in open_needs(now)),
                len(free()),
                setup.gpus,
                sum(r.count for r in opened),
                mine,
                len(running) - mine,
            )
            run.samples.append(sample)
            rate = (sample.count, min(sample.count, mine), sample.lent)
        else:
            rate = (0, 0, 0)
    hours = (end - last).total_seconds() / 3600
    run.reserved_h += rate[0] * hours
    run.member_h += rate[1] * hours
    run.lent_h += rate[2] * hours
    run.waiting = [asked[k] for k in line]
    return run


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * (len(xs) - 1))] if xs else 0.0


def figures(setup: Setup, runs: list[Run]) -> dict:
    """Per class, and for the reservation: means per week (waits: over all runs)."""
    seeds, end = len(runs), setup.end
    out: dict = {}
    for cls in setup.classes:
        served = [s for r in runs for s in r.served if s.ask.cls == cls]
        gave_up = [a for r in runs for a in r.gave_up if a.cls == cls]
        waiting = [a for r in runs for a in r.waiting if a.cls == cls]
        waits = [s.wait_min for s in served]
        in_line = waits + [a.patience.total_seconds() / 60 for a in gave_up if a.patience is not None]
        in_line += [(end - a.at).total_seconds() / 60 for a in waiting]
        hours = sum((min(s.end, end) - s.start).total_seconds() / 3600 for s in served)
        out[cls] = {
            "requests": (len(served) + len(gave_up) + len(waiting)) / seeds,
            "served": len(served) / seeds,
            "gave_up": len(gave_up) / seeds,
            "wait_p50": median(waits),
            "wait_p95": p95(waits),
            "in_line_p50": median(in_line),
            "in_line_p95": p95(in_line),
            "gpu_hours": hours / seeds,
        }
    members = [s.wait_min for r in runs for s in r.served if s.ask.cls == COURSE]
    out["reservation"] = {
        "reserved_h": sum(r.reserved_h for r in runs) / seeds,
        "used_h": sum(r.member_h for r in runs) / seeds,
        "lent_h": sum(r.lent_h for r in runs) / seeds,
        "unused_h": sum(r.unused_h for r in runs) / seeds,
        "stopped": sum(r.stopped for r in runs) / seeds,
        "stopped_new": sum(1 for r in runs for s in r.served if s.stopped == START_STOP and s.end - s.start <= NOTICE)
        / seeds,
        "stopped_need": sum(r.stopped_need for r in runs) / seeds,
        "member_wait_p50": median(members),
        "member_wait_p95": p95(members),
    }
    return out


ORDERS = ("first come, first served", "fair share")
MODES = tuple((order, lend) for order in ORDERS for lend in (False, True))  # (order, the reservation lends)


def run_all(setup: Setup, seeds: int) -> dict[tuple[str, bool], dict]:
    """Each order, the reservation not lending and lending, on the same requests per seed."""
    runs: dict[tuple[str, bool], list[Run]] = {m: [] for m in MODES}
    for seed in range(seeds):
        asks = draw(setup, seed)
        for order, lend in MODES:
            fair = setup.fair() if order == ORDERS[1] else None
            runs[order, lend].append(simulate(setup, asks, fair, lend))
    return {m: figures(setup, rs) for m, rs in runs.items()}


def lends(lend: bool) -> str:
    return "yes" if lend else "no"


def table(setup: Setup, seeds: int, result: dict[tuple[str, bool], dict]) -> str:
    count = setup.reserved or max(1, setup.gpus // 2)
    fair = setup.fair()
    lines = [
        f"{setup.days} days, {setup.gpus} GPUs of one model, {COURSE} keeps {count} every day 14:00-16:00 UTC, "
        f"not lending and lending; {seeds} seeds (means per week, waits over all seeds); "
        f"fair share: {fair.describe()}",
        "wait: of those served, until served; in line: of every request, until served or given up (minutes)",
        f"{'order':26}{'lends':6}{'class':9}{'requests':>9}{'served':>8}{'gave up':>8}"
        f"{'wait p50':>10}{'p95':>8}{'in line p50':>13}{'p95':>8}{'GPU-h':>8}",
    ]
    for order, lend in MODES:
        for cls in setup.classes:
            r = result[order, lend][cls]
            lines.append(
                f"{order:26}{lends(lend):6}{cls:9}{r['requests']:9.1f}{r['served']:8.1f}{r['gave_up']:8.1f}"
                f"{r['wait_p50']:10.1f}{r['wait_p95']:8.1f}{r['in_line_p50']:13.1f}{r['in_line_p95']:8.1f}"
                f"{r['gpu_hours']:8.1f}"
            )
    lines.append(
        "reserved GPU-hours: held by members, lent (held by others beyond the GPUs not reserved), unused; "
        "servers stopped at a window's start (granted <= 15 min before it), at need for a waiting member; "
        f"{COURSE}'s wait (minutes)"
    )
    lines.append(
        f"{'order':26}{'lends':6}{'reserved':>9}{'members':>8}{'lent':>7}{'unused':>7}"
        f"{'at start':>9}{'<= 15 min':>10}{'at need':>8}{'wait p50':>9}{'p95':>7}"
    )
    for order, lend in MODES:
        r = result[order, lend]["reservation"]
        lines.append(
            f"{order:26}{lends(lend):6}{r['reserved_h']:9.1f}{r['used_h']:8.1f}{r['lent_h']:7.1f}{r['unused_h']:7.1f}"
            f"{r['stopped']:9.1f}{r['stopped_new']:10.1f}{r['stopped_need']:8.1f}"
            f"{r['member_wait_p50']:9.1f}{r['member_wait_p95']:7.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the one model (default 8)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    p.add_argument("--days", type=int, default=7, help="days simulated from a Monday (default 7)")
    args = p.parse_args(argv)
    if args.gpus < 2 or args.seeds < 1 or args.days < 1:
        print("--gpus must be at least 2, --seeds and --days at least 1", file=sys.stderr)
        return 2
    setup = Setup(gpus=args.gpus, days=args.days)
    t0 = time.perf_counter()
    result = run_all(setup, args.seeds)
    took = time.perf_counter() - t0
    print(table(setup, args.seeds, result))
    print(f"took {took:.1f} s (Python {platform.python_version()}, {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
