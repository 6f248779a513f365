"""Reservations at the hub: the real spawner, holdings, keeper and SQLite ledger
over the Docker fake (tests/unit/test_holdings.World), with the wall clock set
by the test and JupyterHub's groups as a small fake. A reservation's open
window keeps its GPUs from others, lets its members have them, shows on the
form, and makes room at its start by stopping others' servers with the end
reason ``reservation``."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException

from gpuspawner.core.requests import Request
from gpuspawner.core.reservations import RESERVATION, Reservation
from gpuspawner.hub.app import KEY, GPUHub
from gpuspawner.ledger.ledger import Ledger, LedgerError
from gpuspawner.plan.reservations import Keep
from gpuspawner.reclaim import reservations as reservations_module
from gpuspawner.reclaim.reservations import NOTICE_BEFORE
from tests.unit.test_holdings import A100, World, driven
from tests.unit.test_reclaim import TWO_GPUS

NOW = datetime(2026, 12, 8, 13, 0, tzinfo=timezone.utc)
GROUPS = {"alice": ["cs101"], "bob": [], "carol": ["physics"], "dan": []}


class Wall:
    def __init__(self):
        self.now = NOW

    def __call__(self) -> float:
        return self.now.timestamp()


def new_hub(world: World, wall: Wall) -> None:
    """The world's hub, made (again) with the test's wall clock and groups."""
    world.hub_settings[KEY] = GPUHub.from_config(world.config, world.cls, clock=lambda: 0.0, wall=wall)
    world.wall = wall
    keeper = world.hub.reservations
    keeper.groups_of = lambda user: GROUPS.get(user)
    keeper.clock = lambda: wall.now.timestamp()  # every look reads the ledger again (30 s apart)


@pytest.fixture
def hub(tmp_path):
    world = World(tmp_path, inventory=TWO_GPUS)
    new_hub(world, Wall())
    return world


def spawner(world: World, user: str, options=None):
    s = world.spawner(user, options or {"gpu_model": A100, "gpu_count": 1})
    s.user.groups = [SimpleNamespace(name=g) for g in GROUPS[user]]
    return s


def exit_removed(world: World) -> None:
    """The containers of removed services exit, as their nodes stop them."""
    names = set(world.fake.service_names())
    for task, (service, _node, _visible) in world.fake.running_containers().items():
        if service not in names:
            world.fake.exit_container(task)


def reserve(world: World, start: datetime, hours: float = 2, count: int = 1, **kw) -> Reservation:
    r = Reservation("cs101", A100, count, start, start + timedelta(hours=hours), name="CS101", **kw)
    return Ledger(world.db_url).add_reservation(r)


async def test_an_open_window_keeps_its_gpu_from_others_and_gives_it_to_a_member(hub):
    """Guards docs/reservations.md, "While a window is open": "Its GPUs are kept for the group's
    members", "otherwise the request is refused with a retry" and "Members get them as anyone gets a
    free GPU"."""
    reserve(hub, NOW - timedelta(minutes=30))
    await hub.started(spawner(hub, "bob"))  # two free, one kept: bob may have the other
    with pytest.raises(SpawnException) as refused:
        await hub.started(spawner(hub, "carol"))
    assert refused.value.status_code == 409
    assert "reserved (1 for CS101 until 2026-12-08 14:30 UTC)" in refused.value.jupyterhub_message
    assert hub.owner.get("jupyter-carol") is None  # nothing left booked
    await hub.started(spawner(hub, "alice"))
    assert hub.owner.get("jupyter-alice").held.uuids


async def test_the_form_counts_what_the_user_may_have_and_says_why(hub):
    """Guards docs/reservations.md, "While a window is open": "The form counts for each user what they
    may have: others see the reserved GPUs taken off the free count"."""
    reserve(hub, NOW - timedelta(minutes=30), count=2)
    bob, alice = spawner(hub, "bob"), spawner(hub, "alice")
    bob_form, alice_form = await bob._render_options_form(), await alice._render_options_form()
    assert "2 NVIDIA A100 80GB PCIe GPUs are reserved for CS101 until 2026-12-08 14:30 UTC." in bob_form
    assert "CS101: 2 of 2 reserved NVIDIA A100 80GB PCIe GPUs free for you until 2026-12-08 14:30 UTC." in alice_form
    assert "No GPU is free right now" in bob_form
    assert "No GPU is free right now" not in alice_form


async def test_after_the_window_others_are_served_again(hub):
    """Guards docs/reservations.md, "While a window is open": "After the window, others are served
    again"."""
    reserve(hub, NOW - timedelta(hours=1), hours=1.5, count=2)
    with pytest.raises(SpawnException):
        await hub.started(spawner(hub, "bob"))
    hub.wall.now = NOW + timedelta(minutes=30)  # the window's end
    await hub.started(spawner(hub, "bob"))
    assert hub.owner.get("jupyter-bob").held.uuids


async def test_others_are_told_ahead_and_stopped_at_the_start_newest_first(hub):
    """Guards docs/reservations.md, "Making room at a window's start": "From 15 minutes before a window
    opens, the servers of others that will have to make room are told so on the home page", "the
    ledger records the end reason reservation" and "newest servers first (by the time they have held
    their GPUs)"."""
    stops = []

    async def stop(h, reason):
        stops.append((h.name, reason))
        return await driven(hub.owner.remove(h.name, reason=reason), lambda: exit_removed(hub))

    hub.hub.reservations.stop = stop
    await hub.started(spawner(hub, "bob"))
    await hub.started(spawner(hub, "carol"))  # newer: the one to make room
    start = NOW + NOTICE_BEFORE + timedelta(minutes=5)
    reserve(hub, start)
    keeper = hub.hub.reservations
    assert await keeper.check() == [] and keeper.notices_for("carol") == []  # too early to tell
    hub.wall.now = start - NOTICE_BEFORE
    assert await keeper.check() == []
    [notice] = hub.hub.notices_for(SimpleNamespace(name="carol", kind="user"))
    assert notice["reason"] == RESERVATION and notice["stop_at"] == "2026-12-08T13:20:00Z"
    assert keeper.notices_for("bob") == []
    hub.wall.now = start
    assert await keeper.check() == [("jupyter-carol", RESERVATION)]
    assert stops == [("jupyter-carol", RESERVATION)]
    [closed] = [r for r in Ledger(hub.db_url).history() if r.service == "jupyter-carol"]
    assert closed.end_reason == RESERVATION
    assert await keeper.check() == []  # room made: bob keeps his
    await hub.started(spawner(hub, "alice"))


async def test_a_server_whose_held_time_ends_before_the_window_is_left_alone(hub):
    """Guards docs/reservations.md, "Making room at a window's start": "A server whose held-time limit
    ends it before the window opens is left alone"."""
    await hub.started(spawner(hub, "bob"))
    await hub.started(spawner(hub, "carol"))
    start = NOW + timedelta(minutes=10)
    reserve(hub, start)
    keeper = hub.hub.reservations
    keeper.ends_in = lambda h: 300.0 if h.user == "carol" else None  # carol's ends in 5 min
    await keeper.refresh(force=True)
    assert set(keeper.must_make_room(NOW)) == {"jupyter-bob"}


async def test_a_grant_that_will_have_to_make_room_says_so(hub):
    """Guards docs/reservations.md, "Making room at a window's start": "A server granted a GPU that, as
    things stand, will have to make room is told so on its spawn page"."""
    reserve(hub, NOW + timedelta(hours=3), count=2)
    bob = spawner(hub, "bob")
    await hub.started(bob)
    said = [e["message"] for e in bob._progress.events]
    assert any("reserved for CS101 from 2026-12-08 16:00 UTC: the server will be stopped then" in m for m in said), said


async def test_a_member_behind_a_waiting_other_is_served_from_the_reservation(hub):
    """The line does not hold a member up behind someone the reservation keeps out.

    Guards docs/reservations.md, "One plan with the line": "members behind it are served
    from what is kept for them".

    Guards docs/reservations.md, "While a window is open": "someone the reservation keeps out does
    not hold up the line: members behind them are served first"."""
    reserve(hub, NOW - timedelta(minutes=5), count=1)
    await hub.started(spawner(hub, "carol"))  # one left, kept for CS101
    line = hub.hub.line
    bob_wait = hub.started(spawner(hub, "bob", {"gpu_model": A100, "gpu_count": 1, "gpu_wait": True}))
    bob_task = asyncio.ensure_future(bob_wait)
    for _ in range(50):
        await asyncio.sleep(0.01)
        if line.waiting_for(A100):
            break
    assert line.waiting_for(A100) == 1
    alice = spawner(hub, "alice", {"gpu_model": A100, "gpu_count": 1, "gpu_wait": True})
    await asyncio.wait_for(hub.started(alice), 20)
    assert hub.owner.get("jupyter-alice").held.uuids
    assert not bob_task.done()  # still waiting
    bob_task.cancel()
    await asyncio.gather(bob_task, return_exceptions=True)


async def test_a_restarted_hub_keeps_the_reservation_and_makes_room_at_its_start(hub):
    """The window opens while the hub is down: the new hub reads the reservation from
    the ledger, keeps the GPU, and stops the server of another it adopted.

    Guards docs/reservations.md, "Making one": "a restarted hub keeps them, and makes room at a
    window's start as the hub before it would have"."""
    await hub.started(spawner(hub, "bob"))
    await hub.started(spawner(hub, "carol"))
    reserve(hub, NOW - timedelta(minutes=1), count=1)  # made, then the hub went down
    hub.restart()
    new_hub(hub, hub.wall)

    async def stop(h, reason):
        return await driven(hub.owner.remove(h.name, reason=reason), lambda: exit_removed(hub))

    keeper = hub.hub.reservations
    keeper.stop = stop
    await hub.owner.reconcile()  # both servers adopted from the swarm
    assert await keeper.check() == [("jupyter-carol", RESERVATION)]
    with pytest.raises(SpawnException, match="reserved"):
        await hub.started(spawner(hub, "dan"))  # the GPU carol had is kept
    await hub.started(spawner(hub, "alice"))


async def test_the_gauge_counts_reserved_gpus_held_by_members_and_unused(hub):
    """Guards docs/reservations.md, "For admins": "counts the GPUs of open windows its members hold"."""
    reserve(hub, NOW - timedelta(minutes=5), count=2)
    await hub.started(spawner(hub, "alice"))
    await hub.hub.reservations.check()
    value = reservations_module.RESERVED.labels(A100, "held")._value.get()
    assert (value, reservations_module.RESERVED.labels(A100, "unused")._value.get()) == (1, 1)


async def test_reservations_never_read_refuse_gpus_with_a_retry_and_a_list_once_read_is_kept(hub, monkeypatch):
    """While the list was never read, no GPU is handed out: a request is refused with a
    retry, one that waits keeps its place and is served once the list can be read; a list
    once read is kept while the ledger is down.

    Guards docs/reservations.md, "For admins": "While the ledger has never answered, GPU requests
    are refused with a retry" and "once read, the hub keeps the last list it read while the ledger
    is down"."""
    keeper = hub.hub.reservations
    real = keeper.holdings.ledger_call

    async def reservations_down(call):
        if call.__code__.co_names == ("reservations",):  # the keeper's read: db.reservations()
            raise LedgerError("the ledger is down")
        return await real(call)

    monkeypatch.setattr(keeper.holdings, "ledger_call", reservations_down)
    with pytest.raises(SpawnException) as refused:
        await hub.started(spawner(hub, "bob"))
    assert (refused.value.status_code, refused.value.reason) == (409, "gpu_unavailable")
    assert "until the hub can read its GPU reservations" in refused.value.jupyterhub_message
    assert hub.owner.get("jupyter-bob") is None  # nothing left booked
    form = await spawner(hub, "dan")._render_options_form()
    assert "until the hub can read its GPU reservations" in form and "No GPU is free right now" in form
    waiting = asyncio.ensure_future(hub.started(spawner(hub, "carol", {"gpu_model": A100, "gpu_wait": True})))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if hub.hub.line.waiting_for(A100):
            break
    assert hub.hub.line.waiting_for(A100) == 1  # in line, not thrown out
    monkeypatch.setattr(keeper.holdings, "ledger_call", real)
    hub.hub.line.poke()  # as its wait does every 10 s
    await asyncio.wait_for(waiting, 20)
    assert hub.owner.get("jupyter-carol").held.uuids

    reserve(hub, NOW - timedelta(minutes=5), count=2)
    await keeper.refresh(force=True)
    monkeypatch.setattr(keeper.holdings, "ledger_call", reservations_down)
    await keeper.refresh(force=True)
    assert [r.label for r in keeper.reservations] == ["CS101"]  # the list read before
    assert keeper.keep_free([]) == {A100: Keep(2)}  # none of the two is held by a member


async def test_a_lending_window_lends_its_unused_gpus_and_takes_one_back_when_a_member_waits(hub):
    """Lent while no member asks (the borrower is told so); a member waiting in line has
    the newest borrower told, stopped a minute later with the reason reservation, and is served.

    Guards docs/reservations.md, "Lending (--lend)": "lends its unused GPUs to others while its
    window is open and no member waits for one", "the newest borrower is told at once and stopped a
    minute later with the end reason reservation" and "Nothing is stopped at a lending window's
    start"."""
    stops = []

    async def stop(h, reason):
        stops.append((h.name, reason))
        return await driven(hub.owner.remove(h.name, reason=reason), lambda: exit_removed(hub))

    keeper = hub.hub.reservations
    keeper.stop = stop
    reserve(hub, NOW - timedelta(minutes=5), count=2, lend=True)
    bob, carol = spawner(hub, "bob"), spawner(hub, "carol")
    await hub.started(bob)
    await hub.started(carol)  # both lent
    assert any("CS101 lends its unused" in e["message"] for e in carol._progress.events)
    assert await keeper.check() == [] and keeper.notices_for("carol") == []  # nobody of CS101 waits
    gauge = reservations_module.RESERVED
    assert [gauge.labels(A100, s)._value.get() for s in ("held", "lent", "unused")] == [0, 2, 0]

    alice = asyncio.ensure_future(hub.started(spawner(hub, "alice", {"gpu_model": A100, "gpu_wait": True})))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if hub.hub.line.waiting_for(A100):
            break
    assert await keeper.check() == []  # told first
    [notice] = keeper.notices_for("carol")
    assert notice["stop_at"] == "2026-12-08T13:01:00Z" and "a member of CS101 waits" in notice["message"]
    assert keeper.notices_for("bob") == []
    hub.wall.now = NOW + timedelta(minutes=1)
    assert await keeper.check() == [("jupyter-carol", RESERVATION)]
    await asyncio.wait_for(alice, 20)
    assert hub.owner.get("jupyter-alice").held.uuids and hub.owner.get("jupyter-bob") is not None
    assert stops == [("jupyter-carol", RESERVATION)]


# -- what the review of the first version found -----------------------------------------

THREE = {"gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920} for i in range(3)]}
T4 = "NVIDIA Tesla T4"


def world_of(tmp_path, inventory) -> World:
    world = World(tmp_path, inventory=inventory)
    new_hub(world, Wall())
    return world


async def test_each_window_takes_its_own_room_at_its_own_start(tmp_path):
    """A (1 GPU, open until 13:05) and B (2 GPUs from 13:10) never need more than 2 at once:
    the newest server makes room for A now, the next for B at 13:10; the oldest stays.

    Guards docs/reservations.md, "Making room at a window's start": "Each window takes its room at
    its own start, with what the windows open at that moment need together"."""
    hub = world_of(tmp_path, THREE)
    for user in ("x", "y", "z"):
        GROUPS[user] = []
        await hub.started(spawner(hub, user))
    ledger = Ledger(hub.db_url)
    a = ledger.add_reservation(Reservation("cs101", A100, 1, NOW - timedelta(hours=1), NOW + timedelta(minutes=5)))
    b = ledger.add_reservation(Reservation("physics", A100, 2, NOW + timedelta(minutes=10), NOW + timedelta(hours=1)))
    keeper = hub.hub.reservations
    await keeper.refresh(force=True)
    room = keeper.must_make_room(NOW)
    assert {name: need.reservation.id for name, (need, _) in room.items()} == {"jupyter-z": a.id, "jupyter-y": b.id}
    [y_notice] = keeper.notices_for("y")
    assert y_notice["stop_at"] == "2026-12-08T13:10:00Z"


async def test_a_member_who_does_not_wait_is_served_though_others_wait_for_the_kept_gpus(hub):
    """Guards docs/reservations.md, "While a window is open": "a member who asks without waiting is not
    turned away because others wait"."""
    reserve(hub, NOW - timedelta(minutes=5), count=2)
    bob = asyncio.ensure_future(hub.started(spawner(hub, "bob", {"gpu_model": A100, "gpu_wait": True})))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if hub.hub.line.waiting_for(A100):
            break
    assert hub.hub.line.waiting_for(A100) == 1  # bob waits: both GPUs are kept for CS101
    await hub.started(spawner(hub, "alice"))  # without gpu_wait
    assert hub.owner.get("jupyter-alice").held.uuids
    bob.cancel()
    await asyncio.gather(bob, return_exceptions=True)


async def test_any_of_several_models_takes_one_the_reservations_do_not_keep(tmp_path):
    """Guards docs/reservations.md, "While a window is open": "A request for any of several models gets
    one that no reservation keeps"."""
    inventory = {
        "gpu-b": [{"uuid": "GPU-b0", "model": A100, "memory_mib": 81920}],
        "gpu-a": [{"uuid": "GPU-a0", "model": T4, "memory_mib": 15360}],
    }
    hub = world_of(tmp_path, inventory)
    reserve(hub, NOW - timedelta(minutes=5), count=1)
    await hub.started(spawner(hub, "bob", {"gpu_model": [A100, T4], "gpu_count": 1}))
    assert hub.owner.get("jupyter-bob").held.model == T4
    with pytest.raises(SpawnException, match=r"The free NVIDIA A100 80GB PCIe GPUs are reserved \(1 for CS101"):
        await hub.started(spawner(hub, "carol", {"gpu_model": [A100, T4], "gpu_count": 1}))  # the T4 is taken


async def test_a_lending_window_keeps_as_many_gpus_as_its_waiting_members_ask_for(hub):
    """Guards docs/reservations.md, "Lending (--lend)": "As many GPUs are taken back as the waiting
    members ask for"."""
    keeper = hub.hub.reservations
    reserve(hub, NOW - timedelta(minutes=5), count=2, lend=True)
    await keeper.refresh(force=True)
    gauge = reservations_module.RESERVED
    await keeper.check()
    assert [gauge.labels(A100, s)._value.get() for s in ("held", "lent", "unused")] == [0, 0, 2]  # all free
    form = await spawner(hub, "alice")._render_options_form()
    assert "CS101: 2 of 2 reserved NVIDIA A100 80GB PCIe GPUs free for you" in form
    keeper.waiting = lambda: [("alice", A100, 2000)]  # thousandths
    assert keeper.keep_free([]) == {A100: Keep(2)}  # her request for 2 keeps both, not one
    keeper.waiting = lambda: [("alice", A100, 400), ("alice", A100, 400)]  # two servers, a share each
    assert keeper.keep_free([]) == {A100: Keep(2)}  # a GPU each: this reservation is of whole GPUs
    keeper.waiting = lambda: [("bob", A100, 2000)]
    assert keeper.keep_free([]) == {}  # not a member: nothing kept


async def test_no_window_near_asks_jupyterhub_nothing(hub):
    """Guards docs/reservations.md, "For admins": "while no window is open or about to open, a spawn or
    a page asks JupyterHub for nobody's groups"."""
    asked = []
    keeper = hub.hub.reservations
    keeper.groups_of = lambda user: asked.append(user) or GROUPS.get(user)
    await hub.started(spawner(hub, "bob"))
    reserve(hub, NOW + timedelta(days=3), count=1, weekly=True)
    await keeper.refresh(force=True)
    await keeper.check()
    assert keeper.keep_free([]) == {} and keeper.notices_for("bob") == [] and asked == []


async def test_a_read_that_answers_after_a_later_one_is_not_kept(hub, monkeypatch):
    keeper = hub.hub.reservations
    real = hub.owner.ledger_call
    gate = asyncio.Event()

    async def slow(call):
        rows = await real(call)  # read before the reservation is made ...
        await gate.wait()  # ... and answers after the forced read that follows it
        return rows

    monkeypatch.setattr(hub.owner, "ledger_call", slow)
    late = asyncio.ensure_future(keeper.refresh(force=True))
    await asyncio.sleep(0.05)
    monkeypatch.setattr(hub.owner, "ledger_call", real)
    reserve(hub, NOW - timedelta(minutes=5))
    await keeper.refresh(force=True)
    gate.set()
    await late
    assert [r.label for r in keeper.reservations] == ["CS101"]


async def test_the_servers_that_make_room_at_a_start_are_stopped_eight_at_a_time(tmp_path):
    """Guards docs/reservations.md, "For admins": "the servers that make room at a window's start are
    stopped eight at a time"."""
    ten = {"gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920} for i in range(10)]}
    hub = world_of(tmp_path, ten)
    users = [f"u{i}" for i in range(10)]
    for user in users:
        GROUPS[user] = []
        await hub.started(spawner(hub, user))
    reserve(hub, NOW - timedelta(minutes=1), count=10)
    running, most, stopped = [0], [0], []

    async def stop(h, reason):
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.01)
        running[0] -= 1
        stopped.append(h.user)
        return True

    keeper = hub.hub.reservations
    keeper.stop = stop
    await keeper.refresh(force=True)  # made after the spawns read the list: read it now
    assert len(await keeper.check()) == 10
    assert sorted(stopped) == sorted(users) and most[0] == reservations_module.STOPS_AT_ONCE == 8


async def test_groups_jupyterhub_cannot_say_count_as_unknown_and_stop_nobody(hub):
    """Guards docs/reservations.md, "Making room at a window's start": "and so is one whose user's
    groups JupyterHub cannot say"."""
    await hub.started(spawner(hub, "bob"))
    await hub.started(spawner(hub, "carol"))
    reserve(hub, NOW - timedelta(minutes=1), count=1)
    keeper = hub.hub.reservations
    await keeper.refresh(force=True)

    def down(user):
        raise RuntimeError("JupyterHub's database is locked")

    keeper.groups_of = down
    assert keeper.keep_free([]) == {A100: Keep(1)}  # nobody known to be a member: all kept
    assert keeper.must_make_room(NOW) == {}  # nobody known to be outside it: nobody stopped


async def test_a_share_total_keeps_room_for_its_members_and_stops_only_whom_it_needs(tmp_path):
    """1.5 A100 in shares for CS101 on two A100s: others get shares or a GPU only while
    1.5 GPUs' worth stays free for the members, who take shares of it; at a window's
    start the newest are stopped until that much is free, and one whose stop is not
    needed after all is let off.

    Guards docs/reservations.md, "Share totals (--shares)": "anyone else gets a share or a GPU of
    the model only while as much room stays free as the members do not hold" and "others' servers
    are stopped, newest first, until that much room is free, and any whose stop is not needed after
    all is let off"."""
    GROUPS["erin"] = []
    hub = World(tmp_path, inventory=TWO_GPUS, gpu_sharing={A100: {"quantum": 0.25}})
    new_hub(hub, Wall())
    quarter = {"gpu_model": A100, "gpu_share": 0.25}
    reserve(hub, NOW - timedelta(minutes=30), count=1.5, shares=True)
    await hub.started(spawner(hub, "bob", quarter))  # 1.75 left: 1.5 kept
    with pytest.raises(SpawnException) as refused:
        await hub.started(spawner(hub, "dan"))  # a whole GPU would leave 0.75
    assert refused.value.status_code == 409
    assert "reserved (1.5 for CS101 until 2026-12-08 14:30 UTC)" in refused.value.jupyterhub_message
    assert hub.owner.get("jupyter-dan") is None
    form = " ".join((await spawner(hub, "carol")._render_options_form()).split())
    assert f"1.5 {A100} GPUs are reserved for CS101, as shares or whole GPUs, until 2026-12-08 14:30 UTC." in form
    await hub.started(spawner(hub, "dan", quarter))  # 1.5 left: just enough
    with pytest.raises(SpawnException):
        await hub.started(spawner(hub, "carol", quarter))
    alice = " ".join((await spawner(hub, "alice")._render_options_form()).split())
    assert f"CS101: 1.5 of 1.5 reserved {A100} GPUs free for you, as shares or whole GPUs, until" in alice
    await hub.started(spawner(hub, "alice", {"gpu_model": A100, "gpu_share": 0.5}))  # a member
    assert hub.hub.reservations.status()[0]["unused"] == 1.0
    with pytest.raises(SpawnException):
        await hub.started(spawner(hub, "carol", quarter))  # 1 left, 1 still kept

    # The next day's window opens while others hold all but a quarter.
    stopped = []

    async def stop(h, reason):
        stopped.append(h.user)
        return await driven(hub.owner.remove(h.name, reason=reason), lambda: exit_removed(hub))

    keeper = hub.hub.reservations
    keeper.stop = stop
    for user in ("alice", "bob", "dan"):
        await driven(hub.owner.remove(f"jupyter-{user}", reason="done"), lambda: exit_removed(hub))
    hub.wall.now = NOW + timedelta(hours=12)  # the first window is over
    await hub.started(spawner(hub, "bob"))  # oldest: a whole GPU
    await hub.started(spawner(hub, "carol", {"gpu_model": A100, "gpu_share": 0.5}))
    await hub.started(spawner(hub, "erin", quarter))  # newest
    hub.wall.now = NOW + timedelta(days=1)
    reserve(hub, hub.wall.now, count=1.5, shares=True)
    await keeper.refresh(force=True)
    # 0.25 is free. Newest first, erin's and carol's stops free 1 in all, not enough, and
    # bob's then 2; carol's is let off after all (erin's and bob's leave exactly 1.5 free).
    assert await keeper.check() == [("jupyter-erin", RESERVATION), ("jupyter-bob", RESERVATION)]
    assert sorted(stopped) == ["bob", "erin"] and hub.owner.get("jupyter-carol").held.milli == (500,)


async def test_a_gpu_counts_for_one_reservation_only(tmp_path):
    """Guards docs/reservations.md: "A GPU counts for one reservation only". Two open reservations of
    1 A100 each on two A100s; eve, a member of both, takes one: it counts for Lab A (opened
    first), so Lab B still keeps the other from gus (a member of neither) and gives it to fay
    (a member of Lab B); status() (what /hub/gpus and `gpuspawner reserve --list` show) has
    it held for Lab A only."""
    GROUPS.update(eve=["lab-a", "lab-b"], fay=["lab-b"], gus=[])
    hub = world_of(tmp_path, TWO_GPUS)
    ledger = Ledger(hub.db_url)
    lab_a = Reservation("lab-a", A100, 1, NOW - timedelta(hours=1), NOW + timedelta(hours=1), name="Lab A")
    lab_b = Reservation("lab-b", A100, 1, NOW - timedelta(minutes=30), NOW + timedelta(hours=1), name="Lab B")
    ledger.add_reservation(lab_a)
    ledger.add_reservation(lab_b)
    await hub.started(spawner(hub, "eve"))
    keeper = hub.hub.reservations
    await keeper.refresh(force=True)
    held = {r["name"]: (r["members_hold"], r["unused"]) for r in keeper.status()}
    assert held == {"Lab A": (1, 0), "Lab B": (0, 1)}
    with pytest.raises(SpawnException) as refused:
        await hub.started(spawner(hub, "gus"))
    assert "reserved (1 for Lab B until" in refused.value.jupyterhub_message
    assert hub.owner.get("jupyter-gus") is None
    await hub.started(spawner(hub, "fay"))  # her own window keeps it for her
    assert hub.owner.get("jupyter-fay").held.uuids
    held = {r["name"]: (r["members_hold"], r["unused"]) for r in keeper.status()}
    assert held == {"Lab A": (1, 0), "Lab B": (1, 0)}


async def test_a_windows_start_stops_only_a_member_of_no_open_reservation(tmp_path):
    """Guards docs/reservations.md: "Members of any open reservation of the model are never stopped
    for one". Two A100s: Lab B (1) has been open since 12:00 and its member dave holds its
    GPU; bob (no group) holds the other. When Lab A (1) opens, bob alone is told and stopped,
    which meets both; dave, the newer, keeps his, also at the checks after.

    Guards docs/reservations.md, "One plan with the line": "only servers of users who are
    members of no open reservation of the model, and only as many as the windows open
    then lack together"."""
    GROUPS.update(dave=["lab-b"])
    hub = world_of(tmp_path, TWO_GPUS)
    ledger = Ledger(hub.db_url)
    start = NOW + timedelta(minutes=10)
    ledger.add_reservation(Reservation("lab-b", A100, 1, NOW - timedelta(hours=1), NOW + timedelta(hours=2)))
    stops = []

    async def stop(h, reason):
        stops.append(h.user)
        return await driven(hub.owner.remove(h.name, reason=reason), lambda: exit_removed(hub))

    keeper = hub.hub.reservations
    keeper.stop = stop
    await hub.started(spawner(hub, "bob"))
    await hub.started(spawner(hub, "dave"))  # the newer
    ledger.add_reservation(Reservation("lab-a", A100, 1, start, NOW + timedelta(hours=2), name="Lab A"))
    await keeper.refresh(force=True)
    assert set(keeper.must_make_room(NOW)) == {"jupyter-bob"}
    assert await keeper.check() == [] and keeper.notices_for("dave") == []
    assert keeper.notices_for("bob")[0]["stop_at"] == "2026-12-08T13:10:00Z"
    hub.wall.now = start
    assert await keeper.check() == [("jupyter-bob", RESERVATION)]
    for minutes in (1, 2):
        hub.wall.now = start + timedelta(minutes=minutes)
        assert await keeper.check() == []
    assert stops == ["bob"] and hub.owner.get("jupyter-dave") is not None


async def test_a_members_stop_mid_window_stops_nobody_and_keeps_her_gpu_for_the_members(hub):
    """Guards docs/reservations.md: "A member's stop during an open window stops nobody". The window
    keeps 1 of 2 A100s; bob (no group) holds one, alice (CS101) the other. While her server
    is being removed its GPU still counts as hers, so no check asks bob to make room (no
    notice, no stop due at once); once it is given back it is kept for the members."""
    stops = []

    async def stop(h, reason):
        stops.append(h.user)
        return True

    reserve(hub, NOW - timedelta(minutes=30), count=1)
    await hub.started(spawner(hub, "bob"))
    await hub.started(spawner(hub, "alice"))
    keeper = hub.hub.reservations
    keeper.stop = stop
    assert await keeper.check() == []
    assert not await hub.owner.remove("jupyter-alice", wait=0)  # her container still runs: removing
    for seconds in (0, 3, 30, 90):  # the reclaim's ticks while it is removed
        hub.wall.now = NOW + timedelta(seconds=seconds)
        assert keeper.must_make_room(hub.wall.now) == {}
        assert await keeper.check() == [] and keeper.notices_for("bob") == []
    exit_removed(hub)
    assert await hub.owner.remove("jupyter-alice", wait=0)  # given back
    assert hub.owner.get("jupyter-alice") is None
    assert await keeper.check() == [] and stops == [] and hub.owner.get("jupyter-bob") is not None
    with pytest.raises(SpawnException, match="reserved"):
        await hub.started(spawner(hub, "dan"))  # her GPU is kept for CS101
    await hub.started(spawner(hub, "alice"))


@pytest.mark.parametrize(
    "request_, milli",
    [
        ({"gpu_model": A100, "gpu_count": 2}, 2000),
        ({"gpu_model": A100, "gpu_share": 0.25}, 250),
        ({"gpu_model": A100, "gpu_count": 1, "gpu_share": 1.5}, 1500),  # the form sends both: the share counts
        ({"gpu_model": A100}, 1000),
        ({"gpu_model": A100, "gpu_count": "all"}, 1000),
        ({"gpu_model": A100, "gpu_share": "half"}, 1000),
        ({"gpu_model": A100, "gpu_count": True}, 1000),
    ],
)
def test_what_a_waiter_asks_for_is_counted_in_thousandths(request_, milli):
    assert reservations_module.milli_asked(request_) == milli


async def test_a_share_frag_would_put_on_a_kept_device_goes_where_pack_puts_it(tmp_path):
    """frag may place a share on an untouched device; where a reservation keeps the
    untouched ones, the share is placed as pack places it, on a device with room."""
    three = {"gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920} for i in range(3)]}
    hub = World(
        tmp_path,
        inventory=three,
        gpu_sharing={A100: {"quantum": 0.25}},
        allocation_policy="frag",
        gpu_placement_mix=[{"share": 0.5}, {"share": 0.25}],
    )
    new_hub(hub, Wall())
    await hub.started(spawner(hub, "bob", {"gpu_model": A100, "gpu_share": 0.5}))
    held = hub.owner.get("jupyter-bob").held.uuids
    # frag's own choice for a quarter, with nothing kept: an untouched device.
    alone = hub.hub.holdings.allocator
    probe = alone.allocate("probe", Request(count=1, milli=250, model=A100, owner="probe"), policy="frag")
    assert probe.uuids != held
    alone.release("probe")
    reserve(hub, NOW - timedelta(minutes=5), count=2)  # both untouched ones kept for CS101
    await hub.hub.reservations.refresh(force=True)
    await hub.started(spawner(hub, "dan", {"gpu_model": A100, "gpu_share": 0.25}))
    assert hub.owner.get("jupyter-dan").held.uuids == held


async def test_the_form_offers_others_only_shares_that_leave_the_kept_devices_untouched(tmp_path):
    hub = World(tmp_path, inventory=TWO_GPUS, gpu_sharing={A100: {"quantum": 0.25}})
    new_hub(hub, Wall())
    await hub.started(spawner(hub, "bob", {"gpu_model": A100, "gpu_share": 0.5}))
    reserve(hub, NOW - timedelta(minutes=5), count=1)  # the untouched one is kept for CS101
    await hub.hub.reservations.refresh(force=True)
    form = " ".join((await spawner(hub, "carol")._render_options_form()).split())
    assert "0 of 2 free now · can be shared: up to 0.5 of one GPU free" in form  # not the kept one's 1
    with pytest.raises(SpawnException):
        await hub.started(spawner(hub, "carol", {"gpu_model": A100, "gpu_share": 0.75}))
    await hub.started(spawner(hub, "carol", {"gpu_model": A100, "gpu_share": 0.5}))
    assert hub.owner.get("jupyter-carol").held.uuids == hub.owner.get("jupyter-bob").held.uuids
    form = " ".join((await spawner(hub, "dan")._render_options_form()).split())
    assert "0 of 2 free now · can be shared" in form and "up to" not in form.split("0 of 2 free now")[1][:60]


async def test_a_restarted_hub_gives_a_borrower_a_fresh_minute_never_less(hub):
    """Guards docs/reservations.md, "Lending (--lend)": "A hub restarted during that minute tells the
    borrower again and gives it a minute from then" and "a lent GPU is given back up to a minute
    later, never earlier than the borrower was told"."""
    stops = []

    async def stop(h, reason):
        stops.append(h.name)
        return True

    reserve(hub, NOW - timedelta(minutes=5), count=2, lend=True)
    await hub.started(spawner(hub, "bob"))
    await hub.started(spawner(hub, "carol"))  # both lent; carol's is the newer
    keeper = hub.hub.reservations
    keeper.stop, keeper.waiting = stop, lambda: [("alice", A100, 1000)]
    assert await keeper.check() == []
    assert keeper.notices_for("carol")[0]["stop_at"] == "2026-12-08T13:01:00Z"
    hub.restart()  # 30 s on, a new hub: it has not told anybody yet
    new_hub(hub, hub.wall)
    keeper = hub.hub.reservations
    keeper.stop, keeper.waiting = stop, lambda: [("alice", A100, 1000)]
    await hub.owner.reconcile()
    hub.wall.now = NOW + timedelta(seconds=30)
    assert await keeper.check() == []
    assert keeper.notices_for("carol")[0]["stop_at"] == "2026-12-08T13:01:30Z"
    hub.wall.now = NOW + timedelta(seconds=60)
    assert await keeper.check() == [] and stops == []  # not before the time it was told now
    hub.wall.now = NOW + timedelta(seconds=90)
    assert await keeper.check() == [("jupyter-carol", RESERVATION)] and stops == ["jupyter-carol"]
