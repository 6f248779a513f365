"""The line per GPU model: the pure order rules (gpuspawner.core.line_order), its rows in
the ledger (gpuspawner.ledger.line, on SQLite), and waiting spawns of the real
spawner over the fake swarm, also under interleavings (tests/interleave.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections import Counter
from datetime import datetime, timedelta, timezone

import jinja2
import pytest
from jupyterhub.spawner import SpawnException
from prometheus_client import REGISTRY

from gpuspawner import hub_port, hubconfig
from gpuspawner.core.line_order import Waiter, by_model, estimate, fmt_duration, held_now, ordered, position
from gpuspawner.ledger.ledger import Ledger
from gpuspawner.line import wait as line_wait
from gpuspawner.spawn.errors import spawn_error
from gpuspawner.web.api import queue_json
from gpuspawner.web.home_gpus import server_rows
from tests.interleave import Run, Scenario, random_schedules, scaled
from tests.unit.test_form_template import _TreeBuilder
from tests.unit.test_holdings import A100, KEY, World, clean, driven, ledger_down

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
WAIT = {"gpu_model": A100, "gpu_wait": True}
# What a waiter is told it waits for, once its line was served (test_line_backfill.py tells it exactly).
WHY = r"(\. (Kept for you: [^.]*|Every host that could take your request is kept for a request ahead of yours))?"


def waiter(id_, model=A100, priority=0, minutes=0, service=None):
    return Waiter(id_, service or f"s{id_}", f"u{id_}", "", model, priority, T0 + timedelta(minutes=minutes))


# -- the order ---------------------------------------------------------------------


def test_higher_priority_first_then_first_come_first_served():
    a, b, c = waiter(1, minutes=0), waiter(2, minutes=1), waiter(3, priority=10, minutes=2)
    assert ordered([a, b, c]) == [c, a, b]
    # Equal times: arrival order (the database's id) decides.
    d, e = waiter(5), waiter(4)
    assert ordered([d, e]) == [e, d]


def test_each_model_has_its_own_line_and_positions_count_from_one():
    a, b, g = waiter(1), waiter(2), waiter(3, model="GTX")
    assert by_model([g, b, a]) == {A100: [a, b], "GTX": [g]}
    assert position([a, b, g], "s2") == (A100, 2)
    assert position([a, b, g], "s3") == ("GTX", 1)
    assert position([a, b, g], "nobody") is None


def test_the_estimate_is_labelled_and_grows_with_the_place_in_line():
    assert estimate([], 1, 2) == ""
    one = estimate([3600, 1800, 7200], 1, 2)
    assert one == "Estimate: about 60 min (servers of this model run 60 min at the median)"
    assert estimate([3600], 3, 2).startswith("Estimate: about 2.0 h")
    assert [fmt_duration(s) for s in (0.2, 59, 600, 9000)] == ["1 s", "59 s", "10 min", "2.5 h"]


def test_before_any_server_of_the_model_ended_the_line_says_who_holds_it_since_when():
    assert held_now([]) == ""
    assert held_now([600]) == "No server of this model has ended yet; 1 holds it now, for 10 min"
    assert held_now([600, 9000, 30]) == (
        "No server of this model has ended yet; 3 hold it now, the longest for 2.5 h, the newest for 30 s"
    )


# -- the ledger's rows ---------------------------------------------------------------


@pytest.fixture
def ledger(tmp_path):
    return Ledger(f"sqlite:///{tmp_path}/ledger.sqlite")


def test_the_line_is_kept_in_the_ledger_in_arrival_order(ledger, tmp_path):
    first = ledger.enqueue("jupyter-a", "a", "", A100, 0, {"gpu_model": A100, "gpu_wait": True})
    second = ledger.enqueue("jupyter-b", "b", "gpu", A100, 5, {"gpu_model": A100})
    again = ledger.enqueue("jupyter-a", "a", "", A100, 0, {})  # a resumed spawn keeps its place
    assert again == first and first.id < second.id
    # Another Ledger on the same database (a restarted hub) reads the same line.
    rows = Ledger(f"sqlite:///{tmp_path}/ledger.sqlite").waiting()
    assert [(w.service, w.user, w.server, w.priority, w.request) for w in rows] == [
        ("jupyter-a", "a", "", 0, {"gpu_model": A100, "gpu_wait": True}),
        ("jupyter-b", "b", "gpu", 5, {"gpu_model": A100}),
    ]
    assert ledger.dequeue("jupyter-a") is True and ledger.dequeue("jupyter-a") is False
    assert [w.service for w in ledger.waiting()] == ["jupyter-b"]


@pytest.mark.parametrize(
    "args, message",
    [
        (("", "a", "", A100, 0, {}), "service must not be empty"),
        (("s", "a", "", "", 0, {}), "model must not be empty"),
        (("s", "a", "", A100, "1", {}), "priority must be a whole number"),
        (("s", "a", "", A100, 0, {"x": "y" * 5000}), "longer than 4096 characters"),
    ],
)
def test_bad_rows_are_refused_and_change_nothing(ledger, args, message):
    with pytest.raises(ValueError, match=message):
        ledger.enqueue(*args)
    assert ledger.waiting() == []


def test_run_seconds_are_those_of_ended_servers_of_the_model(ledger):
    ledger.open("s1", "a", "", "gpu-a", A100, ["GPU-1"], [1000], started_at=T0)
    ledger.close("s1", T0 + timedelta(minutes=30))
    ledger.open("s2", "b", "", "gpu-a", A100, ["GPU-2"], [1000], started_at=T0)  # still open: not counted
    ledger.open("s3", "c", "", "gpu-b", "GTX", ["GPU-3"], [1000], started_at=T0)
    ledger.close("s3", T0 + timedelta(hours=2))
    assert ledger.run_seconds(A100) == [1800.0]
    assert ledger.run_seconds("GTX") == [7200.0]


# -- waiting spawns (the real spawner, the fake swarm, a SQLite ledger) ------------------


async def until(predicate, seconds=30.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def stopped(world: World, spawner) -> None:
    """The spawner's stop, with its containers exiting as the swarm removes them."""
    await driven(spawner.stop(), world.fake.exit_all)


def messages(spawner) -> list[str]:
    return [e["message"] for e in spawner._progress.events]


async def two_in_line(world: World):
    """Alice holds the one A100; bob waits first (his start drives the swarm), carol
    second (she never gets a task): (alice, bob, carol, bob's start, carol's start)."""
    alice = world.spawner("alice", {"gpu_model": A100})
    await world.started(alice)
    bob, carol = world.spawner("bob", WAIT), world.spawner("carol", WAIT)
    bob_start = asyncio.ensure_future(world.started(bob))
    await until(lambda: world.hub.line.place(bob.service_name) == (A100, 1))
    carol_start = asyncio.ensure_future(carol.start())
    await until(lambda: any("number 2" in m for m in messages(carol)))
    return alice, bob, carol, bob_start, carol_start


async def test_once_a_server_of_the_model_has_ended_a_waiter_is_given_an_estimate(tmp_path):
    world = World(tmp_path)
    dave = world.spawner("dave", {"gpu_model": A100})
    await world.started(dave)
    await driven(dave.stop(), world.fake.exit_all)  # one run of the A100 ended
    alice, bob, carol, bob_start, carol_start = await two_in_line(world)
    assert re.fullmatch(
        rf"You are number 2 in line for {A100}{WHY}\. Estimate: about \d+ s \(.*\)", messages(carol)[-1]
    )
    assert server_rows(world.hub, "carol")[0]["outlook"].startswith("Estimate: about")
    for start in (bob_start, carol_start):
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await start


async def test_a_waiter_gets_the_gpu_its_holder_gives_back_and_the_next_moves_up(tmp_path):
    world = World(tmp_path)
    alice, bob, carol, bob_start, carol_start = await two_in_line(world)
    known = r"No server of this model has ended yet; 1 holds it now, for \d+ s"  # alice's, seconds ago
    assert re.fullmatch(rf"You are number 1 in line for {A100}{WHY}\. {known}", messages(bob)[-1])
    assert re.fullmatch(rf"You are number 2 in line for {A100}{WHY}\. {known}", messages(carol)[-1])
    [home] = server_rows(world.hub, "carol")  # the home page
    assert home["waiting"] == f"Number 2 in line for {A100}" and re.fullmatch(known, home["outlook"])
    # What is known is as of when the page is read: alice has held it for longer by then.
    world.hub.line._outlook[carol.service_name] = [datetime.now(timezone.utc) - timedelta(minutes=40)]
    assert server_rows(world.hub, "carol")[0]["outlook"].endswith("1 holds it now, for 40 min")
    assert [w.user for w in Ledger(world.db_url).waiting()] == ["bob", "carol"]
    # Someone without gpu_wait is refused at once: the line goes first.
    with pytest.raises(SpawnException) as exc:
        await world.spawner("dave", {"gpu_model": A100}).start()
    assert exc.value.status_code == 409 and "2 requests are waiting in line" in exc.value.message
    await stopped(world, alice)
    await bob_start
    assert world.owner.get(bob.service_name).held.uuids == ("GPU-b0",)
    await until(lambda: any("number 1" in m for m in messages(carol)))
    assert [w.user for w in Ledger(world.db_url).waiting()] == ["carol"]
    assert REGISTRY.get_sample_value("gpuspawner_line_length", {"model": A100}) == 1
    assert REGISTRY.get_sample_value("gpuspawner_wait_seconds_count", {"model": A100}) >= 1
    lines = await queue_json(world.hub.line)
    assert [(w["user"], w["position"], w["request"]) for w in lines[A100]] == [("carol", 1, WAIT)]
    assert admin_page(lines) == [["1", "carol", "", lines[A100][0]["since"], "gpu-b", ""]]
    carol_start.cancel()  # the Cancel button
    with pytest.raises(asyncio.CancelledError):
        await carol_start
    assert world.hub.line.rows == []  # out of line at once
    assert [w.user for w in Ledger(world.db_url).waiting()] == ["carol"]  # the row: until her server is stopped
    await carol.stop()  # as JupyterHub's DELETE does after cancelling
    assert Ledger(world.db_url).waiting() == []
    assert REGISTRY.get_sample_value("gpuspawner_line_length", {"model": A100}) == 0
    assert await queue_json(world.hub.line) == {} and admin_page({}) == []
    world.ledger_matches()


def admin_page(lines: dict) -> list[list[str]]:
    """The rows of the lines on /hub/gpus (gpus.html, in a stand-in page)."""
    templates = hubconfig.TEMPLATES
    page = jinja2.DictLoader({"page.html": "<main>{% block main %}{% endblock %}</main>"})
    env = jinja2.Environment(loader=jinja2.ChoiceLoader([page, jinja2.FileSystemLoader(templates)]), autoescape=True)
    html = env.get_template("gpus.html").render(base_url="/hub/", hosts="", stale={}, lines=lines)
    if not lines:
        assert "Nobody is waiting for a GPU." in html
    builder = _TreeBuilder()
    builder.feed(html)
    return [[td.text for td in tr.find_all("td")] for tr in builder.root.find_all("tr") if tr.find_all("td")]


async def test_a_wait_ends_after_gpu_wait_timeout_with_a_clear_message(tmp_path):
    world = World(tmp_path, gpu_wait_timeout=2)
    await world.started(world.spawner("alice", {"gpu_model": A100}))
    bob = world.spawner("bob", WAIT)
    with pytest.raises(SpawnException) as exc:
        await bob.start()
    assert exc.value.status_code == 409
    assert exc.value.message == (
        "No GPU became free for you within 0.000555556 h of waiting in line (gpu_wait_timeout); please try again later."
    )
    assert Ledger(world.db_url).waiting() == [] and world.owner.get(bob.service_name) is None


async def test_a_request_that_could_never_fit_does_not_enter_the_line(tmp_path):
    world = World(tmp_path, max_gpus_per_user=2)
    with pytest.raises(SpawnException) as exc:
        await world.spawner("bob", {**WAIT, "gpu_count": 2}).start()
    assert exc.value.status_code == 400 and Ledger(world.db_url).waiting() == []


def test_waiting_spawns_hold_no_slot_of_the_concurrent_spawn_limit():
    settings = {"concurrent_spawn_limit": 3}
    hub_port.hold_spawn_slot(settings, +1)
    hub_port.hold_spawn_slot(settings, +1)
    assert settings["concurrent_spawn_limit"] == 5
    hub_port.hold_spawn_slot(settings, -1)
    hub_port.hold_spawn_slot(settings, -1)
    assert settings["concurrent_spawn_limit"] == 3
    unlimited = {"concurrent_spawn_limit": 0}
    hub_port.hold_spawn_slot(unlimited, +1)
    assert unlimited["concurrent_spawn_limit"] == 0


def test_jupyterhubs_start_timeout_is_extended_while_a_spawn_may_wait(tmp_path):
    world = World(tmp_path, gpu_wait_timeout=600)
    s = world.spawner("bob", WAIT)
    s.start_timeout = 60
    s.run_pre_spawn_hook()
    assert s.start_timeout == 660
    s.user_options = {"gpu_model": A100}
    s.run_pre_spawn_hook()
    assert s.start_timeout == 60


# -- interleavings -------------------------------------------------------------------


def line_is_consistent(world: World, *waiters):
    def check(outcome):
        clean(outcome)
        world.ledger_matches()
        # Whoever finished is out of line, in memory and in the ledger.
        assert world.hub.line.rows == []
        assert Ledger(world.db_url).waiting() == []
        for s in waiters:
            h = world.owner.get(s.service_name)
            if s.service_name in outcome.errors:  # cancelled or refused: holds nothing
                assert h is None or h.phase.value == "removing", (s.service_name, h)

    return check


def waiting_scenario(
    run: Run,
    tmp_path,
    extra_events=None,
    seen=None,
    cancel=True,
    faults=None,
    wait_timeout=5,
    also_waiting=(),
    outage=None,
) -> Scenario:
    """Alice's server (left by an earlier hub, adopted at first use) holds the
    one GPU; bob waits in line for it (up to ``wait_timeout`` s), then each of
    ``also_waiting``; alice's server may be stopped at any point. ``faults``: the
    scenario's (tests/interleave.py), e.g. ledger calls that fail; ``outage``: the
    calls that fail while the events ``down`` and ``up`` say the dependency is down."""
    world = World(tmp_path, run.executor, gpu_wait_timeout=wait_timeout)
    world.leftover("alice")
    bob = world.spawner("bob", WAIT)
    waiters = {"bob": bob, **{name: world.spawner(name, WAIT) for name in also_waiting}}
    down = [False]

    async def starts(spawner):
        try:
            await spawner.start()
        except asyncio.CancelledError:  # JupyterHub's DELETE: cancel, then stop
            try:
                await spawner.stop()
            except SpawnException:
                pass  # its container still runs: the reconcile finishes the removal
            raise

    def check(outcome):
        clean(outcome)
        # Out of line; a row the ledger kept (it failed as he left) is one the line will remove.
        left = {w.service for w in Ledger(world.db_url).waiting()}
        assert world.hub.line.rows == [] and left <= world.hub.line._unrecorded, left
        for name, spawner in waiters.items():
            said = messages(spawner)
            assert sum(m.startswith("Reserved") for m in said) <= 1, said  # served once at most
            refused = outcome.errors.get(name)
            if getattr(refused, "reason", None) == "ledger_unavailable":  # only before it had a place
                assert not any(m.startswith("You are number") for m in said), said
            h = world.owner.get(spawner.service_name)
            if seen is not None and name == "bob":  # served: the line reserved for him (his start may still fail after)
                seen.append("served" if any(m.startswith("Reserved") for m in said) else type(refused).__name__)
            if name in outcome.errors:  # cancelled or timed out: holds nothing (or is being removed)
                assert h is None or h.phase.value == "removing", h
            else:  # served: holds the GPU, and the ledger says so
                assert h is not None and h.held.uuids == ("GPU-b0",)
                assert spawner.service_name in {r.service for r in Ledger(world.db_url).open_allocations()}

    joined: list[str] = []  # the waiters in the order they first had a place in line

    def invariant():
        world.invariant()
        # A later waiter holds the GPU only once those ahead of it have left the line.
        hub = world.hub_settings.get(KEY)  # (not made here: the scenario's first step makes it)
        if not (hub and hub._holdings):
            return
        joined.extend(n for n, s in waiters.items() if n not in joined and hub.line.place(s.service_name))
        for i, name in enumerate(joined):
            if hub._holdings.get(waiters[name].service_name) is not None:
                ahead = [n for n in joined[:i] if hub.line.place(waiters[n].service_name) is not None]
                assert not ahead, f"{name} was served while {ahead} waited"

    events = {
        # (once the hub holds it: a leftover removed before it is adopted is another matter)
        "stop_alice": lambda: world.owner.remove("jupyter-alice") if world.owner.get("jupyter-alice") else None,
        "run_all": world.fake.run_all,
        "exit_all": world.fake.exit_all,
        **(extra_events(world, bob) if extra_events else {}),
    }
    if outage is not None:
        events |= {"down": lambda: down.__setitem__(0, True), "up": lambda: down.__setitem__(0, False)}
    return Scenario(
        ops={name: functools.partial(starts, spawner) for name, spawner in waiters.items()},
        events=events,
        cancellable=("bob",) if cancel else (),
        faults=faults,
        max_faults=2,
        outage=(lambda step: outage(step) if down[0] else None) if outage is not None else None,
        invariant=invariant,
        check=check,
    )


@pytest.mark.explore
def test_cancel_during_the_wake_up_leaves_no_gpu_reserved_and_the_line_empty(tmp_path):
    seen: list[str] = []
    stats = random_schedules(lambda run: waiting_scenario(run, tmp_path, seen=seen), seed=14, n=150)
    assert stats.schedules == scaled(150)
    assert "CancelledError" in seen


@pytest.mark.explore
def test_a_release_racing_a_new_request_never_lets_it_go_ahead_of_the_waiter(tmp_path):
    """Carol (no gpu_wait) asks at any point: while bob waits she never gets the GPU."""
    ahead: list[bool] = []

    def carol(world: World, bob):
        async def start():
            s = world.spawner("carol", {"gpu_model": A100})
            await s.start()
            ahead.append(world.hub.line.place(bob.service_name) is not None)

        return {"carol": start}

    seen: list[str] = []
    stats = random_schedules(
        lambda run: waiting_scenario(run, tmp_path, extra_events=carol, seen=seen, cancel=False), seed=15, n=150
    )
    assert stats.schedules == scaled(150) and not any(ahead)
    assert "served" in seen, sorted(set(seen))  # bob got the GPU in some schedules, timed out in others


async def test_a_ledger_error_as_a_gpu_frees_keeps_every_waiter_in_line_and_the_head_is_served_once_it_is_back(
    tmp_path, monkeypatch
):
    """The head's reservation cannot be recorded for a moment: that may pass, so
    nobody is thrown out of the line (and told to retry while their row stays).

    Guards docs/line.md, "When a dependency fails": "A failure that may pass keeps everyone's place"
    and "the first waiter's reservation cannot be recorded (the ledger's database is down)".

    Guards docs/reliability.md, "The fault model": "The first waiter keeps its place, and so does
    everyone behind it; the line is tried again every 10 s" and "The first waiter is served"."""
    monkeypatch.setattr(line_wait, "RETRY_SECONDS", 0.1)
    world = World(tmp_path)
    alice, bob, carol, bob_start, carol_start = await two_in_line(world)
    with monkeypatch.context() as m:
        m.setattr(Ledger, "open", ledger_down)
        await stopped(world, alice)
        await asyncio.sleep(0.5)  # several tries of the line
        assert not bob_start.done() and not carol_start.done()
        assert world.hub.line.place(bob.service_name) == (A100, 1)
        assert world.hub.line.place(carol.service_name) == (A100, 2)
        assert bob.service_name not in world.fake.service_names()  # nothing made that the ledger has not recorded
    await asyncio.wait_for(bob_start, 5)
    assert world.owner.get(bob.service_name).held.uuids == ("GPU-b0",)
    assert world.hub.line.place(carol.service_name) == (A100, 1)
    carol_start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await carol_start
    await carol.stop()
    world.ledger_matches()


@pytest.mark.parametrize("reason", sorted(line_wait.PASSING))
async def test_a_refusal_that_may_pass_keeps_the_place_and_the_line_is_tried_again(tmp_path, monkeypatch, reason):
    """The ledger down, no free host port, the old service still going: the waiter stays first.

    Guards docs/line.md, "When a dependency fails": "no port of host_network_ports is free, or the
    waiter's previous server is still being removed, nobody is told to go away" and "the line is
    tried again when devices come back, and every 10 seconds".

    Guards docs/reliability.md, "The fault model": "Also when no host_network_ports port is free, or
    the waiter's previous service is still being removed"."""
    monkeypatch.setattr(line_wait, "RETRY_SECONDS", 0.05)
    line = World(tmp_path).hub.line
    await line.join("jupyter-bob", "bob", "", A100, 0, WAIT)
    tries = []

    async def reserve(avoid):
        tries.append(line.place("jupyter-bob"))
        if len(tries) < 3:
            raise spawn_error("not now", reason=reason, status_code=503)
        return "the holding"

    assert await asyncio.wait_for(line.wait("jupyter-bob", reserve, 10, lambda _: None), 5) == "the holding"
    assert tries == [(A100, 1)] * 3 and line.rows == []


async def test_after_none_free_the_form_keeps_the_choice_and_suggests_the_line(tmp_path):
    world = World(tmp_path)
    await world.started(world.spawner("alice", {"gpu_model": A100}))
    bob = world.spawner("bob", {"gpu_model": A100, "gpu_count": 1})
    with pytest.raises(SpawnException) as exc:
        await bob.start()
    assert exc.value.status_code == 409
    html = await bob._render_options_form()  # JupyterHub shows the form again, with bob's options kept
    radio = re.search(rf'<input[^>]*value="{re.escape(A100)}"[^>]*>', html)[0]
    assert "checked" in radio and "disabled" not in radio
    assert 'id="gpu-wait-hint"' in html and "tick this to wait in line for one" in html


@pytest.mark.parametrize("bad", ["maybe", "yes", ""])
async def test_a_bad_gpu_wait_from_the_form_is_refused_as_the_rest_api_refuses_it_and_nothing_starts(tmp_path, bad):
    """Guards docs/line.md: "In the spawn form, `gpu_wait` is the checkbox (sent as `on`; `true`
    and `false` are read too); any other value is refused as the REST API refuses it, with the
    same message, and nothing starts or is reserved." (A GPU is free: read as "do not wait", the
    form's request would start.)"""
    world = World(tmp_path)
    form = world.spawner("bob", {})
    # What JupyterHub does with the form's fields: the spawner's options_from_form makes its user_options.
    form.user_options = form.options_from_form({"gpu_model": [A100], "gpu_count": ["1"], "gpu_wait": [bad]})
    rest = world.spawner("carol", {"gpu_model": A100, "gpu_count": 1, "gpu_wait": bad})  # the JSON body's
    told = []
    for spawner in (form, rest):
        with pytest.raises(SpawnException) as refused:
            await world.started(spawner)
        assert (refused.value.status_code, refused.value.reason) == (400, "invalid_options")
        told.append(refused.value.jupyterhub_message)
        assert world.owner.get(spawner.service_name) is None and world.hub.line.place(spawner.service_name) is None
    assert told == [f"gpu_wait must be true or false; got {bad!r}"] * 2
    assert world.fake.service_names() == [] and Ledger(world.db_url).open_allocations() == []
    await world.started(world.spawner("dave", {"gpu_model": A100}))  # the A100 was free all along


async def test_an_admin_takes_a_waiting_request_out_of_the_line_and_its_wait_ends_saying_so(tmp_path):
    world = World(tmp_path)
    _, bob, carol, bob_start, carol_start = await two_in_line(world)
    assert world.hub.line.place(carol.service_name) == (A100, 2)
    ended = spawn_error("taken out", reason="line_removed", status_code=503)
    row = await world.hub.line.remove("bob", "", ended)
    assert (row.user, row.model) == ("bob", A100)
    with pytest.raises(SpawnException) as exc:
        await asyncio.wait_for(bob_start, 5)
    assert exc.value is ended
    assert [w.user for w in Ledger(world.db_url).waiting()] == ["carol"]
    await until(lambda: world.hub.line.place(carol.service_name) == (A100, 1))  # carol moves up
    assert await world.hub.line.remove("bob", "", ended) is None  # no longer in line
    assert await world.hub.line.remove("carol", "other", ended) is None  # another server of hers: not in line
    carol_start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await carol_start
    await carol.stop()


@pytest.mark.explore
def test_ledger_faults_while_waiting_never_throw_a_waiter_out_nor_leave_a_row_for_the_next_hub(tmp_path):
    """Up to two ledger calls fail at any step of a wait, its wake-up, a cancel or a
    stop: a waiter is refused only before it had a place; once it had one it is
    served, cancelled or timed out, never told to retry; a row the ledger could not
    drop is remembered to be dropped (else the next hub would resume that spawn).

    Guards docs/reliability.md, "The fault model": "a waiter is refused only before it had a place,
    and a line row the ledger could not drop is dropped once it answers" and "300 over the line"."""
    from tests.unit.test_holdings import ledger_faults

    seen: list[str] = []
    for cancel in (True, False):  # random choices cancel early when they may; without, waits are served
        stats = random_schedules(
            lambda run, c=cancel: waiting_scenario(run, tmp_path, seen=seen, cancel=c, faults=ledger_faults),
            seed=21,
            n=150,
        )
        assert stats.schedules == scaled(150)
    assert {"served", "SpawnException", "CancelledError"} <= set(seen)  # every end was reached


@pytest.mark.explore
def test_a_ledger_down_for_a_while_with_two_in_line_throws_nobody_out_and_serves_each_at_most_once(tmp_path):
    """The ledger's database goes down at any point and may come back (every call
    fails meanwhile), and up to two more calls blink, while bob and carol wait for
    alice's GPU: the GPU invariant holds at every step; nobody is told to retry once
    they had a place, nobody is served twice, carol only once bob has left, and no row
    is left for the next hub.

    Guards docs/reliability.md, "The fault model": "over two users waiting in line for one GPU while
    its holder stops" and "nobody is served twice, the second in line is served only once the first
    has left, and nobody who had a place is told to retry"."""
    from tests.unit.test_holdings import ledger_faults

    runs: list[Run] = []
    seen: list[str] = []

    def scenario(run: Run, cancel: bool) -> Scenario:
        runs.append(run)
        return waiting_scenario(
            run,
            tmp_path,
            seen=seen,
            cancel=cancel,
            also_waiting=("carol",),
            faults=ledger_faults,
            outage=ledger_faults,
            wait_timeout=60,  # long enough for alice's stop to come in many schedules
        )

    for cancel in (True, False):  # random choices cancel early when they may; without, waits are served
        stats = random_schedules(lambda run, c=cancel: scenario(run, c), seed=23, n=100)
        assert stats.schedules == scaled(100)
    failed = [r.outage_failures for r in runs]
    assert sum(1 for f in failed if f) >= len(runs) // 3, Counter(failed)  # the outage met calls in many runs
    assert {"served", "SpawnException", "CancelledError"} <= set(seen), Counter(seen)


@pytest.mark.explore
def test_docker_faults_while_waiting_keep_the_gpu_invariant_and_leave_nothing_behind(tmp_path):
    """Up to two creations or removals of services fail (before or after the daemon
    acted) at any step of a wait, its wake-up, a cancel or alice's stop: the GPU
    invariant holds at every step, and bob ends served (holding the GPU, in the ledger),
    or out of line holding nothing.

    Guards docs/reliability.md, "The fault model": "the waiter ends served or out of line holding
    nothing", "800 schedules" and "the test requires each kind of fault, a creation or a removal
    failing before or after the daemon acted, at least twice"."""
    from tests.unit.test_holdings import docker_faults

    seen: list[str] = []
    injected = Counter()  # faults made, by call and whether the daemon had acted
    faults = docker_faults("create_service", "remove_service")

    def counted(run, cancel):
        scenario = waiting_scenario(run, tmp_path, seen=seen, cancel=cancel, faults=faults, wait_timeout=60)
        check = scenario.check

        def count_then_check(outcome):
            for label in outcome.labels:
                if label.startswith("fail "):
                    call = label.split(": ", 2)[1].split("(")[0]
                    injected[(call, "after" if "after it ran" in label else "before")] += 1
            check(outcome)

        scenario.check = count_then_check
        return scenario

    for cancel in (True, False):
        stats = random_schedules(lambda run, c=cancel: counted(run, c), seed=24, n=400)
        assert stats.schedules == scaled(400)
    assert {"served", "SpawnException", "CancelledError"} <= set(seen), Counter(seen)
    assert all(
        injected[(call, when)] >= 2 for call in ("create_service", "remove_service") for when in ("before", "after")
    ), injected
