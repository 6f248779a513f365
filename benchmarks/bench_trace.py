"""Placement quality on a production trace: Alibaba's OpenB GPU-sharing trace,
replayed through the real allocator as the published experiment does.

    python -m benchmarks.bench_trace --trace ../shared/traces/openb                  # default list, 10 seeds
    python -m benchmarks.bench_trace --trace ../shared/traces/openb --list gpushare40 --seeds 3
    python -m benchmarks.bench_trace --trace ../shared/traces/openb --policies pack --json
    python -m benchmarks.bench_trace --trace ../shared/traces/openb --departures --seeds 3  # servers end, requests wait

The trace (``openb_node_list_gpu_node.csv``, ``openb_pod_list_LIST.csv``) is read
from the folder given; it comes from the repository alibaba/clusterdata,
``cluster-trace-gpu-v2023``, published with *Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent* (Weng et al., USENIX
ATC 2023). The published figures printed beside ours are that paper's, as the
trace's README gives them.

The experiment (as published): 1,213 GPU nodes with their CPU and memory; the
task list shuffled with a seed, then tasks drawn at random with replacement from
it appended until the GPU request reaches 130 % of the cluster's GPUs (a list
that asks for more is thinned at random instead); tasks arrive one at a time and
never leave; one that fits nowhere is dropped. A task asks for CPU (thousandths)
and memory, and 0 GPUs, a share of one GPU (thousandths), or 1-8 whole GPUs,
of any model or of one of those its ``gpu_spec`` names: an allocator
``Request`` with ``cpu_milli``, ``memory_mib`` and ``count=0`` / ``milli`` /
``count``, ``models`` from ``gpu_spec``. Every model may be shared in
thousandths, on one device.

Printed per policy (means over the seeds): unallocated GPU % (100 − 100 ×
allocated thousandths / all the cluster's) when the arrived GPU request is 80,
90, 95, 100, 110 and 130 % of the cluster; the fragmentation rate at 100 % (the
README's definition: for each node and each typical task, the most frequent
task shapes covering 95 % of the tasks weighted by frequency, the node's free
GPU that this task could not use; divided by all free GPU); tasks dropped; and
the time per decision (p50, p99 over all decisions of all seeds, each timed
alone with ``perf_counter_ns``).

With ``--departures`` (the life of a hub) servers end and requests wait. The trace's own
times cannot drive that (replayed, they load the cluster to 0.2 % on average), so each
server's duration is drawn from the list's ``deletion_time - scheduled_time`` (default list:
mean 8.0 h, median 10 min), and requests, in the published order until they ask for
``--span`` times the cluster's GPUs, arrive as a Poisson process at the rate that asks for
``--load`` of the GPUs on average. The span starts in that steady state (:func:`draw`):
a few very long servers carry most of the load, and from an empty cluster a span of a day
would never reach it. A request that finds no room waits in the line of its models and
gives up after an exponential patience of mean ``--patience`` minutes (:func:`live`).
Printed per policy (default pack, spread, frag), on the same requests: GPU-hours served
within the span (% of those asked), mean GPU use, waits of the served, give-ups, and the
time per decision.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import heapq
import itertools
import json
import platform
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpuspawner.allocator.allocator import Allocation, AllocationRefused, Allocator, Refusal, Request
from gpuspawner.allocator.fragment import Mix, Placed, Shape
from gpuspawner.allocator.records import accepted
from gpuspawner.core.inventory import GPU
from gpuspawner.core.sharing import UNIT
from gpuspawner.plan.backfill import Round, planned_start

ARRIVED = (80, 90, 95, 100, 110, 130)  # % of the cluster's GPUs asked for so far
# Published unallocated GPU % at 100 % arrived (mean of 10 seeds), by policy, per list.
PUBLISHED_LISTS = (
    "default gpushare40 gpushare60 gpushare80 gpushare100 multigpu20 multigpu30 multigpu50 cpu050 cpu100 cpu250"
).split()
PUBLISHED = {
    "Random": (13.70, 15.14, 17.19, 19.38, 21.10, 13.08, 13.37, 18.72, 10.98, 12.56, 20.00),
    "DotProd": (9.38, 10.70, 13.18, 15.86, 18.02, 8.15, 6.89, 5.27, 6.97, 8.27, 16.43),
    "GPU clustering": (8.35, 10.24, 13.10, 15.50, 17.78, 6.66, 5.45, 4.31, 6.48, 7.59, 12.25),
    "GPU packing": (8.22, 10.23, 12.85, 15.35, 17.87, 6.50, 5.30, 3.94, 6.54, 7.50, 11.95),
    "Best fit": (7.14, 8.56, 10.94, 13.34, 15.38, 6.27, 5.43, 4.38, 6.44, 6.74, 8.79),
    "FGD (the paper's)": (4.77, 6.04, 8.75, 10.92, 13.36, 4.47, 3.64, 2.91, 5.00, 4.79, 6.80),
}
# The default list along the curve (median of 10 seeds), at ARRIVED.
PUBLISHED_CURVE = {
    "FGD (the paper's)": (19.99, 10.00, 5.09, 4.77, 4.68, 4.60),
    "Best fit": (19.99, 9.99, 7.14, 7.09, 7.02, 6.89),
    "GPU packing": (19.99, 10.00, 8.24, 8.19, 8.12, 7.94),
}


@dataclass(frozen=True)
class Task:
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    spec: tuple[str, ...]  # models it accepts; empty: any

    @property
    def gpu_request(self) -> int:
        """GPU thousandths asked for."""
        return self.num_gpu * self.gpu_milli

    def request(self) -> Request:
        models = self.spec or None
        asked = {"cpu_milli": self.cpu_milli, "memory_mib": self.memory_mib, "models": models}
        if self.num_gpu == 0:
            return Request(count=0, **asked)
        if self.gpu_milli < UNIT:
            return Request(milli=self.gpu_milli, **asked)
        return Request(count=self.num_gpu, **asked)


@dataclass(frozen=True)
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


def read_nodes(folder: Path) -> list[Node]:
    with open(folder / "openb_node_list_gpu_node.csv", newline="") as f:
        return [
            Node(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"]), r["model"])
            for r in csv.DictReader(f)
        ]


def read_tasks(folder: Path, name: str) -> list[Task]:
    with open(folder / f"openb_pod_list_{name}.csv", newline="") as f:
        return [
            Task(
                int(r["cpu_milli"]),
                int(r["memory_mib"]),
                int(r["num_gpu"]),
                int(r["gpu_milli"]),
                tuple(m for m in (r.get("gpu_spec") or "").split("|") if m),  # multigpu lists have no such column
            )
            for r in csv.DictReader(f)
        ]


def arrivals(tasks: list[Task], capacity: int, seed: int, upto: float = 1.3) -> list[Task]:
    """The published order: shuffled, then resampled with replacement up to ``upto``
    of the cluster's GPUs (a list asking for more is thinned at random instead)."""
    rng = random.Random(seed)
    order = list(tasks)
    rng.shuffle(order)
    asked = sum(t.gpu_request for t in order)
    while asked > upto * capacity:
        asked -= order.pop(rng.randrange(len(order))).gpu_request
    while asked < upto * capacity:
        t = rng.choice(tasks)
        order.append(t)
        asked += t.gpu_request
    return order


def build(nodes: list[Node], policy: str, shapes: list[tuple[Task, float]] | None = None) -> Allocator:
    """The cluster as an allocator; ``shapes``: the mix the frag policy is given (the
    typical task shapes, as the published FGD is given the task distribution; None: no
    mix, as a hub starts that learns its own, :class:`Learning`)."""
    gpus = [GPU(n.name, i, f"{n.name}-gpu{i}", n.model, 0) for n in nodes for i in range(n.gpus)]
    models = sorted({n.model for n in nodes})
    alloc = Allocator(gpus, policy, {m: {"quantum": 0.001} for m in models})
    for n in nodes:
        alloc.set_host_resources(n.name, n.cpu_milli, n.memory_mib)
    if shapes:
        alloc.set_mix(Mix(shape_of(t, w) for t, w in shapes))
    return alloc


def shape_of(task: Task, weight: float) -> Shape:
    milli = task.gpu_milli if task.num_gpu == 1 and task.gpu_milli < UNIT else UNIT
    return Shape(task.num_gpu, milli, task.cpu_milli, task.memory_mib, frozenset(task.spec) or None, weight)


def typical(tasks: list[Task], cover: float = 0.95) -> list[tuple[Task, float]]:
    """The most frequent task shapes that cover ``cover`` of the tasks, with their weights."""
    counts = Counter(tasks).most_common()
    chosen, seen = [], 0
    for task, n in counts:
        if seen >= cover * len(tasks):
            break
        chosen.append((task, n))
        seen += n
    total = sum(n for _, n in chosen)
    return [(t, n / total) for t, n in chosen]


def fragmentation(alloc: Allocator, nodes: list[Node], shapes: list[tuple[Task, float]]) -> float:
    """Fragmented free GPU / all free GPU, the README's definition (see the module's doc)."""
    fragmented = free_all = 0.0
    for n in nodes:
        free = [UNIT - sum(alloc.booked_on(f"{n.name}-gpu{i}").values()) for i in range(n.gpus)]
        total = sum(free)
        if not total:
            continue
        free_all += total
        cpu, mem = alloc.resources.free(n.name) or (0, 0)
        for task, weight in shapes:
            fragmented += weight * _unusable(task, n.model, free, total, cpu, mem)
    return fragmented / free_all if free_all else 0.0


def _unusable(task: Task, model: str, free: list[int], total: int, cpu: int, mem: int) -> int:
    """The node's free GPU (thousandths) that ``task`` could not use."""
    if task.num_gpu == 0 or task.cpu_milli > cpu or task.memory_mib > mem or (task.spec and model not in task.spec):
        return total  # it uses no GPU, or cannot run here at all
    if task.gpu_milli < UNIT:
        if max(free) < task.gpu_milli:
            return total
        return sum(f for f in free if f < task.gpu_milli)
    if sum(1 for f in free if f == UNIT) < task.num_gpu:
        return total
    return sum(f for f in free if f < UNIT)


MIXES = ("learned", "shapes", "none")  # --mix: what the frag policy places by
ENDS = ("unknown", "known")  # --ends: whether the plan knows when each server ends


class Learning:
    """The mix a hub learns by itself (``gpuspawner.hub.app``'s ``_learn_mix``), online: it
    starts from no mix and, every ``every`` requests (the requests that arrive in the hub's
    ``LEARN_SECONDS``, :func:`learn_every`), sets the allocator's mix to what the product's
    own pure function (``Mix.learned``) makes of the servers placed so far, as the ledger
    records them: those with GPUs only, each with the model and thousandths it got, the CPU
    and memory it reserved and the models its request accepted; and, as the hub does, sooner
    while they are few: once as many were placed since as it was learned from
    (:func:`doubled`). (The hub reads the last ``LEARN_DAYS``, 14; a replay is shorter, so
    every server placed counts.)"""

    def __init__(self, alloc: Allocator, every: int):
        if every < 1:
            raise ValueError(f"the mix is learned every N requests, N ≥ 1, got {every}")
        self.alloc, self.every = alloc, every
        self.placed: list[Placed] = []
        self.asked = 0  # requests so far
        self.learned = 0  # times the mix was learned
        self.learned_from = 0  # servers placed when it was last learned
        self.since = 0  # requests since then

    def asked_for(self, got: Allocation | None) -> None:
        """One request, placed (``got``) or not; the mix learned again when it is due."""
        if got is not None and got.devices:
            self.placed.append(Placed(got.model, got.milli, got.cpu_milli, got.memory_mib, got.accepts))
        self.asked += 1
        self.since += 1
        if self.since >= self.every or doubled(len(self.placed), self.learned_from):
            self.alloc.set_mix(Mix.learned(self.placed))
            self.learned += 1
            self.learned_from, self.since = len(self.placed), 0


def doubled(placed: int, learned_from: int) -> bool:
    """Whether the mix is due again before the hour, as the hub's ``_learn_mix`` has it: as
    many servers placed since it was learned as it was learned from."""
    return placed - learned_from >= max(1, learned_from)


def learn_every(folder: Path, name: str, tasks: list[Task], capacity: int, load: float = 0.9) -> int:
    """The requests that arrive within the hub's ``LEARN_SECONDS`` (an hour) at the rate of
    the departures mode (:func:`draw`) at ``load`` (its default): a hub this busy learns its
    mix again after that many. The durations are the list's, or where it has none (the
    multigpu lists) the default list's; 1,000 where neither has them."""
    from gpuspawner.hub.app import LEARN_SECONDS  # (the hub's modules: imported only for the learned mix)

    durations = read_durations(folder, name)
    if not durations and (folder / "openb_pod_list_default.csv").is_file():
        durations = read_durations(folder, "default")
    if not durations:
        return 1000
    rate = load * capacity / (statistics.mean(t.gpu_request for t in tasks) * statistics.mean(durations))
    return max(1, round(rate * LEARN_SECONDS))


def replay(
    nodes: list[Node], tasks: list[Task], policy: str, seed: int, shapes, mix: str = "shapes", every: int = 1000
) -> dict:
    """One seed under ``policy``; ``shapes``: the typical task shapes (the fragmentation
    rate's, and the mix with ``mix="shapes"``); ``mix="learned"``: the mix learned online
    every ``every`` requests (:class:`Learning`); ``"none"``: no mix."""
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}; choose one of: {', '.join(MIXES)}")
    capacity = UNIT * sum(n.gpus for n in nodes)
    alloc = build(nodes, placement_of(policy)[0], shapes if mix == "shapes" else None)  # (no line: nobody waits)
    learning = Learning(alloc, every) if mix == "learned" else None
    marks = [p * capacity / 100 for p in ARRIVED]
    unallocated: list[float] = []
    times: list[int] = []
    asked = placed = dropped = 0
    frag = None
    for i, task in enumerate(arrivals(tasks, capacity, seed)):
        request = task.request()
        t0 = time.perf_counter_ns()
        try:
            got = alloc.allocate(f"t{i}", request)
        except AllocationRefused:
            got = None
        times.append(time.perf_counter_ns() - t0)
        if got is None:
            dropped += 1
        else:
            placed += got.total_milli
        if learning is not None:
            learning.asked_for(got)
        asked += task.gpu_request
        while len(unallocated) < len(marks) and asked >= marks[len(unallocated)]:
            unallocated.append(100 - 100 * placed / capacity)
            if ARRIVED[len(unallocated) - 1] == 100:
                frag = fragmentation(alloc, nodes, shapes)
    out = {"unallocated": unallocated, "fragmentation": frag, "dropped": dropped, "times_ns": times}
    if learning is not None:
        out["learned"] = learning.learned
        out["learned_shapes"] = 0 if alloc.mix is None else len(alloc.mix.shapes)
    return out


def shares_packed_offline(order: list[Task], capacity: int) -> float:
    """GPU % left unused on the devices that the shares arrived by 100 % take when packed
    knowing them all in advance: by size, largest first, each on the device with the least
    room that takes it (best-fit decreasing; no CPU or memory). Context for the online
    figures: at 100 % arrived, a placement that leaves less unallocated has to leave some
    share out. Not a proven floor (an optimal packing can do slightly better)."""
    asked, shares = 0, []
    for t in order:
        asked += t.gpu_request
        if asked > capacity:
            break
        if t.num_gpu == 1 and t.gpu_milli < UNIT:
            shares.append(t.gpu_milli)
    rooms: list[int] = []  # sorted
    for milli in sorted(shares, reverse=True):
        i = bisect.bisect_left(rooms, milli)
        if i < len(rooms):
            room = rooms.pop(i)
        else:
            room = UNIT
        bisect.insort(rooms, room - milli)
    return 100 * sum(rooms) / capacity


def run(
    folder: Path, name: str, policies: list[str], seeds: int, mix: str = "shapes", every: int | None = None
) -> dict:
    """The static replay of ``seeds`` seeds per policy; ``mix``: what frag places by (see
    :func:`replay`), learned every ``every`` requests (None: :func:`learn_every`)."""
    nodes, tasks = read_nodes(folder), read_tasks(folder, name)
    shapes = typical(tasks)
    out: dict = {
        "list": name,
        "nodes": len(nodes),
        "gpus": sum(n.gpus for n in nodes),
        "tasks": len(tasks),
        "seeds": seeds,
        "mix": mix,
        "python": platform.python_version(),
        "policies": {},
    }
    capacity = UNIT * out["gpus"]
    if mix == "learned":
        out["learn_every"] = every = every or learn_every(folder, name, tasks, capacity)
    out["shares_offline"] = round(
        statistics.mean(shares_packed_offline(arrivals(tasks, capacity, seed), capacity) for seed in range(seeds)), 2
    )
    for policy in policies:
        runs = [replay(nodes, tasks, policy, seed, shapes, mix, every or 1) for seed in range(seeds)]
        out["policies"][policy] = {
            "unallocated": [round(statistics.mean(r["unallocated"][k] for r in runs), 2) for k in range(len(ARRIVED))],
            "unallocated_median": [
                round(statistics.median(r["unallocated"][k] for r in runs), 2) for k in range(len(ARRIVED))
            ],
            "fragmentation": round(100 * statistics.mean(r["fragmentation"] for r in runs), 2),
            "dropped": round(statistics.mean(r["dropped"] for r in runs)),
            **decision_times([t for r in runs for t in r["times_ns"]]),
        }
        if mix == "learned":  # how often, and into how many kinds, the mix was learned (the last time)
            out["policies"][policy]["learned"] = round(statistics.mean(r["learned"] for r in runs), 1)
            out["policies"][policy]["learned_shapes"] = round(statistics.mean(r["learned_shapes"] for r in runs), 1)
    return out


def mix_line(result: dict) -> str:
    """What frag placed by, in one line (above the static table)."""
    if result["mix"] == "shapes":
        return "frag's mix: the list's typical task shapes, given (--mix shapes)"
    if result["mix"] == "none":
        return "frag's mix: none (--mix none): frag places as pack"
    return (
        f"frag's mix: learned online as the hub learns it (--mix learned), from no mix, again every "
        f"{result['learn_every']} requests (an hour of a hub this busy)"
    )


def percentile(xs: list, q: float) -> float:
    """The ``q`` quantile of ``xs`` (sorted or not), 0 when there is none."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else 0


def decision_times(times_ns: list[int]) -> dict:
    """p50 and p99 of the decisions' times, in µs, and how many there were."""
    return {
        "decision_us_p50": round(percentile(times_ns, 0.5) / 1000, 1),
        "decision_us_p99": round(percentile(times_ns, 0.99) / 1000, 1),
        "decisions": len(times_ns),
    }


def table(result: dict) -> str:
    head = "policy".ljust(20) + "".join(f"{p:>7}%" for p in ARRIVED) + "   frag %  dropped  p50 µs  p99 µs"
    lines = [
        f"OpenB list {result['list']}: {result['nodes']} nodes, {result['gpus']} GPUs, {result['tasks']} tasks, "
        f"{result['seeds']} seeds (means), Python {result['python']}",
        "Unallocated GPU % when the arrived GPU request is this much of the cluster:",
        head,
    ]
    for policy, r in result["policies"].items():
        lines.append(
            f"gpuspawner {policy}".ljust(20)
            + "".join(f"{u:8.2f}" for u in r["unallocated"])
            + f"   {r['fragmentation']:6.2f}  {r['dropped']:7d}  {r['decision_us_p50']:6.1f}  {r['decision_us_p99']:6.1f}"
        )
    lines.append(
        f"The shares arrived by 100 %, packed offline (best-fit decreasing), leave {result['shares_offline']:.2f} % "
        "of the GPUs unused"
    )
    if result["list"] in PUBLISHED_LISTS:
        k = PUBLISHED_LISTS.index(result["list"])
        lines.append("Published (Weng et al., ATC 2023), at 100 %:")
        for policy, row in PUBLISHED.items():
            curve = PUBLISHED_CURVE.get(policy) if result["list"] == "default" else None
            cells = "".join(f"{u:8.2f}" for u in curve) if curve else " " * 24 + f"{row[k]:8.2f}" + " " * 16
            lines.append(policy.ljust(20) + cells)
        if result["list"] == "default":
            lines.append("(the published curve of the default list is the median of 10 seeds; 100 % there is FGD 4.77)")
    return "\n".join(lines)


# -- with departures (--departures) ---------------------------------------------


def read_durations(folder: Path, name: str) -> list[int]:
    """How long the list's tasks ran (``deletion_time - scheduled_time``, s), of those that have
    both times (a task still pending has no ``scheduled_time``); empty for a list without them."""
    with open(folder / f"openb_pod_list_{name}.csv", newline="") as f:
        times = [(r.get("scheduled_time"), r.get("deletion_time")) for r in csv.DictReader(f)]
    return [int(end) - int(start) for start, end in times if start and end and int(end) > int(start)]


@dataclass(frozen=True)
class Ask:
    """A server of the departures mode: a request, or one already running when the span starts."""

    id: int
    task: Task
    at: float  # s after the span's start that it asks (0: already running then)
    duration: float  # s it runs once placed (already running: what is left of it)
    patience: float  # s it waits in line before it gives up


@dataclass(frozen=True)
class Draws:
    """What one seed draws, the same for every policy."""

    running: list[Ask]  # already running when the span starts
    asks: list[Ask]  # the requests, in the order they come
    span: float  # s, until the last request


def draw(
    tasks: list[Task], durations: list[int], capacity: int, seed: int, load: float, patience: float, upto: float
) -> Draws:
    """Requests in the published order (:func:`arrivals`, up to ``upto`` of the cluster's GPUs),
    arriving as a Poisson process at the rate that asks for ``load`` of the cluster's GPUs on
    average, each with a duration drawn from ``durations`` and an exponential patience of mean
    ``patience`` s. And the servers already running when the span starts, as the steady state
    of those arrivals has them: as many as that load keeps running on average, a task drawn
    from the list, a duration drawn in proportion to its length (a long server is more likely
    to be running at a given moment) and a uniform part of it left."""
    rng = random.Random(f"departures {seed}")
    mean_gpu = statistics.mean(t.gpu_request for t in tasks)
    mean_duration = statistics.mean(durations)
    rate = load * capacity / (mean_gpu * mean_duration)  # requests per s
    lengths = rng.choices(durations, weights=durations, k=round(rate * mean_duration))
    running = [Ask(i, rng.choice(tasks), 0.0, d * rng.random(), 0.0) for i, d in enumerate(lengths)]
    asks, at = [], 0.0
    for i, task in enumerate(arrivals(tasks, capacity, seed, upto), len(running)):
        at += rng.expovariate(rate)
        asks.append(Ask(i, task, at, rng.choice(durations), rng.expovariate(1 / patience)))
    return Draws(running, asks, at)


@dataclass
class Life:
    """One policy's span over one seed's draws."""

    running: list[tuple[Ask, Allocation]] = field(default_factory=list)  # placed at the start
    left_out: list[Ask] = field(default_factory=list)  # running at the start, but fit nowhere
    served: list[tuple[Ask, float, Allocation]] = field(default_factory=list)  # (ask, start, what), as placed
    gave_up: list[tuple[Ask, float]] = field(default_factory=list)  # (ask, when)
    waiting: list[Ask] = field(default_factory=list)  # still in line when the span ends
    refused: set[int] = field(default_factory=set)  # the requests refused at least once
    gpu_seconds: float = 0.0  # allocated GPU thousandths × s, over the span
    idle_fit_seconds: float = 0.0  # free GPU thousandths × s that a waiter could have used then
    kept_from: dict[int, frozenset[str]] = field(default_factory=dict)  # served -> the hosts kept from it then
    head_plans: dict[int, float | None] = field(default_factory=dict)  # ask -> its planned start once first in line
    late: list[tuple[Ask, float, float]] = field(default_factory=list)  # (ask, planned start, start): started later
    times_ns: list[int] = field(default_factory=list)  # each decision of the span


IDLE_SAMPLE_SECONDS = 300.0  # how often the GPUs idle while a waiter fits them are counted

#: --policies names beside the allocator's: the product as configured by default (its
#: placement policy, the line's backfill) and today's ``pack`` in strict order.
DEFAULT_POLICY, STRICT_POLICY = "default", "strict"


def placement_of(policy: str) -> tuple[str, bool]:
    """(the allocator's policy, whether the line backfills) for a --policies name: an
    allocator policy runs with the product's default line (backfill)."""
    from gpuspawner.hub.settings import GPUSettings  # the product's defaults, as a site gets them

    if policy == DEFAULT_POLICY:
        return GPUSettings.allocation_policy.default_value, GPUSettings.gpu_line_backfill.default_value
    if policy == STRICT_POLICY:
        return "pack", False
    return policy, True


def live(
    nodes: list[Node],
    draws: Draws,
    policy: str,
    shapes: list[tuple[Task, float]],
    mix: str = "shapes",
    ends: str = "unknown",
) -> Life:
    """The span under one policy. Those running at the start are placed first, one at a time
    (one that fits nowhere is left out, as in the published experiment); then events in time
    order: a request is placed, or waits in line, or, a CPU-only task or one that can never be
    met, gives up at once; a server ends after its duration; a waiter gives up after its
    patience. Whenever a server ends or a waiter gives up, the line is served as the product
    serves it (:class:`gpuspawner.plan.backfill.Round`): in order, each waiter placed on the
    hosts not kept for those ahead, one not served keeping its planned host; a new request is
    placed only on hosts the line keeps for nobody (one line for all models: a task may
    accept several, and a host kept for a waiter of another model is one its requests could
    never use anyway). In strict order (``strict``), as the product's line per model: a
    request never goes ahead of one that came before it and still waits for any of its
    models, and each waiter is tried unless one before it that shares a model still waits;
    requests for other models are not held up. The GPUs that waiters could use now (each
    waiter tried in order, as if the line were not there) count as idle while a waiter they
    fit waits: sampled after an event at most every :data:`IDLE_SAMPLE_SECONDS` (trying every
    waiter after every event would cost more than the span), and none while nobody waits.

    ``mix``: what frag places by: ``shapes``, the list's typical shapes; ``learned``, what
    the hub learns by itself (``Mix.learned`` of the servers placed so far, those running
    at the start included, as a hub in that steady state has them in its ledger: learned
    once they are placed, then every ``LEARN_SECONDS`` of the span); ``none``, no mix.

    ``ends``: ``known``, the plan knows when each server ends (as a held-time limit that
    every server reaches exactly): it plans each waiter's start, a request that ends
    before a waiter's planned start may use the host kept for it (the EASY rule), and
    each waiter's planned start when it first heads the line is kept to compare with
    when it starts (``Life.late``); ``unknown``, as a hub whose servers have no limit."""
    from gpuspawner.hub.app import LEARN_SECONDS

    if ends not in ENDS:
        raise ValueError(f"unknown ends {ends!r}; choose one of: {', '.join(ENDS)}")

    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}; choose one of: {', '.join(MIXES)}")
    placement, backfill = placement_of(policy)
    alloc = build(nodes, placement, shapes if mix == "shapes" else None)
    placed: list[Placed] = []  # what the ledger has, for the learned mix
    learned_at = 0.0
    life = Life()
    events: list[tuple[float, int, str, Ask]] = []
    order = itertools.count()  # at the same time: in the order pushed
    line: dict[int, Ask] = {}  # those waiting, in the order they came
    every = frozenset(n.model for n in nodes)
    allocated = 0  # GPU thousandths held now
    idle_fit = 0  # GPU thousandths free that waiters could use now (as last sampled)
    sampled = -IDLE_SAMPLE_SECONDS
    last = 0.0

    end_at: dict[str, float] = {}  # holder -> when it ends
    clock = 0.0  # the event's time, for the plan's starts

    def start(ask: Ask, now: float, got: Allocation) -> None:
        nonlocal allocated
        allocated += got.total_milli
        end_at[str(ask.id)] = now + ask.duration
        heapq.heappush(events, (now + ask.duration, next(order), "end", ask))

    def start_here(request: Request, host: str):
        devices = alloc.host_devices(host, accepted(request) or None)
        return planned_start(request, devices, lambda h: end_at[h] - clock, alloc.host_room(host))

    # Each waiter's host in the latest plan of the line (a serving's, a new request's or
    # the head's), which it keeps unless another starts it sooner, as the hub's line does.
    last_plan: dict[int, str | None] = {}

    def new_round() -> Round:
        return Round(
            alloc.planner(), starts=start_here if ends == "known" else None, before=last_plan, could=alloc.could_take
        )

    def planned(p: Round) -> Round:
        last_plan.update(p.planned)
        return p

    def lasts(ask: Ask) -> float | None:
        return ask.duration if ends == "known" else None

    def note_head(now: float) -> None:
        """The first in line: its planned start, the first time it is first."""
        head = next(iter(line.values()), None)
        if head is None or head.id in life.head_plans or not backfill:
            return
        p = new_round()
        p.wait(head.id, head.task.request())
        s = planned(p).start_of(head.id)
        life.head_plans[head.id] = None if s is None else now + s[0]

    def place(ask: Ask, now: float, avoid: frozenset[str]) -> AllocationRefused | None:
        t0 = time.perf_counter_ns()
        try:
            got = alloc.allocate(str(ask.id), replace(ask.task.request(), avoid=avoid))
        except AllocationRefused as exc:
            life.refused.add(ask.id)
            return exc
        finally:
            life.times_ns.append(time.perf_counter_ns() - t0)
        life.served.append((ask, now, got))
        life.kept_from[ask.id] = avoid
        planned = life.head_plans.get(ask.id)
        if planned is not None and now > planned + 1e-6:
            life.late.append((ask, planned, now))
        record(got)
        start(ask, now, got)
        return None

    def record(got: Allocation) -> None:
        if mix == "learned" and got.devices:
            placed.append(Placed(got.model, got.milli, got.cpu_milli, got.memory_mib, got.accepts))

    def join(ask: Ask, now: float) -> None:
        line[ask.id] = ask
        heapq.heappush(events, (now + ask.patience, next(order), "give up", ask))

    def models_of(task: Task) -> frozenset[str]:
        return frozenset(task.spec) or every

    def kept(new: Ask) -> frozenset[str] | None:
        """Where ``new`` may not go: every waiter's planned host (strict: None,
        nowhere, when someone waits for one of its models)."""
        p = new_round()
        for ask in line.values():
            p.wait(ask.id, ask.task.request())
        return planned(p).avoid(lasts(new))

    def arrive(ask: Ask, now: float) -> None:
        if ask.task.num_gpu == 0:  # a CPU-only task never waits, nor goes where a waiter is planned
            if place(ask, now, (kept(ask) or frozenset()) if line and backfill else frozenset()) is not None:
                life.gave_up.append((ask, now))
            return
        if not line:
            avoid: frozenset[str] | None = frozenset()
        elif backfill:
            avoid = kept(ask)
        else:
            models = models_of(ask.task)
            avoid = None if any(models & models_of(a.task) for a in line.values()) else frozenset()
        refused = None if avoid is None else place(ask, now, avoid)
        if avoid is not None and refused is None:
            return
        if refused is None or refused.retry:
            join(ask, now)
        else:  # it can never be met
            life.gave_up.append((ask, now))

    def serve(now: float) -> None:
        p = new_round()
        blocked: set[str] = set()  # strict: the models someone earlier still waits for
        for ask in list(line.values()):
            if backfill:
                refused = place(ask, now, p.avoid(lasts(ask)) or frozenset())
            else:
                models = models_of(ask.task)
                refused = (
                    place(ask, now, frozenset()) if not blocked & models else AllocationRefused("", Refusal.NONE_FREE)
                )
            if refused is None:
                del line[ask.id]
            elif backfill:
                p.wait(ask.id, ask.task.request())
            else:
                blocked |= models
                if blocked >= every:
                    return
        planned(p)

    def fitting() -> int:
        """GPU thousandths free that the waiters, tried in order, could take now."""
        taken, failed = [], set()
        for ask in line.values():
            shape = (ask.task.num_gpu, ask.task.gpu_milli, ask.task.cpu_milli, ask.task.memory_mib, ask.task.spec)
            if shape in failed:
                continue  # the same shape did not fit with more room free
            try:
                taken.append(alloc.allocate(f"trial {ask.id}", ask.task.request()))
            except AllocationRefused:
                failed.add(shape)
        for got in taken:
            alloc.release(got.holder)
        return sum(got.total_milli for got in taken)

    for ask in draws.running:
        try:
            got = alloc.allocate(str(ask.id), ask.task.request())
        except AllocationRefused:
            life.left_out.append(ask)
            continue
        life.running.append((ask, got))
        record(got)
        start(ask, 0.0, got)
    learned_from = len(placed)
    if mix == "learned":
        alloc.set_mix(Mix.learned(placed))
    for ask in draws.asks:
        heapq.heappush(events, (ask.at, next(order), "arrive", ask))
    while events and events[0][0] <= draws.span:
        now, _, kind, ask = heapq.heappop(events)
        if mix == "learned" and (now - learned_at >= LEARN_SECONDS or doubled(len(placed), learned_from)):
            alloc.set_mix(Mix.learned(placed))
            learned_at, learned_from = now, len(placed)
        life.gpu_seconds += allocated * (now - last)
        life.idle_fit_seconds += idle_fit * (now - last)
        last = clock = now
        if kind == "arrive":
            arrive(ask, now)
        elif kind == "end":
            allocated -= alloc.release(str(ask.id)).total_milli  # type: ignore[union-attr]
            del end_at[str(ask.id)]
            serve(now)
        elif ask.id in line:  # its patience ran out
            del line[ask.id]
            life.gave_up.append((ask, now))
            serve(now)
        else:
            continue  # served before its patience ran out: nothing changed
        note_head(now)
        if not line:
            idle_fit = 0
        elif now - sampled >= IDLE_SAMPLE_SECONDS:
            idle_fit, sampled = fitting(), now
    life.gpu_seconds += allocated * (draws.span - last)
    life.idle_fit_seconds += idle_fit * (draws.span - last)
    life.waiting = list(line.values())
    return life


def in_span(ask: Ask, start: float, span: float) -> float:
    """GPU thousandths × s that ``ask`` holds within the span when placed at ``start``."""
    return ask.task.gpu_request * max(0.0, min(ask.duration, span - start))


def figures(runs: list[tuple[Draws, Life]], capacity: int) -> dict:
    """One policy's figures over the seeds: GPU-hours within the span (asked: from each
    request's arrival, served: from its start), waits of the served (minutes), give-ups."""
    asked = served = lost = 0.0
    waits: list[float] = []
    times: list[int] = []
    requests = gave_up = 0
    for draws, life in runs:
        asked += sum(in_span(a, a.at, draws.span) for a in draws.asks)
        served += sum(in_span(a, at, draws.span) for a, at, _ in life.served)
        lost += sum(in_span(a, a.at, draws.span) for a, _ in life.gave_up)
        waits += [(at - a.at) / 60 for a, at, _ in life.served]
        times += life.times_ns
        requests += len(draws.asks)
        gave_up += len(life.gave_up)
    seeds = len(runs)
    return {
        "served_gpu_h_pct": round(100 * served / asked, 2),
        "gpu_use_pct": round(statistics.mean(100 * life.gpu_seconds / (capacity * d.span) for d, life in runs), 2),
        "idle_fit_pct": round(
            statistics.mean(100 * life.idle_fit_seconds / (capacity * d.span) for d, life in runs), 3
        ),
        "held_at_start_pct": round(
            statistics.mean(100 * sum(g.total_milli for _, g in life.running) / capacity for _, life in runs), 2
        ),
        "left_out_at_start": round(statistics.mean(len(life.left_out) for _, life in runs), 1),
        "wait_min_p50": round(percentile(waits, 0.5), 2),
        "wait_min_p95": round(percentile(waits, 0.95), 2),
        "served": round(sum(len(life.served) for _, life in runs) / seeds, 1),
        "gave_up": round(gave_up / seeds, 1),
        "gave_up_pct": round(100 * gave_up / requests, 2),
        "gave_up_gpu_h_pct": round(100 * lost / asked, 2),
        "still_waiting": round(sum(len(life.waiting) for _, life in runs) / seeds, 1),
        "refused": round(sum(len(life.refused) for _, life in runs) / seeds, 1),
        "planned_heads": sum(sum(p is not None for p in life.head_plans.values()) for _, life in runs),
        "late": sum(len(life.late) for _, life in runs),
        "late_min_max": round(max((s - p for _, life in runs for _, p, s in life.late), default=0.0) / 60, 1),
        **decision_times(times),
    }


def run_departures(
    folder: Path,
    name: str,
    policies: list[str],
    seeds: int,
    load: float,
    patience_min: float,
    upto: float,
    mix: str = "shapes",
    ends: str = "unknown",
) -> dict:
    nodes, tasks, durations = read_nodes(folder), read_tasks(folder, name), read_durations(folder, name)
    shapes = typical(tasks)
    capacity = UNIT * sum(n.gpus for n in nodes)
    draws = [draw(tasks, durations, capacity, seed, load, 60 * patience_min, upto) for seed in range(seeds)]
    offered = [
        sum(in_span(a, a.at, d.span) for a in d.running + d.asks) / (capacity * d.span) for d in draws
    ]  # the running ones: from the start
    return {
        "mode": "departures",
        "list": name,
        "mix": mix,
        "ends": ends,
        "nodes": len(nodes),
        "gpus": capacity // UNIT,
        "tasks": len(tasks),
        "durations": len(durations),
        "duration_h_mean": round(statistics.mean(durations) / 3600, 2),
        "duration_min_median": round(statistics.median(durations) / 60, 1),
        "seeds": seeds,
        "load": load,
        "patience_min": patience_min,
        "upto": upto,
        "requests": round(statistics.mean(len(d.asks) for d in draws)),
        "running_at_start": round(statistics.mean(len(d.running) for d in draws)),
        "span_h": round(statistics.mean(d.span for d in draws) / 3600, 1),
        "offered_pct": round(100 * statistics.mean(offered), 1),
        "python": platform.python_version(),
        "policies": {
            policy: figures([(d, live(nodes, d, policy, shapes, mix, ends)) for d in draws], capacity)
            for policy in policies
        },
    }


def departures_table(result: dict) -> str:
    lines = [
        f"OpenB list {result['list']} with departures: {result['nodes']} nodes, {result['gpus']} GPUs; "
        f"{result['seeds']} seeds, Python {result['python']}; frag's mix: {result['mix']}; "
        f"the servers' ends: {result.get('ends', 'unknown')} to the plan",
        f"Durations drawn from {result['durations']} of the list's tasks (mean {result['duration_h_mean']} h, "
        f"median {result['duration_min_median']} min); Poisson arrivals for {result['load']:.0%} of the GPUs; "
        f"patience exponential, mean {result['patience_min']:g} min",
        f"Per seed: {result['running_at_start']} servers running at the start (the steady state), "
        f"{result['requests']} requests asking for {result['upto']:g} × the cluster's GPUs over "
        f"{result['span_h']} h; offered over the span: {result['offered_pct']} % of the GPUs",
        "served: GPU-hours within the span, % of those asked; use: mean allocated GPU %; at start: GPU % held "
        "once those running are placed; waits of the served (min); gave up: per seed, % of requests, "
        "% of asked GPU-hours; refused: requests refused at least once, per seed (who else waited was behind them); "
        "idle fit: GPU-hours free while a waiter they fit waited, % of the span's GPU-hours; "
        "late: waiters that started later than planned when first in line (of those planned), all seeds",
        f"{'policy':20}{'served %':>9}{'use %':>7}{'at start':>9}{'wait p50':>9}{'p95':>7}"
        f"{'gave up':>9}{'% req':>7}{'% GPU-h':>8}{'refused':>8}{'idle fit':>9}{'p50 µs':>8}{'p99 µs':>8}",
    ]
    for policy, r in result["policies"].items():
        lines.append(
            f"{'gpuspawner ' + policy:20}{r['served_gpu_h_pct']:9.2f}{r['gpu_use_pct']:7.2f}"
            f"{r['held_at_start_pct']:9.2f}{r['wait_min_p50']:9.2f}{r['wait_min_p95']:7.1f}"
            f"{r['gave_up']:9.1f}{r['gave_up_pct']:7.2f}{r['gave_up_gpu_h_pct']:8.2f}{r['refused']:8.1f}"
            f"{r['idle_fit_pct']:9.3f}{str(r['late']) + '/' + str(r['planned_heads']):>10}"
            f"{r['decision_us_p50']:8.1f}{r['decision_us_p99']:8.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", type=Path, required=True, help="the OpenB folder (its CSV files)")
    p.add_argument("--list", default="default", help="which task list: default, gpushare40, multigpu20, ...")
    p.add_argument(
        "--policies",
        help="comma-separated allocator policies, or default (the product as configured by default) or strict "
        "(pack in today's strict order); default: pack,spread; with --departures strict,default,frag",
    )
    p.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    p.add_argument(
        "--mix",
        choices=MIXES,
        help="what frag places by: learned (the default): the mix the hub learns by itself, online, from\n"
        "what was placed so far; shapes: the list's typical shapes, given; none: no mix.\n"
        "With --departures only shapes (as before)",
    )
    p.add_argument(
        "--learn-every",
        type=int,
        help="with --mix learned: requests between two learnings (default: those of an hour, see learn_every)",
    )
    p.add_argument("--departures", action="store_true", help="servers end, requests wait in line (see the doc)")
    p.add_argument(
        "--ends",
        choices=ENDS,
        default="unknown",
        help="with --departures: known, the plan knows when each server ends (its time limit,\n"
        "reached exactly) and plans starts; unknown (the default): no server has a limit",
    )
    p.add_argument("--load", type=float, default=0.9, help="with --departures: GPUs asked on average (default 0.9)")
    p.add_argument("--patience", type=float, default=30, help="with --departures: mean patience, min (default 30)")
    p.add_argument(
        "--span", type=float, default=3, help="with --departures: requests until they ask N × the GPUs (default 3)"
    )
    args = p.parse_args(argv)
    if not (args.trace / "openb_node_list_gpu_node.csv").is_file():
        print(f"{args.trace} has no openb_node_list_gpu_node.csv: give the OpenB trace's folder", file=sys.stderr)
        return 2
    if not (args.trace / f"openb_pod_list_{args.list}.csv").is_file():
        print(f"{args.trace} has no openb_pod_list_{args.list}.csv", file=sys.stderr)
        return 2
    if args.learn_every is not None and args.learn_every < 1:
        print("--learn-every must be 1 or more requests", file=sys.stderr)
        return 2
    if not args.departures:
        mix = args.mix or "learned"
        policies = (args.policies or "pack,spread").split(",")
        result = run(args.trace, args.list, policies, args.seeds, mix, args.learn_every)
        print(json.dumps(result) if args.json else f"{mix_line(result)}\n{table(result)}")
        return 0
    if not read_durations(args.trace, args.list):
        print(
            f"openb_pod_list_{args.list}.csv has no scheduled and deletion times to draw durations from",
            file=sys.stderr,
        )
        return 2
    t0 = time.perf_counter()
    policies = (args.policies or f"{STRICT_POLICY},{DEFAULT_POLICY},frag").split(",")
    mix = args.mix or "learned"
    result = run_departures(
        args.trace, args.list, policies, args.seeds, args.load, args.patience, args.span, mix, args.ends
    )
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result) if args.json else f"{departures_table(result)}\ntook {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
