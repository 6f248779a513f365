"""Quotas at the hub: the real spawner, holdings, line, keepers and SQLite ledger over
the Docker fake (tests/unit/test_holdings.World), with the wall clock set by the test
and JupyterHub's groups as a small fake.

Guards docs/quotas.md: "while it does not use them, anyone may", "the users of the
servers taken back are told at once", "stopped after the notice with the end reason
preempted", "the member is then served", "a request within its group's quota is not
held back by the line", "a borrower is told at its start that its GPUs are borrowed",
"goes no further than its borrowing limit: beyond it, a request is refused", "the part of its quota a group does
not lend stays free", "a reservation's window never stops a holding within its quota",
and "a reservation may keep only what quotas leave"."""

from __future__ import annotations

import asyncio
import html
from datetime import timedelta
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException

from gpuspawner.core.reservations import Reservation, ReservationError
from gpuspawner.ledger.ledger import Ledger, LedgerError
from gpuspawner.plan.quotas import Ask
from gpuspawner.reclaim.quotas import PREEMPTED, QUOTA_GPUS, ask_of, hosts_of
from gpuspawner.reclaim.reservations import GROUPS_SECONDS
from gpuspawner.web.api import queue_json
from gpuspawner.web.home_gpus import server_rows
from tests.unit.test_holdings import A100, World, driven
from tests.unit.test_reclaim import TWO_GPUS
from tests.unit.test_reservations_hub import GROUPS, NOW, Wall, exit_removed, new_hub, spawner

QUOTAS = {"physics": {A100: 1}, "cs101": {A100: {"gpus": 1, "notice_minutes": 10}}}


def world(tmp_path, quotas=QUOTAS) -> World:
    w = World(tmp_path, inventory=TWO_GPUS, gpu_quotas=quotas, max_gpus_per_user=2)
    new_hub(w, Wall())
    w.hub.quotas.clock = w.hub.reservations.clock  # (the test's wall clock: caches age with it)
    return w


def stops_through(w: World) -> list:
    stopped = []

    async def stop(h, reason):
        stopped.append((h.name, reason))
        return await driven(w.owner.remove(h.name, reason=reason), lambda: exit_removed(w))

    w.hub.quotas.stop = stop
    return stopped


async def in_line(w: World, user: str) -> asyncio.Future:
    task = asyncio.ensure_future(w.started(spawner(w, user, {"gpu_model": A100, "gpu_count": 1, "gpu_wait": True})))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if w.hub.line.place(f"jupyter-{user}") is not None or task.done():
            break
    return task


async def test_a_borrower_is_told_at_once_stopped_after_the_notice_and_the_member_served(tmp_path):
    w = world(tmp_path)
    stopped = stops_through(w)
    bob = spawner(w, "bob")  # in no group: everything bob holds is borrowed
    await w.started(bob)
    assert any("borrowed: it may be taken back with 10 minutes' notice" in e["message"] for e in bob._progress.events)
    await w.started(spawner(w, "carol"))  # physics, within its quota
    keeper = w.hub.quotas
    assert keeper.mark_of("jupyter-bob").within is False and keeper.mark_of("jupyter-carol").within is True
    alice = await in_line(w, "alice")  # cs101, below its quota: nothing free
    assert not alice.done()
    assert await keeper.check() == []  # told now, stopped later
    (notice,) = w.hub.notices_for(type("U", (), {"name": "bob", "kind": "user"})())
    assert notice["reason"] == PREEMPTED and notice["seconds_left"] == 600
    assert "a member of cs101 asks for the GPUs of its quota" in notice["message"]
    assert keeper.notices_for("carol") == []  # within its quota: never taken back
    (row,) = [q for q in keeper.status() if q["group"] == "cs101"]
    assert (row["waiting"], [t["server"] for t in row["taking_back"]]) == ("1", ["jupyter-bob"])
    assert QUOTA_GPUS.labels("cs101", A100, "waiting")._value.get() == 1
    (home,) = server_rows(w.hub, "bob")
    assert home["quota"] == "Borrowed: it may be taken back with 10 minutes' notice"
    assert home["stops"][0] == "take-back for cs101's quota in 10 min"
    assert server_rows(w.hub, "carol")[0]["quota"].startswith("Within physics's quota")
    why = "Within cs101's quota: borrowed GPUs are taken back for you at 13:10 UTC"
    assert w.hub.why_waiting("jupyter-alice") == why
    assert (await queue_json(w.hub.line, w.hub.why_waiting))[A100][0]["why"] == why
    w.wall.now = NOW + timedelta(minutes=9)
    assert await keeper.check() == [] and stopped == []
    w.wall.now = NOW + timedelta(minutes=10)
    assert await keeper.check() == [("jupyter-bob", PREEMPTED)]
    assert stopped == [("jupyter-bob", PREEMPTED)]
    w.hub.line.poke()
    await asyncio.wait_for(alice, 20)
    assert w.owner.get("jupyter-alice").held.uuids
    assert keeper.mark_of("jupyter-alice").within
    assert keeper.notices_for("bob") == []
    records = {r.service: (r.quota_group, r.borrowed, r.end_reason) for r in Ledger(w.db_url).history()}
    assert records["jupyter-bob"] == (None, True, PREEMPTED)  # borrowed, and taken back
    assert records["jupyter-carol"] == ("physics", False, "")
    assert records["jupyter-alice"] == ("cs101", False, "")


async def test_a_notice_is_withdrawn_when_the_member_stops_waiting(tmp_path):
    w = world(tmp_path)
    stopped = stops_through(w)
    await w.started(spawner(w, "bob"))
    await w.started(spawner(w, "carol"))
    alice = await in_line(w, "alice")
    await w.hub.quotas.check()
    assert w.hub.quotas.notices_for("bob")
    alice.cancel()
    await asyncio.gather(alice, return_exceptions=True)
    await w.hub.line.leave("jupyter-alice")
    w.wall.now = NOW + timedelta(minutes=11)
    assert await w.hub.quotas.check() == [] and stopped == []
    assert w.hub.quotas.notices_for("bob") == []


async def test_a_member_within_quota_who_does_not_wait_is_told_that_waiting_gets_the_gpus_back(tmp_path):
    w = world(tmp_path)
    await w.started(spawner(w, "bob"))
    await w.started(spawner(w, "dan"))
    with pytest.raises(SpawnException) as refused:
        await w.started(spawner(w, "alice"))
    message = refused.value.jupyterhub_message
    assert "Your group cs101 is guaranteed 1 NVIDIA A100 80GB PCIe GPUs and holds 0" in message
    assert "borrowed GPUs are taken back for you within 10 minutes" in message
    assert w.owner.get("jupyter-alice") is None


async def test_a_request_beyond_the_borrowing_limit_is_refused_and_nothing_stays_booked(tmp_path):
    w = world(tmp_path, {"physics": {A100: {"gpus": 1, "borrow": 0}}, "cs101": {A100: 1}})
    await w.started(spawner(w, "carol"))
    with pytest.raises(SpawnException) as refused:
        second = w.spawner("carol", {"gpu_model": A100, "gpu_count": 1}, server="second")
        second.user.groups = [SimpleNamespace(name="physics")]
        await w.started(second)
    assert "may borrow at most 0 beyond it" in refused.value.jupyterhub_message
    assert w.owner.get("jupyter-carol-second") is None
    await w.started(spawner(w, "alice"))  # cs101's own GPU is still there for it


async def test_the_part_of_a_quota_not_lent_stays_free_for_its_members(tmp_path):
    w = world(tmp_path, {"physics": {A100: {"gpus": 1, "lend": 0}}})
    await w.started(spawner(w, "bob"))  # the one GPU no quota promises
    with pytest.raises(SpawnException) as refused:
        await w.started(spawner(w, "dan"))
    assert "kept for groups' quotas (1 for physics)" in refused.value.jupyterhub_message
    await w.started(spawner(w, "carol"))


async def test_a_reservations_window_never_stops_a_holding_within_its_quota(tmp_path):
    w = world(tmp_path, {"physics": {A100: 1}})
    await w.started(spawner(w, "bob"))  # borrowed (older)
    await w.started(spawner(w, "carol"))  # physics, within (newer: a window would stop it first)
    Ledger(w.db_url).add_reservation(
        Reservation("cs101", A100, 1, NOW - timedelta(minutes=1), NOW + timedelta(hours=1))
    )
    keeper = w.hub.reservations
    await keeper.refresh(force=True)
    assert list(keeper.must_make_room(NOW)) == ["jupyter-bob"]


async def test_a_reservation_may_keep_only_what_quotas_leave(tmp_path):
    w = world(tmp_path, {"physics": {A100: 1}})
    keeper = w.hub.reservations
    r = Reservation("cs101", A100, 2, NOW + timedelta(hours=1), NOW + timedelta(hours=2))
    with pytest.raises(ReservationError, match="of which quotas guarantee 1 at any time: 1 may be reserved"):
        await keeper.add(r, 2, w.hub.quotas.guaranteed(A100))
    made = await keeper.add(Reservation("cs101", A100, 1, r.start, r.end), 2, w.hub.quotas.guaranteed(A100))
    assert made.id is not None


async def test_the_form_says_what_a_quota_leaves_its_members_and_what_others_may_borrow(tmp_path):
    """Guards docs/quotas.md, "Where to see them": the form "says what the user's group's quota has
    left" and "GPUs free to borrow: they may be taken back with 10 minutes' notice"."""
    w = world(tmp_path)
    bob_form = html.unescape(await spawner(w, "bob")._render_options_form())
    assert f"2 {A100} GPUs free to borrow: they may be taken back with 10 minutes' notice." in bob_form
    alice_form = html.unescape(await spawner(w, "alice")._render_options_form())
    assert f"cs101's quota: 1 of its 1 {A100} GPUs left for its members, never taken back" in alice_form
    assert f"1 {A100} GPU free to borrow: it may be taken back with 10 minutes' notice." in alice_form


async def test_a_class_that_may_not_be_preempted_borrows_only_what_no_quota_keeps_idle(tmp_path):
    """Guards docs/quotas.md, "Priority classes": "its members borrow only GPUs no quota
    keeps idle" (refused, and offered nothing to borrow on the form), while a preemptible
    class borrows and is taken back. (Lower ranks first: tests/unit/test_plan_quotas.py.)"""
    w = World(
        tmp_path,
        inventory=TWO_GPUS,
        max_gpus_per_user=2,
        gpu_quotas={"cs101": {A100: 2}},
        gpu_priority_classes={
            "exam": {"groups": ["physics"], "rank": 3, "preemptible": False},
            "best-effort": {"groups": ["*"], "rank": 0},
        },
    )
    new_hub(w, Wall())
    stopped = stops_through(w)
    with pytest.raises(SpawnException) as refused:
        await w.started(spawner(w, "carol"))  # physics: exam class, no quota; both A100s are cs101's idle quota
    assert "kept for groups' quotas (2 for cs101)" in refused.value.jupyterhub_message
    carol_form = html.unescape(await spawner(w, "carol")._render_options_form())
    assert "free to borrow" not in carol_form
    await w.started(spawner(w, "bob"))  # best-effort: borrows
    bob_too = w.spawner("bob", {"gpu_model": A100, "gpu_count": 1}, server="second")
    await w.started(bob_too)
    keeper = w.hub.quotas
    assert keeper.describe("jupyter-bob").startswith("Borrowed: it may be taken back")
    alice = await in_line(w, "alice")  # cs101, within its quota
    await keeper.check()
    assert len(keeper.notices_for("bob")) == 1
    w.wall.now = NOW + timedelta(minutes=10)
    assert len(await keeper.check()) == 1 and len(stopped) == 1
    w.hub.line.poke()
    await asyncio.wait_for(alice, 20)
    assert w.owner.get("jupyter-alice").held.uuids


async def test_while_a_holders_groups_cannot_be_read_nothing_of_its_model_is_taken_back(tmp_path):
    """Guards docs/quotas.md: "While the groups of a holder of a model cannot be read, no
    server of that model is taken back"."""
    w = world(tmp_path)
    stops_through(w)
    await w.started(spawner(w, "bob"))
    zed = w.spawner("zed", {"gpu_model": A100, "gpu_count": 1})  # unknown to the groups' fake: None
    await w.started(zed)
    alice = await in_line(w, "alice")
    await w.hub.quotas.check()
    assert w.hub.quotas.notices_for("bob") == [] and w.hub.quotas.notices_for("zed") == []
    w.hub.reservations.groups_of = lambda user: {"zed": []}.get(user, GROUPS.get(user))  # now known: in none
    w.wall.now = NOW + timedelta(seconds=GROUPS_SECONDS)  # (asked again once the groups' cache is old)
    await w.hub.quotas.check()
    told = {u: [n["reason"] for n in w.hub.quotas.notices_for(u)] for u in ("bob", "zed")}
    assert sorted(told.values()) == [[], [PREEMPTED]]  # one of them, now that who is in what is known
    alice.cancel()
    await asyncio.gather(alice, return_exceptions=True)


async def test_a_waiter_kept_from_the_free_gpu_gets_a_borrowed_one_back_instead(tmp_path):
    """The free A100 is physics's idle quota, which it does not lend: alice (cs101, within
    her quota) may not take it, so bob's borrowed one is taken back for her (not nothing,
    leaving her to wait until bob ends)."""
    w = world(tmp_path, {"cs101": {A100: 1}, "physics": {A100: {"gpus": 1, "lend": 0}}})
    await w.started(spawner(w, "bob"))
    alice = await in_line(w, "alice")
    assert not alice.done()  # the free one is physics's
    await w.hub.quotas.check()
    assert [n["reason"] for n in w.hub.quotas.notices_for("bob")] == [PREEMPTED]
    alice.cancel()
    await asyncio.gather(alice, return_exceptions=True)


async def test_a_member_of_an_open_reservation_is_not_taken_back_for_a_quota(tmp_path):
    """Guards docs/quotas.md, "How quotas and reservations combine": "a take-back never
    stops a holding counted toward an open reservation window"."""
    w = world(tmp_path, {"cs101": {A100: 1}})
    Ledger(w.db_url).add_reservation(
        Reservation("physics", A100, 1, NOW - timedelta(minutes=5), NOW + timedelta(hours=1), name="Lab")
    )
    await w.hub.reservations.refresh(force=True)
    await w.started(spawner(w, "carol"))  # physics: the window's member, borrowed as quotas go
    await w.started(spawner(w, "bob"))
    w.hub.quotas.held_for = lambda h: 3600.0 if h.user == "bob" else 60.0  # carol's would be the cheaper stop
    alice = await in_line(w, "alice")
    await w.hub.quotas.check()
    assert w.hub.quotas.notices_for("carol") == []
    assert [n["reason"] for n in w.hub.quotas.notices_for("bob")] == [PREEMPTED]
    alice.cancel()
    await asyncio.gather(alice, return_exceptions=True)


def test_a_waiters_share_over_one_gpu_spans_its_devices_and_a_pinned_host_is_its_only_one():
    assert ask_of({"gpu_share": 1.5}) == Ask(count=2)
    assert ask_of({"gpu_share": 0.5}) == Ask(milli=500)
    assert ask_of({"gpu_count": 3}) == Ask(count=3)
    assert hosts_of({"gpu_host": "gpu-b"}) == frozenset({"gpu-b"}) and hosts_of({}) is None


async def test_in_a_strict_line_a_waiter_within_its_quota_is_not_held_behind_a_blocked_head(tmp_path):
    """Guards docs/quotas.md: "A request within its group's quota is not held back by the
    line", with gpu_line_backfill off too."""
    w = World(tmp_path, inventory=TWO_GPUS, gpu_quotas=QUOTAS, max_gpus_per_user=4, gpu_line_backfill=False)
    new_hub(w, Wall())
    w.hub.quotas.clock = w.hub.reservations.clock
    stopped = stops_through(w)
    await w.started(spawner(w, "bob"))
    await w.started(spawner(w, "dan"))
    head = asyncio.ensure_future(
        w.started(w.spawner("dan", {"gpu_model": A100, "gpu_count": 2, "gpu_wait": True}, server="big"))
    )
    for _ in range(100):
        await asyncio.sleep(0.01)
        if w.hub.line.waiting_for(A100):
            break
    alice = await in_line(w, "alice")  # behind dan's 2-GPU request, which blocks a strict line
    await w.hub.quotas.check()
    w.wall.now = NOW + timedelta(minutes=10)
    assert len(await w.hub.quotas.check()) == 1 and len(stopped) == 1
    w.hub.line.poke()
    await asyncio.wait_for(alice, 20)
    assert w.owner.get("jupyter-alice").held.uuids
    assert not head.done()  # dan's still waits
    head.cancel()
    await asyncio.gather(head, return_exceptions=True)


async def test_while_the_reservations_cannot_be_read_nothing_is_taken_back(tmp_path):
    """No GPU is granted while the reservations were never read (docs/reservations.md): a
    take-back then would stop a borrower for a member who could not be served anyway."""
    w = world(tmp_path)
    await w.started(spawner(w, "bob"))
    await w.started(spawner(w, "dan"))
    alice = await in_line(w, "alice")
    w.hub.reservations.known = False  # (as before the ledger first answers)
    assert w.hub.quotas.must_take_back() == {}
    w.hub.reservations.known = True
    assert len(w.hub.quotas.must_take_back()) == 1
    alice.cancel()
    await asyncio.gather(alice, return_exceptions=True)


async def test_a_ledger_that_cannot_record_the_quota_mark_does_not_stop_the_spawn(tmp_path, monkeypatch):
    """The mark at grant is a ledger write (note_quota): when it fails it is logged and the
    server starts all the same, its GPUs held."""
    w = world(tmp_path)
    real = w.owner.ledger_call

    async def marks_down(call):
        if "note_quota" in call.__code__.co_names:
            raise LedgerError("the ledger is down")
        return await real(call)

    monkeypatch.setattr(w.owner, "ledger_call", marks_down)
    await w.started(spawner(w, "bob"))
    assert w.owner.get("jupyter-bob").held.uuids
    assert {r.service: r.borrowed for r in Ledger(w.db_url).open_allocations()} == {"jupyter-bob": None}
