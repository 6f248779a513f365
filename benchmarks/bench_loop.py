"""How long each thing gpuspawner does blocks the hub's event loop, at 1,000 nodes × 8 GPUs.

    python -m benchmarks.bench_loop                      # 1000 nodes × 8 GPUs, sharing on
    python -m benchmarks.bench_loop --json               # the same figures as JSON
    python -m benchmarks.bench_loop --nodes 100 --views 10

State, built untimed: every node has reported once through ``GPUCluster.receive``
(agent source; one model per node, drawn as in bench_allocator), sharing is open on
every model (quantum 0.05, splitting allowed), and 70 % of the devices are held: three
quarters of those whole by servers of 1, 2 or 4 GPUs, a quarter as shares (0.25, 0.3 or
0.5 of a GPU). Every holder has a user and a server name, as the spawner records them.

Operations, each timed with ``perf_counter_ns`` around what runs on the loop:

* report, no change: ``parse_report`` + ``receive`` of a node's report whose readings
  (temperature, utilisation) changed;
* report, health change: one GPU of the node gets uncorrected ECC errors, or recovers;
* report, device gone/back: one GPU of the node is missing from its report, or is back;
* allocate whole / allocate share: one decision (1 GPU; 0.25 of a GPU) as the spawner
  makes it, with the holder's user and server recorded; given back untimed;
* release: a random holder's devices given back (booked again untimed);
* counts made at start: what the hub does once, after its first reconcile, so that the
  first scrape finds every host's counts made (stepped: it gives way between hosts);
* metrics scrape: ``prometheus_client.generate_latest`` over a registry with
  gpuspawner's device gauges (JupyterHub's /hub/metrics does this over its own), one
  series per model (the default) and, "per host", one per host and model
  (``gpu_metrics_per_host``); "collect only": the gauges' own part, without
  prometheus_client writing text;
* alloc-map: the work of ``GET /hub/api/gpuspawner/alloc-map``: the map as JSON bytes;
* /hub/gpus: the page's work (``api.gpu_page`` as GPUPageHandler calls it, and the
  pieces it writes): gpus.html rendered by an async Jinja environment set up as
  JupyterHub's, under a stub page.html (JupyterHub's own page.html costs the same
  whatever the map holds), with the hosts' cards from gpus_host.html.

The three views are timed after "an interval" of untimed activity: every node reported
once (one report in a hundred changing a GPU's health), 10 servers started and 10
stopped, as between two scrapes 15 s apart on a busy hub; the map also right after a
single report ("warm"). Each view's first request after start-up ("first": nothing
kept yet, templates not compiled) is timed once. A view that awaits (that hands work
to a thread, or gives way between hosts) is stepped by hand: its figure is the longest
stretch it ran between two awaits, and ``lag`` the most a 1 ms timer on the same loop
fired late meanwhile (a thread holds the GIL for up to 5 ms at a time, so the loop may
still wait on it). ``gc``: how many of the timed runs had a garbage collection of 1 ms or
more inside them (whatever code triggers it, it stops the loop: a collection of the
older generations takes ~10 ms at this size, a full one ~100 ms); ``max w/o gc``: the
longest of the other runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import random
import sys
import time
from datetime import datetime, timedelta, timezone

import jinja2
from prometheus_client import CollectorRegistry, generate_latest

from gpuspawner import metrics
from gpuspawner.allocator.allocator import AllocationRefused, Request
from gpuspawner.cluster.cluster import GPUCluster, InventorySettings
from gpuspawner.cluster.host_views import batches
from gpuspawner.core.labels import Held
from gpuspawner.core.reports import parse_report
from gpuspawner.core.reservations import Reservation
from gpuspawner.holdings.holdings import Holding, Phase
from gpuspawner.plan.backfill import Round, StartsCache, planned_start
from gpuspawner.reclaim.reservations import ReservationKeeper
from gpuspawner.web.api import gpu_page

from .bench_allocator import MODELS, SHARING

pc = time.perf_counter_ns
TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpuspawner", "templates")
STUB_PAGE = "<!DOCTYPE html><html><body><main>{% block main %}{% endblock %}</main></body></html>"
HELD = 0.7  # of the devices
SHARED = 0.25  # of the held devices
WHOLE_SIZES = [1, 1, 1, 2, 4]
SHARE_SIZES = [250, 300, 500]  # thousandths of a GPU
MAX_PER_OWNER = 8


class Fleet:
    """The nodes' agents: what each would report now."""

    def __init__(self, nodes: int, rng: random.Random):
        self.rng = rng
        names, weights = [m for m, _, _ in MODELS], [w for _, _, w in MODELS]
        self.memory = {m: mib for m, mib, _ in MODELS}
        self.hosts = [f"node{h:04d}" for h in range(nodes)]
        self.model = {h: rng.choices(names, weights)[0] for h in self.hosts}
        self.sick: dict[str, int] = {}  # host -> the index of its GPU with ECC errors
        self.missing: dict[str, int] = {}  # host -> the index of its GPU left out of the report

    def body(self, host: str) -> bytes:
        rng, model = self.rng, self.model[host]
        sick, missing = self.sick.get(host), self.missing.get(host)
        devices = [
            {
                "index": i,
                "uuid": f"GPU-{host}-{i}",
                "name": model,
                "memory_total_mib": self.memory[model],
                "memory_used_mib": rng.randrange(0, 4096),
                "utilization_gpu": rng.randrange(0, 101),
                "temperature_c": rng.randrange(30, 80),
                "lost": False,
                "ecc_uncorrected": 3 if i == sick else 0,
                "processes": [{"pid": 100 + i, "used_mib": 1000}],
                "mig_mode": False,
                "healthy": i != sick,
                "problems": [],
                "mig_devices": [],
            }
            for i in range(8)
            if i != missing
        ]
        report = {
            "hostname": host,
            "interval": 15,
            "agent_version": "0.1.0",
            "driver_version": "550.54.15",
            "cuda_version": "12.4",
            "device_count": len(devices),
            "healthy": sick is None,
            "devices": devices,
        }
        return json.dumps(report).encode()

    def flip_health(self, host: str) -> None:
        if host in self.sick:
            del self.sick[host]
        else:
            self.sick[host] = self.rng.randrange(8)

    def flip_device(self, host: str) -> None:
        if host in self.missing:
            del self.missing[host]
        else:
            self.missing[host] = self.rng.randrange(8)


class Hub:
    """The cluster with its holders, and what the spawner does around a decision."""

    def __init__(self, nodes: int, seed: int):
        self.rng = random.Random(seed)
        self.fleet = Fleet(nodes, self.rng)
        self.cluster = GPUCluster(InventorySettings(sources=("agent",)))
        self.cluster.allocator.set_sharing(SHARING)
        for host in self.fleet.hosts:
            self.report(host)
        self.users = [f"user{u:05d}" for u in range(max(1, nodes * 2))]
        self.requests: dict[str, Request] = {}  # holder -> what it asked for
        self.serial = 0
        gpus = nodes * 8
        whole = 0
        while whole < gpus * HELD * (1 - SHARED):
            alloc = self.start(Request(count=self.rng.choice(WHOLE_SIZES)))
            whole += len(alloc.devices) if alloc else 0
        booked: set[str] = set()
        while len(booked) < gpus * HELD * SHARED:
            alloc = self.start(Request(milli=self.rng.choice(SHARE_SIZES)))
            booked.update(alloc.uuids if alloc else ())

    def report(self, host: str) -> None:
        self.cluster.receive(parse_report(self.fleet.body(host)), now=0.0)

    def start(self, shape: Request, holder: str | None = None):
        """One decision as the spawner makes it; None when refused."""
        self.serial += 1
        user = self.rng.choice(self.users)
        holder = holder or f"jupyter-{user}-{self.serial}"
        request = Request(model=shape.model, count=shape.count, milli=shape.milli, owner=user)
        try:
            alloc = self.cluster.allocator.allocate(holder, request, max_per_owner=MAX_PER_OWNER)
        except AllocationRefused:
            return None
        self.requests[holder] = shape
        return alloc

    def stop(self, holder: str) -> None:
        self.cluster.allocator.release(holder)
        self.requests.pop(holder, None)

    def interval(self) -> None:
        """What happens between two scrapes 15 s apart: every node reports, 10 servers come and go."""
        for host in self.fleet.hosts:
            if self.rng.random() < 0.01:
                self.fleet.flip_health(host)
            self.report(host)
        for _ in range(10):
            self.stop(self.rng.choice(list(self.requests)))
            self.start(Request(count=1) if self.rng.random() < 0.75 else Request(milli=250))
        # 15 s of reports arrive here in a fraction of a second: what the young
        # generations' collections would have done in passing, they do now, so
        # that the next timed request does not pay for the burst.
        gc.collect(1)


class Stepped:
    """Awaits a coroutine, timing each stretch it runs before it awaits."""

    def __init__(self, coro):
        self.coro = coro
        self.longest = 0

    def __await__(self):
        value, error = None, None
        while True:
            t0 = pc()
            try:
                future = self.coro.throw(error) if error is not None else self.coro.send(value)
            except StopIteration as stop:
                self.longest = max(self.longest, pc() - t0)
                return stop.value
            self.longest = max(self.longest, pc() - t0)
            try:
                value, error = (yield future), None
            except BaseException as exc:  # noqa: B036 - handed back to the coroutine
                value, error = None, exc


async def stepped(coro) -> tuple[int, float]:
    """(longest synchronous stretch in ns, largest lag of a 1 ms timer in ms) while coro runs."""
    loop = asyncio.get_running_loop()
    lags = [0.0]
    done = False

    async def probe():
        while not done:
            t = loop.time()
            await asyncio.sleep(0.001)
            lags.append(loop.time() - t - 0.001)

    task = loop.create_task(probe())
    await asyncio.sleep(0)
    step = Stepped(coro)
    await step
    done = True
    await task
    return step.longest, max(lags) * 1000


@contextlib.contextmanager
def gc_watch():
    """The garbage collections of 1 ms or more that ran meanwhile: (generation, ms) each."""
    found: list[tuple[int, float]] = []
    began = [0]

    def watch(phase, info):
        if phase == "start":
            began[0] = pc()
        elif pc() - began[0] >= 1_000_000:
            found.append((info["generation"], (pc() - began[0]) / 1e6))

    gc.callbacks.append(watch)
    try:
        yield found
    finally:
        gc.callbacks.remove(watch)


def stats(ns: list[int], lags: list[float] | None = None, gcs: list[list] | None = None) -> dict:
    s = sorted(ns)
    gcs = gcs or [[]] * len(ns)
    clean = [t for t, found in zip(ns, gcs) if not found]
    out = {
        "runs": len(s),
        "p50_ms": s[len(s) // 2] / 1e6,
        "p99_ms": s[min(len(s) - 1, int(0.99 * len(s)))] / 1e6,
        "max_ms": s[-1] / 1e6,
        "runs_with_gc": sum(1 for found in gcs if found),
        "max_without_gc_ms": max(clean, default=0) / 1e6,
        "gc_pauses_ms": [[gen, round(ms, 1)] for found in gcs for gen, ms in found],
    }
    if lags:
        out["lag_max_ms"] = max(lags)
    return out


LINE = 200  # waiters planned in one serving of the line
LINE_SIZES = [8, 8, 4, 2, 1]  # GPUs a waiter asks for (the line holds the large requests)
RESERVATIONS = 10  # open windows, of every model, for groups that the holders' users may be in
GROUPS = 40  # groups a user may be in (each is in two)


class KeptHoldings:
    """What the reservation keeper reads of the hub's holdings: each server's holding
    (its user, model and devices, as the hub's labels write them), a version that
    changes with them, and the allocator."""

    def __init__(self, hub: Hub):
        self.allocator, self.version = hub.cluster.allocator, 0
        self._all = {k: self._holding(a) for k, a in self.allocator.holdings().items() if a.devices}

    @staticmethod
    def _holding(a) -> Holding:
        held = Held(a.owner, "", a.host, a.uuids, a.model, None, a.milli)
        return Holding(a.holder, held, Phase.RUNNING)

    def all(self) -> dict[str, Holding]:
        return dict(self._all)

    def changed(self, gone: str, new) -> None:
        self._all.pop(gone, None)
        if new is not None:
            self._all[new.holder] = self._holding(new)
        self.version += 1


def plan_line(hub: Hub, rounds: int) -> dict:
    """One planning round for a line of :data:`LINE` waiters with :data:`RESERVATIONS`
    open reservations, as the hub makes it after a change of holdings: the line's plan
    (``Round`` over the allocator's ``planner`` and ``planned_start``) and what the
    reservations keep from a request of a non-member (the product's
    ``ReservationKeeper.keep_free``: each holding counted toward one reservation at
    most, each window's need). The cluster is filled until none of the line fits now;
    every holder has a held-time limit but one in ten (``ends_in``); each user is in two
    of :data:`GROUPS` groups. Timed: the whole round, with every planned start worked out
    for a request with a time limit, ``rounds`` times, with a holder's server ending
    between two."""
    alloc, rng = hub.cluster.allocator, hub.rng
    while hub.start(Request(count=1)) is not None:  # full: the line's requests wait
        pass
    ends = {h: None if rng.random() < 0.1 else rng.uniform(60, 8 * 3600) for h in hub.requests}
    models = [m.model for m in alloc.summary()]
    line = [Request(model=rng.choice(models), count=rng.choice(LINE_SIZES)) for _ in range(LINE)]
    now = datetime(2026, 12, 7, 12, tzinfo=timezone.utc)
    groups = {u: frozenset(f"g{rng.randrange(GROUPS)}" for _ in range(2)) for u in hub.users}
    holdings = KeptHoldings(hub)
    keeper = ReservationKeeper(holdings, groups_of=groups.get, wall=lambda: now)  # type: ignore[arg-type]
    keeper.reservations = [
        Reservation(
            f"g{i}",
            models[i % len(models)],
            rng.randint(1, 16),
            now - timedelta(hours=1),
            now + timedelta(hours=2),
            id=i + 1,
        )
        for i in range(RESERVATIONS)
    ]
    keeper.known = True

    def start_here(request: Request, host: str):
        return planned_start(request, alloc.host_devices(host, (request.model,)), ends.get, alloc.host_room(host))

    cache = StartsCache(start_here, alloc.version, time.monotonic)  # as the hub's line keeps them

    times, gcs = [], []
    for _ in range(rounds):
        with gc_watch() as collected:
            t = pc()
            keeper.keep_free(())  # what a request of a non-member must leave free
            plan = Round(alloc.planner(), True, cache.starts(time.monotonic()))
            for i, request in enumerate(line):
                plan.wait(i, request)
            plan.avoid(4 * 3600.0)  # a request with a time limit: every planned start is worked out
            times.append(pc() - t)
        gcs.append(collected)
        holder = rng.choice(list(hub.requests))  # a server ends, another takes its place
        hub.stop(holder)
        ends.pop(holder, None)
        new = hub.start(Request(count=1))
        if new is not None:
            ends[new.holder] = rng.uniform(60, 8 * 3600)
        holdings.changed(holder, new)
    return stats(times, gcs=gcs)


def page_environments() -> tuple[jinja2.Environment, jinja2.Environment]:
    """An async and a sync environment, as JupyterHub sets them up."""
    loader = jinja2.ChoiceLoader([jinja2.DictLoader({"page.html": STUB_PAGE}), jinja2.FileSystemLoader(TEMPLATES)])
    return (
        jinja2.Environment(loader=loader, autoescape=True, enable_async=True),
        jinja2.Environment(loader=loader, autoescape=True),
    )


# -- what the views do on the loop -------------------------------------------------------


def scrape(registry) -> bytes:
    return generate_latest(registry)


async def alloc_map_body(cluster: GPUCluster) -> bytes:
    return await cluster.views.alloc_map_json()


async def gpus_page(cluster: GPUCluster, envs: tuple[jinja2.Environment, jinja2.Environment]) -> int:
    """What GPUPageHandler does, with an await for each piece it flushes; the bytes sent."""
    env, sync = envs

    def render_page(**namespace):
        return env.get_template("gpus.html").render_async(base_url="/hub/", **namespace)

    head, cards, tail = await gpu_page(cluster, render_page, sync.get_template("gpus_host.html"))
    sent = 0
    for piece in batches([head.encode(), *cards, tail.encode()]):
        sent += len(piece)
        await asyncio.sleep(0)
    return sent


# -- the runs --------------------------------------------------------------------------------


async def run(nodes: int, reports: int, decisions: int, views: int, seed: int) -> dict:
    t0 = time.monotonic()
    hub = Hub(nodes, seed)
    cluster, fleet, rng = hub.cluster, hub.fleet, hub.rng
    holdings = cluster.allocator.holdings()
    held = len({u for a in holdings.values() for u in a.uuids})
    shared = len({u for a in holdings.values() if a.shared for u in a.uuids})
    out: dict = {
        "nodes": nodes,
        "gpus": nodes * 8,
        "held": held,
        "held_as_shares": shared,
        "holders": len(holdings),
        "setup_s": round(time.monotonic() - t0, 1),
        "ops": {},
    }

    def timed_reports(change) -> dict:
        times, gcs = [], []
        for _ in range(reports):
            host = rng.choice(fleet.hosts)
            change(host)
            body = fleet.body(host)
            with gc_watch() as collected:
                t = pc()
                cluster.receive(parse_report(body), now=0.0)
                times.append(pc() - t)
            gcs.append(collected)
        return stats(times, gcs=gcs)

    out["ops"]["report, no change"] = timed_reports(lambda host: None)
    out["ops"]["report, health change"] = timed_reports(fleet.flip_health)
    out["ops"]["report, device gone/back"] = timed_reports(fleet.flip_device)

    for name, shape in (("allocate whole", Request(count=1)), ("allocate share", Request(milli=250))):
        times, gcs = [], []
        for _ in range(decisions):
            holder = f"bench-{hub.serial}"
            with gc_watch() as collected:
                t = pc()
                hub.start(shape, holder)
                times.append(pc() - t)
            gcs.append(collected)
            hub.stop(holder)
        out["ops"][name] = stats(times, gcs=gcs)

    times, gcs = [], []
    for _ in range(decisions):
        holder = rng.choice(list(hub.requests))
        shape = hub.requests[holder]
        with gc_watch() as collected:
            t = pc()
            cluster.allocator.release(holder)
            times.append(pc() - t)
        gcs.append(collected)
        hub.requests.pop(holder)
        hub.start(shape)
    out["ops"]["release"] = stats(times, gcs=gcs)

    out["ops"]["plan: 200 wait, 10 reserved"] = plan_line(hub, decisions)

    collectors, registries = {}, {}
    for per_host in (False, True):  # the default (a series per model), and gpu_metrics_per_host
        collectors[per_host] = metrics.DeviceGauges(lambda: cluster, per_host=lambda p=per_host: p)
        registries[per_host] = CollectorRegistry()
        registries[per_host].register(collectors[per_host])
    env = page_environments()

    async def view(name: str):
        """One request of a view: (longest synchronous stretch in ns, timer lag in ms or None, bytes)."""
        if name.startswith("metrics"):
            per_host = name.endswith("per host")
            t = pc()
            if name.startswith("metrics scrape"):
                body: bytes | list = scrape(registries[per_host])
            else:
                body = list(collectors[per_host].collect())
            return pc() - t, None, len(body)
        coro = gpus_page(cluster, env) if name.startswith("/hub/gpus") else alloc_map_body(cluster)
        size = []

        async def sized():
            body = await coro
            size.append(body if isinstance(body, int) else len(body))

        longest, lag = await stepped(sized())
        return longest, lag, size[0]

    sizes = {}
    # At start the hub makes every host's counts, giving way between hosts (GPUHub's first
    # reconcile: ClusterViews.warm_counts), so that the first scrape finds them made.
    with gc_watch() as found:
        longest, lag = await stepped(cluster.views.warm_counts())
    out["ops"]["counts made at start"] = stats([longest], [lag], [found])
    for name in ("metrics scrape", "alloc-map", "/hub/gpus page"):  # the first request after start-up
        with gc_watch() as found:
            longest, lag, _ = await view(name)
        out["ops"][f"{name}, first"] = stats([longest], [lag] if lag is not None else None, [found])
    for name in (
        "metrics scrape",
        "metrics scrape, per host",
        "metrics, collect only",
        "metrics, collect, per host",
        "alloc-map",
        "alloc-map, warm",
        "/hub/gpus page",
    ):
        times, lags, gcs = [], [], []
        for _ in range(views):
            if name.endswith("warm"):
                hub.report(rng.choice(fleet.hosts))
            else:
                hub.interval()
            with gc_watch() as collected:
                key = name if name.startswith("metrics scrape") else name.split(",")[0]
                longest, lag, sizes[key] = await view(name)
            times.append(longest)
            gcs.append(collected)
            if lag is not None:
                lags.append(lag)
        out["ops"][name] = stats(times, lags, gcs)
    out["bytes"] = {k: v for k, v in sizes.items() if k != "metrics"}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_loop", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--reports", type=int, default=500, help="timed reports of each kind")
    ap.add_argument("--decisions", type=int, default=500, help="timed decisions of each kind")
    ap.add_argument("--views", type=int, default=20, help="timed requests of each view")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    result = asyncio.run(run(args.nodes, args.reports, args.decisions, args.views, args.seed))
    result["python"] = platform.python_version()
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print(
        f"{result['nodes']} nodes × 8 GPUs: {result['held']} devices held by {result['holders']} servers "
        f"({result['held_as_shares']} as shares); set up in {result['setup_s']} s"
    )
    print(
        f"  {'operation':28} {'runs':>5} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'lag ms':>9} {'gc':>3}"
        f" {'max w/o gc':>10}"
    )
    for name, r in result["ops"].items():
        lag = f"{r['lag_max_ms']:9.2f}" if "lag_max_ms" in r else f"{'':9}"
        print(
            f"  {name:28} {r['runs']:5} {r['p50_ms']:9.3f} {r['p99_ms']:9.3f} {r['max_ms']:9.3f} {lag}"
            f" {r['runs_with_gc']:3} {r['max_without_gc_ms']:10.3f}"
        )
    print("  bytes: " + ", ".join(f"{k} {v:,}" for k, v in result["bytes"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
