"""Holdings under every interleaving: the real spawner, owner, allocator and
SQLite ledger over an in-process fake of the Docker API (tests/fakedocker.py),
driven by a deterministic scheduler (tests/interleave.py) that chooses, at
every point where a Docker or database call is pending, which coroutine goes
next, and when containers exit, tasks start, a spawn is cancelled or time
passes.

After every step the invariants are checked:

* no GPU is booked to two holdings (whole, or shares above 1);
* no GPU is free while a container of its last holder may still run: every
  container that may run has each device in its NVIDIA_VISIBLE_DEVICES booked
  to its own service;

and at the end of every schedule, the ledger's open entries are exactly the
live holdings with GPUs, and no operation failed with anything but a clean
SpawnException.

The named regression tests below are the defects this owner was built to
close; each failed on the code before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import Counter
from types import SimpleNamespace

import pytest
import requests
from jupyterhub import orm
from jupyterhub.spawner import SpawnException
from prometheus_client import REGISTRY
from traitlets.config import Config

from gpuspawner.cluster.swarm import SwarmError
from gpuspawner.core.labels import Held, to_labels
from gpuspawner.holdings.holdings import Phase
from gpuspawner.hub.app import KEY, GPUHub
from gpuspawner.ledger.ledger import Ledger, LedgerError
from gpuspawner.spawn import spawner as spawner_module
from tests.fakedocker import API_CALLS, FakeDocker
from tests.interleave import AnswerLost, Run, Scenario, explore, random_schedules, scaled

A100 = "NVIDIA A100 80GB PCIe"
NODES = ["manager", "gpu-a", "gpu-b"]
ONE_GPU = {"gpu-b": [{"uuid": "GPU-b0", "model": A100, "memory_mib": 81920}]}
HUB = SimpleNamespace(
    api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", url="http://127.0.0.1:8081/hub/", public_host=""
)


async def driven(future, tick, seconds: float = 30.0):
    """``future``'s result, with ``tick()`` (what the swarm does meanwhile) called
    until it is done; a start or stop that never ends fails the test, not hangs it."""
    future = asyncio.ensure_future(future)
    deadline = asyncio.get_running_loop().time() + seconds
    while not future.done():
        if asyncio.get_running_loop().time() > deadline:
            future.cancel()
            raise AssertionError(f"still not done after {seconds} s")
        tick()
        await asyncio.sleep(0.01)
    return await future


class World:
    """One hub (its config, a fresh owner) over one fake swarm."""

    def __init__(self, tmp_path, executor=None, inventory=ONE_GPU, clocks=None, **settings):
        self.fake = FakeDocker(nodes=NODES)
        self.db_url = f"sqlite:///{tmp_path}/ledger-{time.monotonic_ns()}.sqlite"
        config = Config()
        config.GPUSwarmSpawner.gpu_inventory = inventory
        config.GPUSwarmSpawner.gpu_db_url = self.db_url
        config.GPUSwarmSpawner.image = "busybox"
        config.GPUSwarmSpawner.cmd = ["jupyterhub-singleuser"]
        config.GPUSwarmSpawner.server_stop_timeout = 5
        config.GPUSwarmSpawner.task_start_timeout = 20
        for key, value in settings.items():
            setattr(config.GPUSwarmSpawner, key, value)
        self.config = config
        self.cls = type(
            "FakeSwarmSpawner", (spawner_module.GPUSwarmSpawner,), {"_client": self.fake, "_executor": executor}
        )
        self.hub_settings: dict = {}  # the hub's tornado settings, where its GPUHub is kept
        if clocks is not None:  # {"clock": ..., "wall": ...}: the hub's own, made now
            self.hub_settings[KEY] = GPUHub.from_config(config, self.cls, **clocks)

    def restart(self) -> None:
        """The hub restarts: a new GPUHub, whose holdings come back from the swarm and the ledger."""
        self.hub_settings = {}

    @property
    def hub(self):
        return self.spawner("nobody").gpu_hub

    def spawner(self, user: str, options=None, server: str = ""):
        named = SimpleNamespace(name=server, display_name=server, server=None, state=None)
        s = self.cls(
            config=self.config,
            user=SimpleNamespace(name=user, id=hash(user) % 1000, url=f"/user/{user}/", settings=self.hub_settings),
            orm_spawner=named,
            hub=HUB,
        )
        s.api_token = "token"
        s.user_options = dict(options or {})
        return s

    @property
    def owner(self):
        return self.spawner("nobody").holdings()

    def leftover(self, user: str, uuids=("GPU-b0",), name=None, run=True, **labels):
        """A service left by an earlier hub (labels as that hub wrote them)."""
        claim = Held(
            user=user,
            server="",
            host="gpu-b" if uuids else "",
            uuids=tuple(uuids),
            model=A100 if uuids else "",
            port=None,
        )
        env = [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids) or 'void'}"]
        template = {
            "ContainerSpec": {"Image": "busybox", "Env": env},
            "Placement": {"Constraints": ["node.hostname==gpu-b"]},
        }
        self.fake.create_service(template, name=name or f"jupyter-{user}", labels={**to_labels(claim), **labels})
        if run:
            self.fake.run_all()

    async def started(self, spawner):
        """The spawner's start, with the swarm starting tasks as it goes."""
        return await driven(spawner.start(), self.fake.run_all)

    async def lingering(self, user: str = "alice"):
        """The hub's holdings, with a leftover of ``user`` adopted and then
        removed while its container still runs."""
        self.leftover(user)
        owner = self.owner
        await owner.reconcile()
        assert not await owner.remove(f"jupyter-{user}", wait=0)
        return owner

    # -- invariants -----------------------------------------------------------------

    def invariant(self) -> None:
        hub = self.hub_settings.get(KEY)
        owner = hub and hub._holdings
        if not owner or not owner.rebuilt:
            return  # what an earlier hub left is the rebuild's to find
        booked: dict[str, set[str]] = {}  # uuid -> services booked on it
        total: dict[str, int] = {}  # uuid -> thousandths booked
        for name, alloc in owner.allocator.holdings().items():
            for gpu, milli in zip(alloc.devices, alloc.milli):
                booked.setdefault(gpu.uuid, set()).add(name)
                total[gpu.uuid] = total.get(gpu.uuid, 0) + milli
        assert all(t <= 1000 for t in total.values()), f"booked above 1: {total}"
        for task, (service, _node, visible) in self.fake.running_containers().items():
            for uuid in filter(None, visible.split(",")):
                if uuid == "void":
                    continue
                assert service in booked.get(uuid, set()), (
                    f"{uuid} is not booked to {service}, whose task {task} may still run on it (booked: {booked})"
                )

    def ledger_matches(self) -> None:
        owner = self.owner
        open_ = {r.service for r in Ledger(self.db_url).open_allocations()}
        live = {name for name, h in owner.all().items() if h.held.uuids}
        assert open_ == live, f"ledger open {open_} but holdings {live}"


def clean(outcome) -> None:
    """Operations may be refused or fail, but only with a message for the user."""
    for name, exc in outcome.errors.items():
        assert isinstance(exc, (SpawnException, asyncio.CancelledError)), f"{name} raised {exc!r}"


def check_all(world: World):
    def check(outcome):
        clean(outcome)
        world.ledger_matches()

    return check


# -- the six defects, as named regressions ----------------------------------------------


def leftover_scenario(tmp_path, **settings):
    """Alice starts again over her leftover service while a reconcile runs and bob starts."""

    def scenario(run: Run) -> Scenario:
        world = World(tmp_path, run.executor, **settings)
        world.leftover("alice")
        alice, bob = world.spawner("alice", {"gpu_model": A100}), world.spawner("bob", {"gpu_model": A100})
        return Scenario(
            ops={"alice": alice.start, "reconcile": lambda: world.owner.reconcile(), "bob": bob.start},
            events={"exit_all": world.fake.exit_all, "run_all": world.fake.run_all},
            invariant=world.invariant,
            check=check_all(world),
        )

    return scenario


@pytest.mark.explore
def test_defect1_a_restart_with_a_leftover_never_books_its_gpu_twice(tmp_path):
    """A server started again while its earlier service is left over; a
    reconciliation between the new allocation and the service's creation used
    to release the new allocation, and the next user got the same GPU."""

    stats = random_schedules(leftover_scenario(tmp_path), seed=1, n=300)
    assert stats.schedules == scaled(300) and stats.choice_points > 300


@pytest.mark.explore
def test_a_reconcile_snapshot_never_closes_a_newer_reservations_ledger_row(tmp_path):
    """With a weekly budget, start() reads the ledger before removing the
    leftover. A reconcile (bob's first use of the hub) saw alice's leftover
    forgotten and her new reservation not yet made; its close_missing ran after
    her new open and closed it: a live holding with no open allocation."""

    budget = {"*": {"models": "*", "weekly_gpu_hours": 100}}
    stats = random_schedules(leftover_scenario(tmp_path, gpu_access=budget), seed=1, n=100)
    assert stats.schedules == scaled(100)


@pytest.mark.explore
def test_a_second_reconcile_never_closes_the_ledger_row_of_a_server_started_again(tmp_path):
    """A restarted hub's open record whose container lingers, and a budget (a
    ledger read in start()): a second reconcile's close_missing, with a
    snapshot from before alice's new reservation, closed the allocation that
    reservation had just opened."""

    def scenario(run: Run) -> Scenario:
        world = World(tmp_path, run.executor, gpu_access={"*": {"models": "*", "weekly_gpu_hours": 100}})
        world.leftover("alice")
        (task,) = world.fake.task_ids("jupyter-alice")
        db = Ledger(world.db_url)
        db.open("jupyter-alice", "alice", "", "gpu-b", A100, ["GPU-b0"], [1000])
        db.note_tasks("jupyter-alice", [task])
        world.fake.remove_service("jupyter-alice")  # gone while the hub was down; the container lingers
        alice = world.spawner("alice", {"gpu_model": A100})
        return Scenario(
            ops={"reconcile": lambda: world.owner.reconcile(), "alice": alice.start},
            events={
                "exit_all": world.fake.exit_all,
                "run_all": world.fake.run_all,
                "reconcile2": lambda: world.owner.reconcile(),
            },
            invariant=world.invariant,
            check=check_all(world),
        )

    stats = random_schedules(scenario, seed=4, n=100)
    assert stats.schedules == scaled(100)


@pytest.mark.explore
def test_defect2_a_failed_stop_keeps_the_gpu_until_the_container_is_gone(tmp_path):
    """A stop whose removal failed left the GPU reserved only until the next
    reconciliation, which released it without waiting for the task.

    Guards docs/security.md, "A user's server": "have its GPUs handed to someone else while it still
    runs"."""

    def scenario(run: Run) -> Scenario:
        world = World(tmp_path, run.executor)
        world.leftover("alice")
        world.fake.fail_next("remove_service", status=500)
        alice, bob = world.spawner("alice"), world.spawner("bob", {"gpu_model": A100})

        async def stop_alice():
            try:
                await alice.stop()
            except SpawnException:
                pass  # JupyterHub reports it; the GPU must stay reserved

        return Scenario(
            ops={"stop": stop_alice, "reconcile": lambda: world.owner.reconcile(), "bob": bob.start},
            events={"exit_all": world.fake.exit_all, "run_all": world.fake.run_all},
            invariant=world.invariant,
            check=lambda outcome: clean(outcome),
        )

    stats = random_schedules(scenario, seed=2, n=300)
    assert stats.schedules == scaled(300)


@pytest.mark.explore
def test_defect2_a_cancelled_spawn_gives_its_gpu_back_only_after_its_task_ended(tmp_path):
    """JupyterHub's DELETE on a pending spawn cancels it, then stops it: the
    holding was released while the task was still starting.

    Guards docs/security.md, "A user's server": "have its GPUs handed to someone else while it still
    runs"."""

    def scenario(run: Run) -> Scenario:
        world = World(tmp_path, run.executor)
        alice, bob = world.spawner("alice", {"gpu_model": A100}), world.spawner("bob", {"gpu_model": A100})

        async def stop_alice():
            try:
                await alice.stop()
            except SpawnException:
                pass

        return Scenario(
            ops={"alice": alice.start, "bob": bob.start, "reconcile": lambda: world.owner.reconcile()},
            events={"exit_all": world.fake.exit_all, "run_all": world.fake.run_all, "stop_alice": stop_alice},
            cancellable=("alice",),
            invariant=world.invariant,
            check=lambda outcome: clean(outcome),
        )

    stats = random_schedules(scenario, seed=3, n=300)
    assert stats.schedules == scaled(300)


async def test_a_cancelled_spawn_ends_at_once_and_its_gpu_waits_for_its_container(tmp_path):
    """JupyterHub's DELETE on a pending server cancels the spawn, waits 1 s, then
    calls stop(), and answers 500 if the spawn is still pending by then. A
    container that takes longer than that to exit must not hold the cancel up;
    its GPU stays reserved until it has exited, and stop() waits for that."""
    world = World(tmp_path)
    alice = world.spawner("alice", {"gpu_model": A100})
    spawn = asyncio.ensure_future(alice.start())
    await driven(asyncio.sleep(0.2), lambda: None)
    assert world.fake.service_names() == ["jupyter-alice"] and world.fake.running_containers()
    spawn.cancel()
    await asyncio.wait({spawn}, timeout=0.5)
    assert spawn.cancelled()
    await asyncio.sleep(0.2)  # the removal goes on meanwhile
    assert world.fake.service_names() == [] and world.fake.running_containers()
    assert world.owner.get("jupyter-alice").phase is Phase.REMOVING
    stop = asyncio.ensure_future(alice.stop())
    await asyncio.sleep(0.2)
    assert not stop.done()  # it waits for the container
    world.fake.exit_all()
    await driven(stop, world.fake.run_all)
    assert world.owner.get("jupyter-alice") is None
    bob = world.spawner("bob", {"gpu_model": A100})
    await world.started(bob)  # the GPU is free again


async def test_defect3_a_leftover_cpu_only_service_of_the_same_name_is_removed_first(tmp_path):
    world = World(tmp_path)
    world.leftover("alice", uuids=())
    (old,) = world.fake.task_ids("jupyter-alice")
    alice = world.spawner("alice", {"gpu_model": A100})

    def swarm():
        nonlocal old
        if old and "jupyter-alice" not in world.fake.service_names():  # removed: its container exits
            world.fake.exit_container(old)
            old = None
        world.fake.run_all()

    await driven(alice.start(), swarm)
    env = world.fake.running_containers()
    assert [visible for _, _, visible in env.values()] == ["GPU-b0"]


async def test_defect4_hostile_labels_never_stop_the_rebuild(tmp_path):
    """Guards docs/security.md, "Anyone with access to the swarm manager's API": "stop or stall the
    hub's rebuild: each such service is skipped and logged once"."""
    world = World(tmp_path)
    for i, bad in enumerate(
        [
            {"gpuspawner.shares": "inf"},
            {"gpuspawner.shares": "1e10000000"},
            {"gpuspawner.port": "٨٠٨٠"},
            {"gpuspawner.user": ""},
        ]
    ):
        world.leftover(f"x{i}", name=f"jupyter-x{i}", **bad)
    # A hang guard, not a speed target: "1e10000000" taken as a number would never finish.
    result = await asyncio.wait_for(world.owner.reconcile(), timeout=30)
    assert result["services"] == 0 and len(world.owner.foreign) == 4
    await world.started(world.spawner("alice", {"gpu_model": A100}))


async def test_reconciliation_counts_double_bookings_by_their_reason(tmp_path):
    def counted() -> float:
        return REGISTRY.get_sample_value("gpuspawner_double_bookings_total") or 0.0

    world = World(tmp_path)
    world.leftover("alice")
    world.leftover("bob")  # labelled with alice's device too
    world.leftover("carol", uuids=("GPU-gone",))  # a device the inventory does not know: no double booking
    before = counted()
    await world.owner.reconcile()
    assert counted() - before == 1
    booked = [h.name for h in world.owner.all().values() if world.owner.allocator.holding(h.name).devices]
    assert booked == ["jupyter-alice"]


async def test_defect5_a_service_by_another_name_is_not_charged_to_the_user(tmp_path):
    """Guards docs/security.md, "Anyone with access to the swarm manager's API": "have it charged to
    that user or adopted"."""
    world = World(
        tmp_path,
        max_gpus_per_user=1,
        inventory={"gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920} for i in range(3)]},
    )
    world.leftover("alice", name="evil")  # labelled as alice's running server
    await world.owner.reconcile()
    assert world.owner.get("evil") is None and "evil" in world.owner.foreign
    await world.started(world.spawner("alice", {"gpu_model": A100}))  # not refused for her limit
    assert world.owner.get("jupyter-alice").held.uuids


async def test_defect6_a_restarted_hub_checks_the_url_where_the_server_listens(tmp_path):
    world = World(tmp_path, network_name="host")
    world.leftover("alice", **{"gpuspawner.port": "20005"})
    alice = world.spawner("alice")
    # What the hub recorded before it was killed: the manager's name and a random port.
    alice.orm_spawner.server = orm.Server(proto="http", ip="vm", port=54487, base_url="/user/alice/", cookie_name="c")
    assert await alice.poll() is None
    gpu_b = next(n for n in world.fake.nodes() if n["Description"]["Hostname"] == "gpu-b")["Status"]["Addr"]
    assert await alice.get_url() == f"http://{gpu_b}:20005/user/alice/"


# -- systematic exploration ----------------------------------------------------------------


@pytest.mark.explore
def test_start_stop_and_reconcile_of_two_users_on_one_gpu_every_interleaving(tmp_path):
    """Depth-first over every schedule of a start racing a reconciliation
    and another user's start, for the one GPU.

    Guards docs/security.md, "A user": "get a GPU another server holds"."""

    def scenario(run: Run) -> Scenario:
        world = World(tmp_path, run.executor)
        alice, bob = world.spawner("alice", {"gpu_model": A100}), world.spawner("bob", {"gpu_model": A100})
        world.fake.run_all()
        return Scenario(
            ops={"alice": alice.start, "bob": bob.start, "reconcile": lambda: world.owner.reconcile()},
            events={"run_all": world.fake.run_all},
            invariant=world.invariant,
            check=check_all(world),
        )

    stats = explore(scenario, max_schedules=400)
    assert stats.schedules >= 100
    print(f"explored {stats.schedules} schedules, {stats.choice_points} choice points, depth {stats.max_depth}")


def test_a_stop_whose_container_lingers_keeps_the_gpu_reserved_and_says_so(tmp_path):
    async def body():
        world = World(tmp_path)
        owner = await world.lingering()
        h = owner.get("jupyter-alice")
        assert h.phase is Phase.REMOVING and "still running" in h.problem
        holders = json.loads(await owner.cluster.views.alloc_map_json())["gpu-b"]["GPU-b0"]["holders"]
        assert holders[0]["phase"] == "removing" and "still running" in holders[0]["problem"]
        bob = world.spawner("bob", {"gpu_model": A100})
        with pytest.raises(SpawnException) as refused:
            await bob.start()
        assert refused.value.status_code == 409
        world.fake.exit_all()
        await owner.reconcile()
        assert owner.get("jupyter-alice") is None

    asyncio.run(body())


def test_a_restarted_hub_keeps_the_gpus_of_a_gone_service_until_its_recorded_tasks_end(tmp_path):
    """The hub was killed after the service was removed but before its
    container exited: the ledger still has the allocation open, with its task."""

    async def body():
        world = World(tmp_path)
        world.leftover("alice")
        owner = world.owner
        await owner.reconcile()
        (task,) = world.fake.task_ids("jupyter-alice")
        await owner.note_tasks("jupyter-alice", [task])
        world.fake.remove_service("jupyter-alice")  # gone behind the hub's back; the container lingers
        world.restart()
        restarted = world.owner
        await restarted.reconcile()
        h = restarted.get("jupyter-alice")
        assert h is not None and h.phase is Phase.REMOVING and h.tasks == {task}
        world.invariant()
        world.fake.exit_container(task)
        await restarted.reconcile()
        assert restarted.get("jupyter-alice") is None
        assert Ledger(world.db_url).open_allocations() == []

    asyncio.run(body())


async def test_a_server_with_a_published_port_is_reached_at_the_port_swarm_published(tmp_path):
    world = World(tmp_path, use_internal_ip=False)
    alice = world.spawner("alice", {"gpu_model": A100})
    ip, port = await world.started(alice)
    published = world.fake.inspect_service("jupyter-alice")["Endpoint"]["Ports"]
    assert (ip, port) == (alice.host_ip, published[0]["PublishedPort"]) and published[0]["TargetPort"] == alice.port
    assert not world.fake.calls_to("inspect_image")  # cmd is set: the image is not asked


def test_the_admin_page_says_a_gpu_is_kept_while_its_container_still_runs(tmp_path):
    import jinja2

    from gpuspawner.web.api import HostCard
    from tests.unit.test_cluster_views import TEMPLATES

    async def body():
        world = World(tmp_path)
        owner = await world.lingering()
        card = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True).get_template(
            "gpus_host.html"
        )
        (html,) = await owner.cluster.views.host_views("html", HostCard(card))
        assert "alice" in html.decode() and "removing: its container is still running" in html.decode()

    asyncio.run(body())


async def test_defect2_a_stop_that_timed_out_keeps_the_gpu_through_reconciliation(tmp_path):
    """The stop removed the service but its container still ran after
    server_stop_timeout; the next reconciliation used to release the GPU
    (the service was gone) and the next user's server ran on it too.

    Guards docs/security.md, "A user's server": "have its GPUs handed to someone else while it still
    runs"."""
    world = World(tmp_path, server_stop_timeout=1)
    alice = world.spawner("alice", {"gpu_model": A100})
    await world.started(alice)
    with pytest.raises(SpawnException):
        await alice.stop()  # the container does not exit
    await world.owner.reconcile()
    with pytest.raises(SpawnException) as refused:
        await world.started(world.spawner("bob", {"gpu_model": A100}))
    assert refused.value.status_code == 409
    world.invariant()
    world.fake.exit_all()
    await world.owner.reconcile()
    await world.started(world.spawner("bob", {"gpu_model": A100}))
    assert [v for _, _, v in world.fake.running_containers().values()] == ["GPU-b0"]


@pytest.mark.parametrize(
    "settings, named",
    [
        (
            {"extra_task_spec": {"restart_policy": {"condition": "any"}}},
            "extra_task_spec restart_policy condition 'any'",
        ),
        ({"extra_resources_spec": {"generic_resources": {"gpu": 1}}}, "extra_resources_spec asks for swarm generic"),
        ({"volumes": {"/dev/nvidia0": "/dev/nvidia0"}}, "volumes mounts source /dev/nvidia0"),
        # as the spec would mount it: the user's name filled in
        ({"read_only_volumes": {"/dev/{username}": "/gpu"}}, "read_only_volumes mounts source /dev/nvidia0"),
    ],
)
async def test_a_setting_that_could_only_conflict_fails_the_spawn_before_any_gpu_is_reserved(
    tmp_path, caplog, settings, named
):
    """A hub started without validate_config: the spawn says so, and reserves nothing.

    Guards docs/security.md, "An admin (of JupyterHub, or its configuration)": "a 500 at spawn
    before anything is reserved on a hub started without validate_config, and left out of the
    service".

    Guards docs/how-it-works.md, "What admin settings cannot change": "every spawn fails with a 500
    that asks the user to tell an admin, the detail in the hub's log, before any GPU is reserved"."""
    world = World(tmp_path, **settings)
    alice = world.spawner("nvidia0", {"gpu_model": A100})
    with pytest.raises(SpawnException) as refused:
        await alice.start()
    assert refused.value.status_code == 500 and "Please tell an admin" in refused.value.jupyterhub_message
    assert named in refused.value.log_message
    assert named in caplog.text
    assert world.owner.get("jupyter-nvidia0") is None and world.fake.service_names() == []


async def test_the_admins_settings_merge_under_the_spawners_guarantees(tmp_path):
    world = World(
        tmp_path,
        extra_task_spec={"container_spec": {"env": {"KEEP": "yes"}}, "placement": ["node.role==worker"]},
        extra_container_spec={"Env": ["ALSO=1"]},
    )
    await world.started(world.spawner("alice", {"gpu_model": A100}))
    ((_, spec),) = [(s["ID"], s["Spec"]) for s in world.fake.services()]
    task = spec["TaskTemplate"]
    assert task["Placement"]["Constraints"] == ["node.role==worker", "node.hostname==gpu-b"]
    assert {"KEEP=yes", "ALSO=1", "NVIDIA_VISIBLE_DEVICES=GPU-b0"} <= set(task["ContainerSpec"]["Env"])
    assert task["RestartPolicy"]["Condition"] == "none"


async def test_extra_host_config_devices_never_reach_a_service(tmp_path):
    """extra_host_config is DockerSpawner's (for plain containers): a service has no devices to take."""
    world = World(tmp_path, extra_host_config={"devices": ["/dev/nvidia0:/dev/nvidia0"], "privileged": True})
    await world.started(world.spawner("alice", {"gpu_model": A100}))
    (spec,) = [s["Spec"] for s in world.fake.services()]
    assert "/dev/nvidia" not in repr(spec) and "rivileged" not in repr(spec)
    assert "NVIDIA_VISIBLE_DEVICES=GPU-b0" in spec["TaskTemplate"]["ContainerSpec"]["Env"]


async def test_user_options_are_taken_without_jupyterhubs_unhandled_warning(tmp_path, caplog):
    import logging

    world = World(tmp_path)
    alice = world.spawner("alice", {"gpu_model": A100, "gpu_count": 1})
    unhandled = lambda: [r for r in caplog.records if "unhandled user_options" in r.getMessage()]  # noqa: E731
    with caplog.at_level(logging.WARNING):
        await alice._run_apply_user_options(alice.user_options)
        assert unhandled() == []
        alice.apply_user_options = None  # what JupyterHub does without gpuspawner's hook
        await alice._run_apply_user_options(alice.user_options)
        assert unhandled()


async def test_the_map_says_which_rule_placed_each_share_and_none_for_one_adopted(tmp_path):
    """Each holder entry names the rule that placed it; a holding rebuilt from
    a service's labels after a restart has no rule (its labels do not say)."""
    two = {"gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920} for i in range(3)]}
    world = World(tmp_path, inventory=two, gpu_sharing={A100: {"quantum": 0.05, "split": True}}, max_gpus_per_user=2)
    await world.started(world.spawner("alice", {"gpu_model": A100, "gpu_share": 0.2}))
    await world.started(world.spawner("bob", {"gpu_model": A100, "gpu_share": 1.2}))
    await world.started(world.spawner("carol", {"gpu_model": A100}))  # a whole GPU: no rule
    owner = world.owner
    m = json.loads(await owner.cluster.views.alloc_map_json())["gpu-b"]
    rules = sorted((h["user"], h["share"], h["rule"]) for d in m.values() for h in d["holders"])
    assert rules == [
        ("alice", 0.2, "one device"),
        ("bob", 0.6, "even split"),
        ("bob", 0.6, "even split"),
        ("carol", 1.0, None),
    ]

    world.restart()  # the holdings come back from the services
    owner = world.owner
    await owner.reconcile()
    m = json.loads(await owner.cluster.views.alloc_map_json())["gpu-b"]
    rules = sorted((h["user"], h["share"], h["rule"]) for d in m.values() for h in d["holders"])
    assert rules == [("alice", 0.2, None), ("bob", 0.6, None), ("bob", 0.6, None), ("carol", 1.0, None)]


async def test_the_form_shows_a_share_held_elsewhere_as_a_decimal_and_offers_what_the_limit_leaves(tmp_path):
    """Shares are thousandths inside; the form prints them as people write them."""
    three = {"gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920} for i in range(3)]}
    world = World(tmp_path, inventory=three, gpu_sharing={A100: {"quantum": 0.25, "split": True}}, max_gpus_per_user=2)
    await world.started(world.spawner("alice", {"gpu_model": A100, "gpu_share": 0.5}))
    form = " ".join((await world.spawner("alice", server="second")._render_options_form()).split())
    assert "Your limit: 2 per user, 0.5 held by your other servers." in form
    shares = re.findall(r'<option value="([0-9.]+)"', form[form.index('id="gpu-share"') :])
    assert shares == ["0.25", "0.5", "0.75", "1", "1.25", "1.5"]  # 2 less the 0.5 held, in quanta


async def test_when_every_host_network_port_is_held_a_spawn_is_refused_with_no_port_and_nothing_held(tmp_path):
    world = World(tmp_path, network_name="host", host_network_ports=(20000, 20000))
    first = world.spawner("alice")
    await world.started(first)
    with pytest.raises(SpawnException) as refused:
        await world.spawner("bob").start()
    assert (refused.value.status_code, refused.value.reason) == (503, "no_port")
    assert "Too many servers are running for the ports configured" in refused.value.message
    assert world.owner.get("jupyter-bob") is None and world.owner.ports.held == {"jupyter-alice": 20000}


async def test_a_restart_while_the_ledger_is_down_hands_out_no_gpu_until_its_open_records_are_read(
    tmp_path, monkeypatch
):
    """Alice's service was removed while the hub was down, her container still in its
    grace period; the restarted hub's first reconcile finds the ledger down. Only the
    ledger knows her GPU: bob is refused (503, try again), not given it; once the ledger
    answers, her record is booked as removing, and the GPU comes back when her container exits.

    Guards docs/reliability.md, "The fault model": "No GPU is handed out: a server removed while the
    hub was down may still run on its GPU, and only the ledger knows" and "The open records are read
    first; their GPUs come back once their containers have exited"."""
    w = World(tmp_path)
    await w.started(w.spawner("alice", {"gpu_model": A100}))
    w.fake.remove_service("jupyter-alice")  # her container keeps running
    w.restart()
    with monkeypatch.context() as m:
        m.setattr(Ledger, "open_allocations", ledger_down)
        bob = w.spawner("bob", {"gpu_model": A100})
        with pytest.raises(SpawnException) as exc:
            await w.started(bob)
        assert exc.value.status_code == 503 and exc.value.reason == "ledger_unavailable"
        assert "jupyter-bob" not in w.fake.service_names() and not w.hub.holdings.rebuilt
    # The ledger is back: the next spawn's reconcile reads alice's record first.
    with pytest.raises(SpawnException) as exc:
        await w.started(w.spawner("bob", {"gpu_model": A100}))
    assert exc.value.status_code == 409 and "jupyter-bob" not in w.fake.service_names()  # none free
    assert w.owner.get("jupyter-alice").phase is Phase.REMOVING
    w.fake.exit_all()
    await w.owner.reconcile()
    await w.started(w.spawner("bob", {"gpu_model": A100}))
    assert w.owner.get("jupyter-bob").held.uuids == ("GPU-b0",)


# -- a dependency that blinks: ledger calls failing at any step ----------------------------


def ledger_down(*_args, **_kw):
    """In place of a Ledger method: the database is down for a moment."""
    raise LedgerError("the ledger's database is unreachable")


def ledger_faults(step):
    """Any call on the ledger may fail, as a database that is down for a moment does."""
    if step.args and isinstance(step.args[0], Ledger):
        return LedgerError("the ledger's database is unreachable")
    return None


def ledger_keeps_up(world: World):
    """Refused or failed for a user, never another exception; and every live holding has
    its open ledger row (a row left open by a failed close is the reconcile's to close)."""

    def check(outcome):
        clean(outcome)
        open_ = {r.service for r in Ledger(world.db_url).open_allocations()}
        live = {name for name, h in world.owner.all().items() if h.held.uuids}
        # An adopted holding whose row could not be written is remembered: the next reconcile writes it.
        assert live - open_ <= world.owner._unopened, f"holdings {live - open_} have no open ledger row"

    return check


@pytest.mark.explore
@pytest.mark.parametrize("outage", [False, True], ids=["blinks", "down-for-a-while"])
def test_ledger_faults_at_any_step_never_give_a_gpu_away_while_a_container_may_run(tmp_path, outage):
    """A restarted hub (alice's leftover server), bob's and carol's spawns, a cancel and
    a stop, reconciles; up to two ledger calls fail anywhere, and (``outage``) the
    database may also go down at any point and come back, every call failing meanwhile.
    Checked after every step: no device booked above 1, and no running container names a
    device not booked to it.

    Guards docs/reliability.md, "The fault model": "every step keeps the GPU invariant (no device
    booked above 1; no running container names a device not booked to it), every live holding keeps
    its open ledger row", "300 schedules over the spawns", "about 580 faults injected in the first"
    and "The database may also be down for a while: at any point it goes down, every ledger call
    fails until it comes back (if it does), with up to two more blinks"."""
    runs: list[Run] = []

    def scenario(run: Run) -> Scenario:
        runs.append(run)
        down = [False]
        world = World(tmp_path, run.executor)
        world.leftover("alice")
        bob, carol = world.spawner("bob", {"gpu_model": A100}), world.spawner("carol", {"gpu_model": A100})
        alice = world.spawner("alice")

        async def stop_alice():
            try:
                await alice.stop()
            except SpawnException:
                pass  # JupyterHub reports it; the GPU must stay reserved while her container may run

        return Scenario(
            ops={"reconcile": lambda: world.owner.reconcile(), "bob": bob.start, "carol": carol.start},
            events={
                "exit_all": world.fake.exit_all,
                "run_all": world.fake.run_all,
                "stop_alice": stop_alice,
                "reconcile2": lambda: world.owner.reconcile(),
                **(
                    {"down": lambda: down.__setitem__(0, True), "up": lambda: down.__setitem__(0, False)}
                    if outage
                    else {}
                ),
            },
            cancellable=("bob",),
            faults=ledger_faults,
            max_faults=2,
            outage=lambda step: ledger_faults(step) if down[0] else None,
            invariant=world.invariant,
            check=ledger_keeps_up(world),
        )

    stats = random_schedules(scenario, seed=11, n=300 if not outage else 150)
    assert stats.schedules == scaled(300 if not outage else 150)
    if outage:  # the outage met calls in many runs
        assert sum(1 for r in runs if r.outage_failures) >= len(runs) // 3, Counter(r.outage_failures for r in runs)


async def test_an_adopted_holding_the_ledger_could_not_record_is_recorded_at_the_next_reconcile(tmp_path, monkeypatch):
    """Else its GPU-hours would never count, and a next hub would not know that a
    container may still run on its device once its service is gone."""
    world = World(tmp_path)
    world.leftover("alice")
    with monkeypatch.context() as m:
        m.setattr(Ledger, "open", ledger_down)
        await world.owner.reconcile()
    assert world.owner.get("jupyter-alice") is not None
    assert Ledger(world.db_url).open_allocations() == []
    await world.owner.reconcile()
    [row] = Ledger(world.db_url).open_allocations()
    assert (row.service, row.devices) == ("jupyter-alice", ("GPU-b0",))


async def test_a_removal_whose_answer_is_lost_keeps_the_gpu_until_its_container_has_exited(tmp_path):
    """Alice's leftover server (adopted at hub start, its tasks not yet seen) is stopped;
    Docker removes the service but the answer is lost. Her container still runs past the
    stop timeout: her GPU stays hers until it has exited, then comes back.

    Guards docs/reliability.md, "The fault model": "A removal whose answer was lost keeps the GPU
    until the container has exited, however long that takes"."""
    now = [0.0]
    w = World(tmp_path, clocks={"clock": lambda: now[0]})
    w.leftover("alice")
    owner = w.owner
    await owner.reconcile()
    w.fake.fail_next("remove_service", status=None, message="dropped", applied=True)
    assert not await owner.remove("jupyter-alice", wait=0)
    assert "jupyter-alice" not in w.fake.service_names() and w.fake.running_containers()
    for _ in range(2):  # the stop timeout passes twice, as a blind wait would count it
        now[0] += 10 * w.config.GPUSwarmSpawner.server_stop_timeout
        await owner.reconcile()
        assert owner.get("jupyter-alice").held.uuids == ("GPU-b0",)
    w.fake.exit_all()
    await owner.reconcile()
    assert owner.get("jupyter-alice") is None and Ledger(w.db_url).open_allocations() == []


# -- a dependency that blinks: Docker API calls failing at any step ------------------------


def docker_faults(*calls: str):
    """Faults for those Docker API calls, as a connection that drops: before the daemon
    got the call, or after it acted (the caller cannot tell which). Not for the
    ``settled`` op, which looks once Docker answers again."""
    assert set(calls) <= API_CALLS, set(calls) - API_CALLS

    def faults(step):
        if step.label.split(": ", 1)[-1].split("(", 1)[0] not in calls or step.label.startswith("settled"):
            return None
        return [
            requests.ConnectionError("the Docker API is unreachable"),
            AnswerLost(requests.ConnectionError("dropped")),
        ]

    return faults


async def as_jupyterhub_spawns(spawner):
    """JupyterHub's spawn: start; if that fails or is cancelled, stop (whose own failure it logs)."""
    try:
        return await spawner.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await spawner.stop()
        raise


@pytest.mark.explore
@pytest.mark.parametrize(
    "calls",
    [("create_service",), ("remove_service",), ("tasks", "services", "nodes", "inspect_service")],
    ids=["create", "remove", "reads"],
)
def test_docker_faults_at_any_step_never_give_a_gpu_away_and_leave_none_held_for_nothing(tmp_path, calls):
    """A restarted hub (alice's leftover server on one of two GPUs), bob's and carol's
    spawns, a cancel and a stop, reconciles; up to two Docker calls fail anywhere, before
    or after the daemon acted. Checked after every step: no device booked above 1, no running container on a
    device not booked to it. Then, once Docker answers again, the containers have exited
    and the stop timeout has passed (a removal nobody could confirm waits that long), a
    reconcile leaves a GPU held only by a server that is still there.

    Guards docs/reliability.md, "The fault model": "a user only ever gets a refusal or a failed
    spawn with its message", "a reconcile leaves a GPU held only by a service that still exists,
    with its open ledger row, and no failed spawn's service behind" and "300 schedules for each of
    create_service, remove_service and the reads"."""
    injected = Counter()  # faults made, before and after the daemon acted

    def scenario(run: Run) -> Scenario:
        two = {"gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920} for i in range(2)]}
        world = World(tmp_path, run.executor, inventory=two, clocks={"clock": run.loop.time})
        world.leftover("alice")
        spawners = {u: world.spawner(u, {"gpu_model": A100}) for u in ("bob", "carol")}
        alice = world.spawner("alice")
        settling = False

        async def stop_alice():
            with contextlib.suppress(SpawnException):
                await alice.stop()  # JupyterHub reports a failure; the GPU stays reserved meanwhile

        def unless_settling(event):
            return lambda: None if settling else event()

        async def settled():
            nonlocal settling
            while others := [t for n, t in run.tasks.items() if n != "settled" and not t.done()]:
                await asyncio.wait(others)
            settling = True
            world.fake.exit_all()
            await asyncio.sleep(world.config.GPUSwarmSpawner.server_stop_timeout)  # what a blind wait allows
            await world.owner.reconcile()

        def check(outcome):
            injected.update(
                "after" if "after it ran" in c else "before" for c in outcome.labels if c.startswith("fail ")
            )
            for name, exc in outcome.errors.items():  # a user is told; the reconcile loop logs and retries
                allowed = SwarmError if name.startswith("reconcile") else (SpawnException, asyncio.CancelledError)
                assert name != "settled" and isinstance(exc, allowed), f"{name} raised {exc!r}"
            services = set(world.fake.service_names())
            held = {name for name, h in world.owner.all().items() if h.held.uuids}
            assert held <= services, f"{held - services} hold a GPU with no service left"
            open_ = {r.service for r in Ledger(world.db_url).open_allocations()}
            assert open_ == held, f"ledger open {open_} but holdings {held}"
            for user in ("bob", "carol"):
                if user in outcome.errors:
                    assert f"jupyter-{user}" not in services, f"{user}'s failed spawn left its service"

        return Scenario(
            ops={
                "reconcile": lambda: world.owner.reconcile(),
                "bob": lambda: as_jupyterhub_spawns(spawners["bob"]),
                "carol": lambda: as_jupyterhub_spawns(spawners["carol"]),
                "settled": settled,
            },
            events={
                "exit_all": unless_settling(world.fake.exit_all),
                "run_all": unless_settling(world.fake.run_all),
                "stop_alice": unless_settling(stop_alice),
                "reconcile2": unless_settling(lambda: world.owner.reconcile()),
            },
            cancellable=("bob",),
            faults=docker_faults(*calls),
            max_faults=2,
            invariant=world.invariant,
            check=check,
        )

    stats = random_schedules(scenario, seed=12, n=300)
    assert stats.schedules == scaled(300) and injected["before"] > 50 and injected["after"] > 50, injected
