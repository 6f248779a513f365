"""What it costs the hub to read what the swarm's other services reserve on each node.

    python -m benchmarks.bench_swarm_reads                              # 100 and 1,000 nodes, 8 services a node
    python -m benchmarks.bench_swarm_reads --nodes 1000 --services 8000  # one size
    python -m benchmarks.bench_swarm_reads --repeats 10 --json

Before a request that reserves CPU or memory is placed, the hub reads what the
services running on each node reserve there (``GPUCluster.read_reservations``, at
most once a second): ``Swarm.reservations`` lists every service and every task
whose desired state is running, sums the tasks' reservations per node and service,
and the cluster hands each node's figures to the allocator
(``Allocator.set_host_reserved``, once per node).

The swarm is :class:`tests.fakedocker.FakeDocker` (in memory) with N nodes (64 CPUs,
512 GiB, 8 GPUs each) and M services, each pinned to a node drawn at random, its one
task running. About 40 % are the hub's own GPU servers, built by the hub's own
``build_service`` (1 or 2 GPUs, ``gpuspawner.*`` labels, JupyterHub's environment;
three in four reserve 2-8 CPUs and 16-64 GiB), booked in the allocator as the hub's
rebuild books them; the others are services of other stacks, of which 55 % reserve
CPU, memory or both. The code timed is the hub's own (``GPUCluster``, ``Swarm``,
the allocator) over the fake, through a one-thread executor as the hub's Docker
client has. Timed, each ``--repeats`` times:

* read: one ``GPUCluster.read_reservations`` (its once-a-second gate reset before
  each). **The fake's cost is part of this figure**: its ``services()`` and
  ``tasks()`` build their answers by copying every service and task in Python, where
  a real client would wait for the daemon and decode its JSON;
* a spawn's wait: one ``read_reservations`` with figures read before but too old,
  timed until it returns (it waits for the read up to ``READ_WAIT``, then goes on
  with the last figures while the read finishes); and how long the hub keeps the
  figures (``reserved_max_age``: a second per 100 nodes, at least a second);
* the fake's part: its two list calls alone;
* the hub's part: ``Swarm.reservations`` over a client that hands back the same
  two lists ready-made (the thread hops and the summing per node and service),
  then the loop of ``set_host_reserved`` over every node, as ``read_reservations``
  runs it;
* decode: ``json.loads`` of the two answers as compact JSON (``json.dumps`` with
  ``,`` and ``:`` separators, whose lengths are the sizes shown): what docker-py
  does with the daemon's answers. The daemon's own time, HTTP, and the fields a real
  daemon adds that the fake leaves out (network attachments, platforms, image
  digests, version history) are not measured: the sizes are a lower bound;
* ``free()`` of every node: what the allocator's CPU and memory check reads back;
* the event loop: the longest a 1 ms timer on the loop was late during a read, and
  during that decode run in the client's executor thread (as docker-py would run it:
  ``json.loads`` keeps the GIL), each over a quarter as many repeats (at least 3);
* the read and the loop's lateness again with the garbage collector off: a read
  makes a copy of every service and task (as a decode would), enough objects to set
  off full collections, which stop every thread.

Times in milliseconds, p50 and p95 over the repeats (the garbage collector on, as
in the hub, but where said).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import math
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpuspawner.cluster.cluster import GPUCluster, InventorySettings
from gpuspawner.cluster.service_spec import build_service
from gpuspawner.cluster.swarm import Swarm, spec_reservations
from gpuspawner.core.inventory import GPU
from gpuspawner.core.labels import Held, parse_labels
from tests.fakedocker import FakeDocker

MODEL = "NVIDIA A100 80GB PCIe"
GPUS_PER_NODE = 8
NODE_CPUS, NODE_MEMORY_GIB = 64, 512
GIB = 2**30
HUB_SHARE = 0.4  # of the services: the hub's GPU servers
RUNNING = {"desired-state": "running"}  # the filter Swarm.reservations lists tasks with
LOG = logging.getLogger("bench_swarm_reads")


def hostname(i: int) -> str:
    return f"node{i:04d}"


def hub_env(user: str, k: int) -> dict[str, str]:
    """The environment JupyterHub gives a server (names as JupyterHub 4 sets them; values of typical length)."""
    prefix = f"/user/{user}/"
    scopes = json.dumps([f"access:servers!server={user}/", f"read:users:groups!user={user}"])
    return {
        "JUPYTERHUB_API_TOKEN": f"{k:032x}",
        "JPY_API_TOKEN": f"{k:032x}",
        "JUPYTERHUB_CLIENT_ID": f"jupyterhub-user-{user}",
        "JUPYTERHUB_HOST": "",
        "JUPYTERHUB_OAUTH_CALLBACK_URL": f"{prefix}oauth_callback",
        "JUPYTERHUB_OAUTH_SCOPES": scopes,
        "JUPYTERHUB_OAUTH_ACCESS_SCOPES": scopes,
        "JUPYTERHUB_OAUTH_CLIENT_ALLOWED_SCOPES": "[]",
        "JUPYTERHUB_USER": user,
        "JUPYTERHUB_SERVER_NAME": "",
        "JUPYTERHUB_API_URL": "http://jupyterhub:8081/hub/api",
        "JUPYTERHUB_ACTIVITY_URL": f"http://jupyterhub:8081/hub/api/users/{user}/activity",
        "JUPYTERHUB_BASE_URL": "/",
        "JUPYTERHUB_SERVICE_PREFIX": prefix,
        "JUPYTERHUB_SERVICE_URL": f"http://0.0.0.0:8888{prefix}",
        "JUPYTERHUB_PUBLIC_URL": "https://hub.example.org",
        "JUPYTERHUB_PUBLIC_HUB_URL": "https://hub.example.org/hub/",
        "JUPYTER_IMAGE_SPEC": "registry.example.org/jupyter/gpu-notebook:2024.05",
        "JUPYTER_IMAGE": "registry.example.org/jupyter/gpu-notebook:2024.05",
    }


@dataclass
class Built:
    """A swarm in the fake and the hub's cluster over it, with what each service was made to reserve."""

    fake: FakeDocker
    cluster: GPUCluster
    swarm: Swarm
    pool: ThreadPoolExecutor
    asked: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)  # host -> service -> (milli, MiB)
    hub_servers: int = 0
    reserving: int = 0  # services that reserve CPU or memory

    def close(self) -> None:
        self.pool.shutdown()


def _hub_server(fake: FakeDocker, rng: random.Random, k: int, host: str, free: list[str]) -> tuple[str, int, int]:
    """One of the hub's GPU servers, made as the spawner makes it; its name and what it reserves."""
    user = f"user{k:05d}"
    uuids = tuple(free.pop() for _ in range(min(len(free), 1 if rng.random() < 0.8 else 2)))
    held = Held(user=user, server="", host=host, uuids=uuids, model=MODEL, port=None)
    cpus, mem = (rng.choice((2, 4, 8)), rng.choice((16, 32, 64))) if rng.random() < 0.75 else (0, 0)
    resources = {
        "mem_limit": 2 * mem * GIB or None,
        "mem_reservation": mem * GIB or None,
        "cpu_limit": 2 * cpus * 10**9 or None,
        "cpu_reservation": cpus * 10**9 or None,
    }
    create = build_service(
        name=f"jupyter-{user}",
        image="registry.example.org/jupyter/gpu-notebook:2024.05",
        command=["jupyterhub-singleuser"],
        env=hub_env(user, k),
        holding=held,
        network="jupyterhub",
        resources=resources,
    )
    fake.create_service(**create)
    return create["name"], cpus * 1000, mem * 1024


def _other_service(fake: FakeDocker, rng: random.Random, k: int, host: str) -> tuple[str, int, int]:
    """A service of another stack, pinned to ``host``; its name and what it reserves."""
    r = rng.random()
    milli = rng.choice((250, 500, 1000, 2000, 4000)) if r < 0.3 or 0.45 <= r < 0.55 else 0
    mib = rng.choice((256, 512, 1024, 4096, 16384)) if r < 0.45 else 0
    reservations = {key: v for key, v in (("NanoCPUs", milli * 10**6), ("MemoryBytes", mib * 2**20)) if v}
    name = f"stack{k % 50:02d}_svc{k:05d}"
    template = {
        "ContainerSpec": {
            "Image": f"registry.example.org/stack{k % 50:02d}/app:1.{k % 7}",
            "Env": [f"STACK=stack{k % 50:02d}", "LOG_LEVEL=info", f"PORT={8000 + k % 100}"],
            "Labels": {"com.docker.stack.namespace": f"stack{k % 50:02d}"},
        },
        "Resources": {"Reservations": reservations} if reservations else {},
        "RestartPolicy": {"Condition": "any", "MaxAttempts": 0},
        "Placement": {"Constraints": [f"node.hostname=={host}"]},
        "Networks": [{"Target": f"stack{k % 50:02d}_default"}],
    }
    fake.create_service(template, name=name, labels={"com.docker.stack.namespace": f"stack{k % 50:02d}"})
    return name, milli, mib


async def build(nodes: int, services: int, seed: int = 1) -> Built:
    """The swarm, every task running, the hub's servers booked, the node list read."""
    rng = random.Random(seed)
    hosts = [hostname(i) for i in range(nodes)]
    fake = FakeDocker(hosts)
    for host in hosts:
        fake.set_node_resources(host, NODE_CPUS, NODE_MEMORY_GIB)
    gpus = [GPU(h, i, f"GPU-{n:04d}-{i}", MODEL, 81920) for n, h in enumerate(hosts) for i in range(GPUS_PER_NODE)]
    free = {h: [g.uuid for g in gpus if g.host == h][::-1] for h in hosts}
    cluster = GPUCluster(InventorySettings(static=tuple(gpus)))
    pool = ThreadPoolExecutor(1)  # dockerspawner's client runs in an executor too
    built = Built(fake, cluster, Swarm(fake, pool), pool)
    for k in range(services):
        host = hosts[rng.randrange(nodes)]
        if rng.random() < HUB_SHARE and free[host]:
            name, milli, mib = _hub_server(fake, rng, k, host, free[host])
            built.hub_servers += 1
        else:
            name, milli, mib = _other_service(fake, rng, k, host)
        if milli or mib:
            built.asked.setdefault(host, {})[name] = (milli, mib)
            built.reserving += 1
    fake.run_all()
    await cluster.refresh(built.swarm, LOG)
    for service in fake.services(filters={"label": "gpuspawner.devices"}):  # as the hub's rebuild books them
        spec = service["Spec"]
        claim = parse_labels(spec["Labels"])
        cluster.adopt(spec["Name"], claim, spec_reservations(spec))
    return built


class Replay:
    """A Docker client that hands back the same lists, ready-made: the hub's part without the fake's."""

    def __init__(self, services: list[dict], tasks: list[dict]):
        self._services, self._tasks = services, tasks

    def services(self, filters=None, status=None) -> list[dict]:
        return self._services

    def tasks(self, filters=None) -> list[dict]:
        return self._tasks


def answers(fake: FakeDocker) -> tuple[list[dict], list[dict]]:
    """The two lists ``Swarm.reservations`` asks for, as the fake answers them."""
    return fake.services(), fake.tasks(filters=RUNNING)


def containers(value: object) -> int:
    """The dicts and lists in a decoded JSON value (what a decode makes, besides strings and numbers)."""
    if isinstance(value, dict):
        return 1 + sum(containers(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(containers(v) for v in value)
    return 0


@contextlib.contextmanager
def collector_off():
    """The garbage collector off (what the figures are without its pauses)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def summary(values: list[float]) -> dict[str, float]:
    """p50, p95 and max, in ms."""
    return {
        "p50_ms": round(percentile(values, 0.5) * 1000, 3),
        "p95_ms": round(percentile(values, 0.95) * 1000, 3),
        "max_ms": round(max(values) * 1000, 3),
    }


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


async def atimed(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


async def read(built: Built) -> None:
    """One read as a spawn makes it, the once-a-second gate open."""
    built.cluster._reserved_at = -math.inf  # as if the last read were a second old
    await built.cluster.read_reservations(built.swarm, LOG)
    if built.cluster.reading is not None:  # after the first, a read runs in the background
        await built.cluster.reading


async def spawn_wait(built: Built) -> float:
    """How long a spawn waits for the figures once they are too old (s): the read is
    begun and waited for up to READ_WAIT; then the rest of it, untimed."""
    built.cluster._reserved_at = -math.inf
    t0 = time.perf_counter()
    await built.cluster.read_reservations(built.swarm, LOG)
    waited = time.perf_counter() - t0
    if built.cluster.reading is not None:
        await built.cluster.reading
    return waited


async def loop_late_during(work: Callable[[], object]) -> float:
    """The longest a 1 ms timer on the event loop was late while ``work`` ran (s)."""
    loop = asyncio.get_running_loop()
    done, late = False, [0.0]

    async def tick():
        while not done:
            t0 = loop.time()
            await asyncio.sleep(0.001)
            late.append(loop.time() - t0 - 0.001)

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.005)  # the ticker runs
    late[:] = [0.0]
    await work()
    done = True
    await ticker
    return max(late)


async def measure(nodes: int, services: int, repeats: int, seed: int = 1) -> dict:
    t0 = time.perf_counter()
    built = await build(nodes, services, seed)
    built_s = time.perf_counter() - t0
    try:
        cluster, fake = built.cluster, built.fake
        listed_services, listed_tasks = answers(fake)
        services_json, tasks_json = compact(listed_services), compact(listed_tasks)
        replay = Swarm(Replay(listed_services, listed_tasks), built.pool)
        reserved = await replay.reservations()
        hosts = [(h, n.id) for h, n in cluster.nodes.items()]

        def hand_over():  # read_reservations's loop over the nodes
            for host, node_id in hosts:
                cluster.allocator.set_host_reserved(host, reserved.get(node_id, {}))

        def free_all():
            for host, _ in hosts:
                cluster.allocator.resources.free(host)

        def decode():
            return json.loads(services_json), json.loads(tasks_json)

        async def decode_off_loop():  # where docker-py would decode: in the client's executor
            await asyncio.get_running_loop().run_in_executor(built.pool, decode)

        late_repeats = max(3, repeats // 4)
        await read(built)  # warm: the first read sets every host
        out = {
            "nodes": nodes,
            "services": services,
            "hub_servers": built.hub_servers,
            "reserving": built.reserving,
            "running_tasks": len(listed_tasks),
            "containers": containers(listed_services) + containers(listed_tasks),
            "services_json_bytes": len(services_json),
            "tasks_json_bytes": len(tasks_json),
            "repeats": repeats,
            "read": summary(await atimed(lambda: read(built), repeats)),
            "spawn_wait": summary([await spawn_wait(built) for _ in range(repeats)]),
            "max_age_s": round(built.cluster.reserved_max_age, 2),
            "fake_lists": summary(timed(lambda: answers(fake), repeats)),
            "hub_reservations": summary(await atimed(replay.reservations, repeats)),
            "set_host_reserved": summary(timed(hand_over, repeats)),
            "decode": summary(timed(decode, repeats)),
            "free_all": summary(timed(free_all, repeats)),
            "loop_late": summary([await loop_late_during(lambda: read(built)) for _ in range(late_repeats)]),
            "loop_late_decode": summary([await loop_late_during(decode_off_loop) for _ in range(late_repeats)]),
        }
        with collector_off():
            out["read_gc_off"] = summary(await atimed(lambda: read(built), repeats))
            out["loop_late_gc_off"] = summary(
                [await loop_late_during(lambda: read(built)) for _ in range(late_repeats)]
            )
        out |= {
            "build_s": round(built_s, 1),
        }
    finally:
        built.close()
    return out


def _ms(value: float) -> str:
    return f"{value:.3g}" if value < 10 else f"{value:.0f}"


def table(results: list[dict]) -> str:
    """Markdown: one row per size, times in ms (p50 / p95)."""

    def both(r: dict, key: str) -> str:
        return f"{_ms(r[key]['p50_ms'])} / {_ms(r[key]['p95_ms'])}"

    rows = [
        "| nodes | services (hub's GPU servers) | JSON: services + tasks | dicts and lists in it "
        "| read_reservations | the same, collector off | a spawn waits | figures kept for "
        "| the fake's two lists alone | the hub's summing | set_host_reserved, every node | free() of every node "
        "| json.loads of the JSON | event loop late, max: read / read, collector off / json.loads in the executor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        mb = (r["services_json_bytes"] + r["tasks_json_bytes"]) / 1e6
        rows.append(
            f"| {r['nodes']:,} | {r['services']:,} ({r['hub_servers']:,}) "
            f"| {r['services_json_bytes'] / 1e6:.2f} + {r['tasks_json_bytes'] / 1e6:.2f} = {mb:.2f} MB "
            f"| {r['containers']:,} | {both(r, 'read')} | {both(r, 'read_gc_off')} "
            f"| {both(r, 'spawn_wait')} | {r['max_age_s']:g} s "
            f"| {both(r, 'fake_lists')} | {both(r, 'hub_reservations')} "
            f"| {both(r, 'set_host_reserved')} | {both(r, 'free_all')} | {both(r, 'decode')} "
            f"| {_ms(r['loop_late']['max_ms'])} / {_ms(r['loop_late_gc_off']['max_ms'])} "
            f"/ {_ms(r['loop_late_decode']['max_ms'])} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[100, 1000], help="swarm sizes (default 100 1000)")
    p.add_argument("--services", type=int, nargs="+", help="services per size (default 8 a node)")
    p.add_argument("--repeats", type=int, default=30, help="timed repeats of each thing (default 30)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="machine-readable")
    args = p.parse_args(argv)
    services = args.services or [8 * n for n in args.nodes]
    if len(services) != len(args.nodes) or min(args.nodes) < 1 or min(services) < 0 or args.repeats < 1:
        print("--services needs one count per --nodes; sizes ≥ 1, --repeats ≥ 1", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    results = []
    for nodes, count in zip(args.nodes, services, strict=True):
        results.append(asyncio.run(measure(nodes, count, args.repeats, args.seed)))
        gc.collect()  # the swarm just measured is garbage before the next is built
        if not args.json:
            print(f"{nodes} nodes, {count} services: built in {results[-1]['build_s']} s", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"Times in ms, p50 / p95 over {args.repeats} repeats; sizes as compact JSON.")
    print(table(results))
    took = time.perf_counter() - t0
    print(f"took {took:.0f} s (Python {platform.python_version()}, {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
