"""The ledger's PostgreSQL server stopped and started, and the hub killed, while
users spawn, stop, cancel and wait in line on the real swarm. Judged from what
the workers' daemons run (sampled all along), the swarm's services and the
ledger once everything is back: no GPU in two containers at once, no ledger row
left open or lost, no line left stuck, no 500. docs/reliability.md.

``GPUSPAWNER_CHAOS_SECONDS`` sets how long the users act (60 s by default; the
faults' schedule stretches with it), ``GPUSPAWNER_CHAOS_SEED`` their seed."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter

import pytest
import requests

from devtools.hub import HubError
from gpuspawner.ledger.ledger import Ledger
from tests.integration.support import (
    Sampler,
    hub_on,
    service_gpus,
    services_of,
    services_of_hub,
    spawn_ready,
    wait_until,
)

A100 = "NVIDIA A100 80GB PCIe"
GTX = "NVIDIA GeForce GTX 1070"
USERS = [f"chaos{i}" for i in range(6)]
SECONDS = float(os.environ.get("GPUSPAWNER_CHAOS_SECONDS", "60"))
SEED = int(os.environ.get("GPUSPAWNER_CHAOS_SEED", "20261203"))
# Servers take 2 s to exit after SIGTERM, as Jupyter servers take a while.
SLOW_SERVER = """
c.GPUSwarmSpawner.cmd = [
    "/bin/sh", "-c",
    'port="${JUPYTERHUB_SERVICE_URL##*:}"; port="${port%%/*}"; mkdir -p /srv; '
    'trap "sleep 2; exit 0" TERM INT; httpd -f -p "$port" -h /srv & wait $!; wait $!',
]
c.GPUSwarmSpawner.server_stop_timeout = 20
c.GPUSwarmSpawner.reconcile_interval = 2
c.GPUSwarmSpawner.gpu_wait_timeout = 60
c.JupyterHub.concurrent_spawn_limit = 0
"""


@pytest.fixture(scope="module")
def db_url(pg):
    return pg.create_database("chaos_ledger")


@pytest.fixture(scope="module")
def hub(swarm, pg, db_url, tmp_path_factory):
    config = SLOW_SERVER + f"c.GPUSwarmSpawner.gpu_db_url = {db_url!r}\n"
    with hub_on(swarm, tmp_path_factory.mktemp("hub"), port_from=21600, extra_config=config) as h:
        yield h


class Users(threading.Thread):
    """Each user in turn, at random: asks for a GPU (an A100 or a GTX 1070, half
    of the time willing to wait in line), cancels a pending spawn, or stops a
    running server. Counts what the hub answered; the hub being down is counted,
    never a failure."""

    def __init__(self, hub, seed: int):
        super().__init__(daemon=True)
        self.hub, self.rng = hub, random.Random(seed)
        self.hub_stops = 0  # hub stops begun so far (the fault schedule counts them)
        self.done = threading.Event()
        self.answers: Counter[str] = Counter()
        self.errors: list[str] = []  # 5xx other than 503, with their text

    def run(self):
        while not self.done.is_set():
            user = self.rng.choice(USERS)
            self.stops_before = self.hub_stops
            try:
                self.act(user)
            except (requests.RequestException, HubError):
                self.answers["hub unreachable"] += 1
            self.done.wait(self.rng.uniform(0.2, 1.0))

    def act(self, user: str) -> None:
        r = self.hub.api("GET", f"/users/{user}")
        server = r.json().get("servers", {}).get("") if r.status_code == 200 else None
        if r.status_code not in (200, 404):
            return self.count("look", r)
        if server is None:
            model = self.rng.choice([A100, A100, GTX])
            options = {"gpu_model": model, "gpu_wait": self.rng.random() < 0.5}
            return self.count("spawn", self.hub.spawn(user, options))
        if server.get("pending") == "spawn" and self.rng.random() < 0.5:
            return self.count("cancel", self.hub.api("DELETE", f"/users/{user}/server"))
        if server.get("ready") and self.rng.random() < 0.4:
            return self.count("stop", self.hub.api("DELETE", f"/users/{user}/server"))

    def count(self, what: str, r: requests.Response) -> None:
        if r.status_code == 500 and self.hub_stops != self.stops_before:
            # JupyterHub answers a request still in flight when it shuts down with a 500.
            self.answers[f"{what} cut by the hub's stop"] += 1
            return
        self.answers[f"{what} {r.status_code}"] += 1
        if r.status_code >= 500 and r.status_code != 503:
            self.errors.append(f"{what} {r.status_code}: {r.text[:300]}")


def faults(hub, pg, users: Users, t0: float, log: list[str]) -> None:
    """The faults, on a schedule stretched over SECONDS: the database down three
    times, once with the hub killed (SIGKILL) and restarted while it is down, and
    the hub stopped and restarted once with the database up."""

    def at(fraction: float) -> None:
        time.sleep(max(0.0, t0 + fraction * SECONDS - time.monotonic()))

    def note(what: str) -> None:
        log.append(f"{time.monotonic() - t0:5.1f} s: {what}")

    at(0.12)
    pg.stop()
    note("database stopped")
    time.sleep(4)
    pg.start()
    note("database started")
    at(0.3)
    pg.stop()
    note("database stopped")
    time.sleep(1)
    users.hub_stops += 1
    hub.stop(signal.SIGKILL)
    note("hub killed")
    hub.start()
    note("hub restarted, database still down")
    time.sleep(3)
    pg.start()
    note("database started")
    at(0.6)
    pg.stop(mode="immediate")
    note("database stopped (immediate)")
    time.sleep(5)
    pg.start()
    note("database started")
    at(0.8)
    users.hub_stops += 1
    hub.stop(signal.SIGTERM)
    note("hub stopped")
    hub.start()
    note("hub restarted")


def test_the_database_and_the_hub_failing_while_users_act_double_book_nothing_and_leave_nothing_stuck(
    hub, swarm, pg, db_url
):
    """Guards docs/reliability.md, "The fault model": "On the real swarm, a chaos test stops and starts
    the ledger's PostgreSQL three times" and "It passes when no sample shows one GPU in two
    containers"."""
    for user in USERS:
        hub.ensure_user(user)
    samplers = [Sampler(swarm, node, every=0.3) for node in ("gpu-a", "gpu-b")]
    users = Users(hub, SEED)
    log: list[str] = []
    for t in (*samplers, users):
        t.start()
    t0 = time.monotonic()
    try:
        faults(hub, pg, users, t0, log)
        time.sleep(max(0.0, t0 + SECONDS - time.monotonic()))
    finally:
        users.done.set()
        users.join()
        if not pg.running():
            pg.start()
    try:
        # Every spawn ends (started, or failed and told); then the ledger and the swarm agree.
        def settled() -> bool:
            servers = [hub.server_model(u) for u in USERS]
            return not any(s and s.get("pending") for s in servers)

        wait_until(settled, "a spawn still pending 120 s after the users stopped", timeout=120)

        def ledger_matches_swarm() -> bool:
            services = {s.name for s in services_of_hub(swarm, hub) if service_gpus(s)}
            return {r.service for r in Ledger(db_url).open_allocations()} == services

        wait_until(ledger_matches_swarm, "the ledger's open rows are not the swarm's GPU services", timeout=30)
        running = [u for u in USERS if (s := hub.server_model(u)) and s.get("ready")]
        rows = Ledger(db_url).open_allocations()
        assert sorted(r.user for r in rows) == sorted(
            u for u in running if any(service_gpus(s) for s in services_of(swarm, u))
        ), rows
    finally:
        for s in samplers:
            s.done.set()
            s.join()
    double = [d for s in samplers for d in s.double_booked()]
    samples = sum(len(s.samples) for s in samplers)
    print(
        f"\nchaos (seed {SEED}, {SECONDS:.0f} s): {dict(sorted(users.answers.items()))}\n"
        + "\n".join(log)
        + f"\n{samples} container samples on the workers, {len(double)} with one GPU in two containers"
    )
    assert double == [], double[:3]
    assert users.errors == []
    assert sum(n for k, n in users.answers.items() if k.startswith("spawn 20")) >= 5, users.answers

    # Nothing stuck: with every server stopped, no row stays open or waiting, and
    # both A100s and all three GTX 1070s go to the next requests.
    hub.stop_all_servers()
    wait_until(lambda: Ledger(db_url).open_allocations() == [], "a ledger row stayed open", timeout=30)
    assert Ledger(db_url).waiting() == []
    spawn_ready(hub, "after-a100", {"gpu_model": A100, "gpu_count": 2})
    spawn_ready(hub, "after-gtx", {"gpu_model": GTX, "gpu_count": 2})
    spawn_ready(hub, "after-gtx1", {"gpu_model": GTX})
    # ... and the line serves its head as soon as a GPU is given back.
    assert hub.spawn("after-wait", {"gpu_model": A100, "gpu_wait": True}).status_code == 202
    wait_until(lambda: [w.user for w in Ledger(db_url).waiting()] == ["after-wait"], "after-wait not in line")
    hub.stop_server("after-a100")
    t = time.monotonic()
    hub.wait_ready("after-wait", timeout=60)
    print(f"the line's head served {time.monotonic() - t:.1f} s after the A100s were given back")
    hub.stop_all_servers()
