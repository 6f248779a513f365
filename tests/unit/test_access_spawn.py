"""gpu_access at a spawn, with the real spawner, owner, allocator and SQLite
ledger over the fake Docker API: the form offers only what the user's groups
allow, a request for more gets 403 with what they may have and reserves
nothing, groups are read at each spawn, and a used-up weekly budget refuses
GPU requests with the time it is back.

Guards docs/access.md, "Tests": "the spawner, the form and the ledger over a fake Docker API"."""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException
from prometheus_client import REGISTRY
from traitlets.config import Config

from gpuspawner.hub.settings import validate_config
from gpuspawner.ledger.ledger import Ledger
from tests.interleave import Run, Scenario, explore
from tests.unit.test_holdings import A100, World, check_all, ledger_down
from tests.unit.test_line import stopped, until

GTX = "NVIDIA GeForce GTX 1070"
INVENTORY = {
    "gpu-a": [{"uuid": f"GPU-a{i}", "model": GTX, "memory_mib": 8192} for i in range(3)],
    "gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920} for i in range(2)],
}
RULES = {
    "students": {"models": [GTX], "max_gpus": 1, "max_hours": 4, "weekly_gpu_hours": 20},
    "staff": {"models": "*", "max_gpus": 4, "priority": 10},
    "*": {"models": [], "max_gpus": 0},
}


def world(tmp_path, executor=None, **settings) -> World:
    return World(tmp_path, executor, inventory=INVENTORY, gpu_access=RULES, **settings)


def in_groups(spawner, *groups):
    spawner.user.groups = [SimpleNamespace(name=g) for g in groups]
    return spawner


async def refused(w: World, spawner, held: int = 0) -> SpawnException:
    with pytest.raises(SpawnException) as exc:
        await w.started(spawner)
    assert w.owner.get(spawner.service_name) is None and spawner.service_name not in w.fake.service_names()
    assert w.owner.allocator.milli_held_by(spawner.user.name) == held * 1000
    return exc.value


@pytest.mark.parametrize(
    "groups, options, sentence",
    [
        (["students"], {"gpu_model": A100}, f"{A100} is not available to you. Your group (students) allows {GTX}"),
        (["students"], {"gpu_model": GTX, "gpu_count": 2}, "2 GPUs requested. Your group (students) allows"),
        ([], {"gpu_model": GTX}, "Users in none of the hub's GPU groups may have CPU-only servers only."),
    ],
)
async def test_a_request_the_rules_forbid_gets_403_naming_what_the_user_may_have(tmp_path, groups, options, sentence):
    w = world(tmp_path)
    before = refusals("access")
    exc = await refused(w, in_groups(w.spawner("carol", options), *groups))
    assert exc.status_code == 403 and exc.reason == "gpu_access"
    assert sentence in exc.jupyterhub_message
    assert refusals("access") == before + 1, "counted in gpuspawner_allocations_refused{reason=access}"


def refusals(reason: str) -> float:
    return REGISTRY.get_sample_value("gpuspawner_allocations_refused_total", {"reason": reason}) or 0.0


async def test_staff_get_more_than_the_hubs_limit_and_everyone_cpu_only(tmp_path):
    w = world(tmp_path)  # max_gpus_per_user stays 1
    await w.started(in_groups(w.spawner("sam", {"gpu_model": A100, "gpu_count": 2}), "staff", "students"))
    assert sorted(v for _, _, v in w.fake.running_containers().values()) == ["GPU-b0,GPU-b1"]
    await w.started(in_groups(w.spawner("nobody", {}), "physics"))
    assert "void" in [v for _, _, v in w.fake.running_containers().values()]


async def test_groups_are_read_at_each_spawn(tmp_path):
    w = world(tmp_path)
    carol = w.spawner("carol", {"gpu_model": A100})
    exc = await refused(w, in_groups(carol, "students"))
    assert exc.status_code == 403
    in_groups(carol, "students", "staff")  # what an admin's change through the REST API does
    await w.started(carol)
    assert [v for _, _, v in w.fake.running_containers().values()] == ["GPU-b0"]
    assert carol._access().priority == 10


async def test_the_groups_limit_counts_across_the_users_servers(tmp_path):
    w = world(tmp_path)
    await w.started(in_groups(w.spawner("sam", {"gpu_model": GTX, "gpu_count": 3}), "staff"))
    exc = await refused(
        w, in_groups(w.spawner("sam", {"gpu_model": A100, "gpu_count": 2}, server="more"), "staff"), held=3
    )
    assert "the limit is 4 per user and you already hold 3 on other servers" in exc.jupyterhub_message


async def test_an_unreachable_ledger_refuses_budgeted_gpu_requests_with_503(tmp_path, monkeypatch):
    """Guards docs/reliability.md, "The fault model": "Users with a weekly budget get 503 for GPU
    requests"."""
    w = world(tmp_path)
    monkeypatch.setattr(Ledger, "user_spans", ledger_down)
    exc = await refused(w, in_groups(w.spawner("carol", {"gpu_model": GTX}), "students"))
    assert exc.status_code == 503 and exc.reason == "ledger_unavailable"
    # the form still renders, without the note
    form = await in_groups(w.spawner("carol"), "students")._render_options_form()
    assert GTX in form and "GPU-hours" not in form


def seed(w: World, user: str, *spans):
    """Allocations of ``user`` in the ledger: (hours ago it started, hours it lasted or None, uuids)."""
    ledger = Ledger(w.db_url)
    now = datetime.now(timezone.utc)
    for i, (ago, hours, uuids) in enumerate(spans):
        service = f"old-{user}-{i}"
        start = now - timedelta(hours=ago)
        ledger.open(service, user, "", "gpu-a", GTX, uuids, [1000] * len(uuids), started_at=start)
        if hours is not None:
            ledger.close(service, start + timedelta(hours=hours))
    ledger.dispose()
    return now


async def test_a_used_up_weekly_budget_refuses_gpus_with_when_it_is_back(tmp_path):
    w = world(tmp_path)
    # 6 days ago 12 GPU-hours (2 GPUs for 6 h), yesterday 10: 22 of 20 used;
    # 2 GPU-hours must age out: 1 h of the 2-GPU span, 6 days ago + 1 h + 7 days.
    now = seed(w, "carol", (6 * 24, 6, ["GPU-a0", "GPU-a1"]), (24, 10, ["GPU-a2"]), (9 * 24, 10, ["GPU-a0"]))
    carol = in_groups(w.spawner("carol", {"gpu_model": GTX}), "students")
    before = refusals("budget")
    exc = await refused(w, carol)
    assert exc.status_code == 403 and exc.reason == "gpu_budget"
    assert refusals("budget") == before + 1
    message = exc.jupyterhub_message
    assert "Your weekly GPU budget of 20 GPU-hours is used up (22.0 GPU-hours in the last 7 days)" in message
    back = datetime.strptime(re.search(r"from (\S+ \S+) UTC", message)[1], "%Y-%m-%d %H:%M")
    expected = now - timedelta(hours=6 * 24) + timedelta(hours=1) + timedelta(days=7)
    assert abs(back.replace(tzinfo=timezone.utc) - expected) <= timedelta(minutes=1)
    # CPU-only servers still start
    carol.user_options = {}
    await w.started(carol)
    assert [v for _, _, v in w.fake.running_containers().values()] == ["void"]


async def test_an_open_holding_counts_up_to_now(tmp_path):
    w = world(tmp_path)
    seed(w, "dan", (21, None, ["GPU-a0"]))  # still held, 21 h so far
    exc = await refused(w, in_groups(w.spawner("dan", {"gpu_model": GTX}, server="second"), "students"), held=1)
    assert (
        "(21.0 GPU-hours" in exc.jupyterhub_message and "once your running GPU servers stop" in exc.jupyterhub_message
    )


async def test_the_form_offers_only_the_allowed_models_with_the_users_own_limit_and_budget(tmp_path):
    w = world(tmp_path)
    seed(w, "carol", (30, 5, ["GPU-a0"]))
    student = await in_groups(w.spawner("carol"), "students")._render_options_form()
    assert GTX in student and A100 not in student
    assert "Your limit: 1 per user" in student
    assert "15.0 of 20 GPU-hours left" in student
    staff = await in_groups(w.spawner("sam"), "staff")._render_options_form()
    assert GTX in staff and A100 in staff and "Your limit: 4 per user" in staff and "GPU-hours left" not in staff
    others = await in_groups(w.spawner("eve"), "physics")._render_options_form()
    assert GTX not in others and A100 not in others and "Your servers here are CPU-only." in others
    # 5 + 3 h × 2 + 2 h × 3 + 1 h × 3 = 20 GPU-hours: used up
    seed(w, "carol", (3, 3, ["GPU-a0", "GPU-a1"]), (2, 2, ["GPU-a0", "GPU-a1", "GPU-a2"]))
    seed(w, "carol", (1, 1, ["GPU-a0", "GPU-a1", "GPU-a2"]))
    over = await in_groups(w.spawner("carol"), "students")._render_options_form()
    assert "is used up" in over and 'name="gpu_count"' not in over


def test_bad_rules_stop_the_hub_and_unknown_models_are_warned(caplog):
    c = Config()
    c.GPUSwarmSpawner.gpu_inventory = INVENTORY
    c.GPUSwarmSpawner.gpu_access = {"students": {"max_gpu": 1}}
    with pytest.raises(SystemExit) as exc:
        validate_config(c)
    assert str(exc.value).startswith("gpuspawner configuration error: gpu_access['students']: unknown key(s) 'max_gpu'")
    c.GPUSwarmSpawner.gpu_access = {"lab": {"models": [GTX, "Tesla T4"]}}
    with caplog.at_level(logging.WARNING):
        validate_config(c)
    assert "gpu_access names a model no GPU has: lab: Tesla T4" in caplog.text


@pytest.mark.explore
def test_a_budgeted_spawn_racing_a_staff_spawn_and_a_reconcile_every_interleaving(tmp_path):
    """The budget's ledger read is one more await before anything is reserved:
    under every schedule of a student's spawn (cancelled or not), a staff spawn of
    both A100s and a reconciliation, no GPU is booked twice, the student gets a
    GTX 1070 or nothing, and the ledger matches the holdings."""

    def scenario(run: Run) -> Scenario:
        w = world(tmp_path, run.executor)
        seed(w, "carol", (30, 5, ["GPU-a0"]))
        carol = in_groups(w.spawner("carol", {"gpu_model": GTX}), "students")
        sam = in_groups(w.spawner("sam", {"gpu_model": A100, "gpu_count": 2}), "staff")
        w.fake.run_all()

        def check(outcome):
            check_all(w)(outcome)
            for service, _, visible in w.fake.running_containers().values():
                if service == carol.service_name:
                    assert visible.startswith("GPU-a"), visible

        return Scenario(
            ops={"carol": carol.start, "sam": sam.start, "reconcile": lambda: w.owner.reconcile()},
            events={"run_all": w.fake.run_all},
            cancellable=("carol",),
            invariant=w.invariant,
            check=check,
        )

    stats = explore(scenario, max_schedules=150)
    assert stats.schedules >= 100


async def test_a_waiter_whose_budget_was_used_up_while_waiting_is_refused_when_served(tmp_path):
    """The budget is checked again when the line serves a request: carol joined at
    15 of 20 GPU-hours; her other use while she waited took her to 25, so the GPU
    that frees up is not hers (403, as a fresh request gets), and goes back."""
    w = world(tmp_path)
    sam = in_groups(w.spawner("sam", {"gpu_model": GTX, "gpu_count": 3}), "staff")
    await w.started(sam)
    seed(w, "carol", (48, 15, ["GPU-a0"]))
    carol = in_groups(w.spawner("carol", {"gpu_model": GTX, "gpu_wait": True}), "students")
    carol_start = asyncio.ensure_future(carol.start())
    await until(lambda: w.hub.line.place(carol.service_name) == (GTX, 1))
    seed(w, "carol", (30, 10, ["GPU-a1"]))  # another of her servers ran on meanwhile
    await stopped(w, sam)
    with pytest.raises(SpawnException) as exc:
        await asyncio.wait_for(carol_start, 10)
    assert exc.value.status_code == 403 and exc.value.reason == "gpu_budget"
    assert "25.0 GPU-hours in the last 7 days" in exc.value.jupyterhub_message
    assert w.owner.get(carol.service_name) is None and w.hub.line.rows == []
    assert Ledger(w.db_url).waiting() == []


async def test_a_ledger_that_cannot_say_the_budget_when_the_line_serves_keeps_the_waiters_place(tmp_path, monkeypatch):
    """The budget's re-check is a ledger read: while it fails, carol stays first in line
    (a failure that may pass), and she is served once the ledger answers."""
    from gpuspawner.line import wait as line_wait

    monkeypatch.setattr(line_wait, "RETRY_SECONDS", 0.1)
    w = world(tmp_path)
    sam = in_groups(w.spawner("sam", {"gpu_model": GTX, "gpu_count": 3}), "staff")
    await w.started(sam)
    carol = in_groups(w.spawner("carol", {"gpu_model": GTX, "gpu_wait": True}), "students")
    carol_start = asyncio.ensure_future(w.started(carol))
    await until(lambda: w.hub.line.place(carol.service_name) == (GTX, 1))
    with monkeypatch.context() as m:
        m.setattr(Ledger, "user_spans", ledger_down)
        await stopped(w, sam)
        await asyncio.sleep(0.5)  # several tries of the line
        assert not carol_start.done() and w.hub.line.place(carol.service_name) == (GTX, 1)
    await asyncio.wait_for(carol_start, 10)
    assert w.owner.get(carol.service_name).held.model == GTX and w.hub.line.rows == []


async def test_a_request_may_add_only_what_the_budget_has_left_and_is_stopped_there(tmp_path):
    """docs/access.md, what a request may add: carol has used 12 of 20 GPU-hours;
    2 GPUs for her group's 8 hours would add 16, so the server gets 4 hours (the 8
    left, over 2 GPUs); those 8 are then spoken for, and her next GPU request gets
    403 saying so. The reclaim warns her, then stops the server at 4 hours with the
    end reason ``budget``: her week ends at the budget, not above it.

    Guards docs/access.md, "What a request may add": "through the spawner, the ledger and the
    reclaim's stop"."""
    import time

    from tests.unit.test_reclaim import Clock, stop_through_spawners

    clock, base = Clock(), time.time()
    rules = {**RULES, "lab": {"models": "*", "max_gpus": 4, "max_hours": 8, "weekly_gpu_hours": 20}}
    w = World(
        tmp_path,
        inventory=INVENTORY,
        gpu_access=rules,
        clocks=dict(clock=clock, wall=lambda: base + clock.now - Clock.now),
    )
    seed(w, "carol", (30, 6, ["GPU-a0", "GPU-a1"]))  # 12 GPU-hours
    first = in_groups(w.spawner("carol", {"gpu_model": GTX, "gpu_count": 2}), "lab")
    await w.started(first)
    assert first.gpu_budget_hours == pytest.approx(4.0, abs=0.01)
    assert first.get_state()["gpu_budget_hours"] == first.gpu_budget_hours  # kept over a hub restart
    limits = first.reclaim_limits()
    assert limits.max_held_reason == "budget" and limits.max_held == pytest.approx(4 * 3600, abs=40)
    assert any("lets it hold its GPUs for 4.0 h" in e["message"] for e in first._progress.events)

    again = w.spawner("carol")
    again.load_state(first.get_state())
    assert again.gpu_budget_hours == first.gpu_budget_hours

    from gpuspawner.core.idle import Limits
    from gpuspawner.web.home_gpus import server_rows

    found = w.hub.reclaimer
    found.limits_for = lambda h: Limits()  # no time limit: it adds nothing, its use counts as it goes
    assert found.may_still_use("carol") == 0
    found.limits_for = lambda h: first.reclaim_limits()  # the hub asks the server's spawner
    assert found.may_still_use("carol") == pytest.approx(8.0, abs=0.02)
    await found.check()
    [row] = server_rows(w.hub, "carol")
    assert any(stop.startswith("weekly budget in 4.0 h") for stop in row["stops"]), row
    stopped = stop_through_spawners(w, {"carol": first})
    second = in_groups(w.spawner("carol", {"gpu_model": A100}, server="second"), "lab")
    exc = await refused(w, second, held=2)
    assert exc.status_code == 403 and exc.reason == "gpu_budget"
    assert "(12.0 GPU-hours in the last 7 days, and 8.0 more that your running GPU servers may use" in (
        exc.jupyterhub_message
    )

    await found.check()
    clock.now += first.gpu_budget_hours * 3600 - 900  # the 15-minute warning begins
    await found.check()
    [notice] = found.notices_for("carol")
    assert notice["reason"] == "budget" and "has used what your weekly GPU budget had left" in notice["message"]
    clock.now += 899
    await found.check()
    assert stopped == []
    clock.now += 1
    await found.check()
    assert stopped == [("carol", "budget")]
    [closed] = [r for r in Ledger(w.db_url).history(user="carol") if r.service == first.service_name]
    assert closed.end_reason == "budget"
