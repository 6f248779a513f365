"""Priority in the line under gpu_access, with the real spawner, owner and
SQLite ledger over the fake swarm: a user's priority comes from their groups
at the spawn, a place in line keeps the priority it was taken with (also
across a hub restart), and a request the rules forbid never enters the line."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException

from gpuspawner.ledger.ledger import Ledger, LedgerError
from gpuspawner.line import wait as line_wait
from tests.unit.test_access_spawn import in_groups
from tests.unit.test_holdings import A100, World, driven
from tests.unit.test_line import WAIT, messages, stopped, until

GTX = "NVIDIA GeForce GTX 1070"
RULES = {
    "students": {"models": [A100], "max_gpus": 1},
    "staff": {"models": "*", "max_gpus": 4, "priority": 10},
    "guests": {"models": [GTX], "max_gpus": 1},
}


def ledger_down_at_first(monkeypatch) -> list[int]:
    """The ledger cannot be read the first time the line is read (the hub starts before
    its database); it answers after. The reads so far."""
    reads: list[int] = []
    real = Ledger.waiting

    def flaky(self):
        reads.append(1)
        if len(reads) == 1:
            raise LedgerError("the ledger's database is unreachable")
        return real(self)

    monkeypatch.setattr(Ledger, "waiting", flaky)
    from gpuspawner.hub import resume

    monkeypatch.setattr(resume, "LOAD_RETRY_SECONDS", 0.01)
    return reads


def world(tmp_path, rules=RULES) -> World:
    return World(tmp_path, gpu_access=rules)


def place(w: World, spawner):
    return w.hub.line.place(spawner.service_name)


def rows(w: World) -> list[tuple[str, int]]:
    return [(r.user, r.priority) for r in Ledger(w.db_url).waiting()]


def says_place(last: list[str], at: int) -> bool:
    """The last progress message (``last``: none or one) is "You are number ``at`` in
    line for the A100", with or without what follows about the wait."""
    said = f"You are number {at} in line for {A100}"
    return bool(last) and (last[0] == said or last[0].startswith(f"{said}. "))


async def waiting(w: World, spawner, at: int) -> asyncio.Future:
    """``spawner``'s start, once it waits as number ``at`` in line (a place read
    from the ledger is not enough: the start must have got as far as its wait)."""
    start = asyncio.ensure_future(spawner.start())
    await until(lambda: place(w, spawner) == (A100, at) and says_place(messages(spawner)[-1:], at))
    return start


async def served(w: World, start: asyncio.Future) -> None:
    """A waiting start carries on: the swarm starts its task."""
    await driven(start, w.fake.run_all)


async def cancelled(spawner, start: asyncio.Future) -> None:
    """The Cancel button: JupyterHub cancels the spawn, then stops the server."""
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    await spawner.stop()


async def test_a_staff_waiter_goes_ahead_of_an_earlier_student_and_is_served_first(tmp_path):
    """Guards docs/line.md, "The order": "a staff member who joins after a student is number 1 and the
    student number 2; the next A100 that frees up starts the staff member's server"."""
    w = world(tmp_path)
    alice = w.spawner("alice", {"gpu_model": A100})  # in no group: the hub's defaults
    await w.started(alice)
    stu = in_groups(w.spawner("stu", WAIT), "students")
    stu_start = await waiting(w, stu, 1)
    prof = in_groups(w.spawner("prof", WAIT), "staff")
    prof_start = await waiting(w, prof, 1)
    assert place(w, stu) == (A100, 2)
    assert rows(w) == [("stu", 0), ("prof", 10)]  # arrival order in the ledger; priority orders the line
    await until(lambda: says_place(messages(stu)[-1:], 2))
    assert says_place(messages(prof)[-1:], 1)
    await stopped(w, alice)
    await served(w, prof_start)
    assert w.owner.get(prof.service_name).held.uuids == ("GPU-b0",)
    assert place(w, stu) == (A100, 1) and rows(w) == [("stu", 0)]
    await cancelled(stu, stu_start)
    assert rows(w) == []


async def test_a_membership_change_applies_at_the_next_spawn_not_to_a_place_taken(tmp_path):
    w = world(tmp_path)
    await w.started(w.spawner("alice", {"gpu_model": A100}))
    carol = in_groups(w.spawner("carol", WAIT), "students")
    carol_start = await waiting(w, carol, 1)
    stu = in_groups(w.spawner("stu", WAIT), "students")
    stu_start = await waiting(w, stu, 2)
    in_groups(stu, "students", "staff")  # an admin adds him to staff while he waits
    await asyncio.sleep(0.1)
    assert place(w, stu) == (A100, 2)  # his place keeps the priority it was taken with
    await cancelled(stu, stu_start)
    stu_again = await waiting(w, stu, 1)  # his next spawn: staff's priority, ahead of carol
    assert rows(w) == [("carol", 0), ("stu", 10)]
    assert place(w, carol) == (A100, 2)
    await cancelled(stu, stu_again)
    await cancelled(carol, carol_start)
    assert rows(w) == []


@pytest.mark.parametrize(
    "groups, options",
    [
        (["guests"], WAIT),  # a model the group does not have
        (["students"], {**WAIT, "gpu_count": 2}),  # over the group's max_gpus
    ],
)
async def test_a_request_the_rules_forbid_never_enters_the_line(tmp_path, groups, options):
    w = world(tmp_path)
    await w.started(w.spawner("alice", {"gpu_model": A100}))
    ahead = in_groups(w.spawner("stu", WAIT), "students")
    ahead_start = await waiting(w, ahead, 1)
    with pytest.raises(SpawnException) as exc:
        await w.started(in_groups(w.spawner("gus", options), *groups))
    assert exc.value.status_code == 403 and exc.value.reason == "gpu_access"
    assert rows(w) == [("stu", 0)] and [r.user for r in w.hub.line.rows] == ["stu"]
    await cancelled(ahead, ahead_start)


async def restarted_hub(tmp_path, rules=RULES) -> World:
    """A hub that restarted: alice's server (left by the earlier hub) holds the
    GPU, and the ledger has the earlier hub's line: stu (a student) waited
    first, prof (staff, priority 10) after him."""
    w = world(tmp_path, rules)
    w.leftover("alice")
    ledger = Ledger(w.db_url)
    ledger.enqueue("jupyter-stu", "stu", "", A100, 0, WAIT)
    ledger.enqueue("jupyter-prof", "prof", "", A100, 10, WAIT)
    assert (await w.owner.reconcile())["adopted"] == 1  # the restarted hub's first reconcile
    await w.hub.line.load()  # as line_resume does, before the spawns are issued again
    return w


def short_deadlines(w: World, monkeypatch, seconds: float) -> None:
    """Rows without a live wait leave ``seconds`` from now."""
    monkeypatch.setattr(line_wait, "UNOWNED_SECONDS", seconds)
    w.hub.line.restart_clocks()


async def stopped_leftover(w: World, user: str) -> None:
    """The leftover server is removed and its container exits: its GPU comes back."""
    removal = asyncio.ensure_future(w.owner.remove(f"jupyter-{user}"))
    await asyncio.sleep(0.05)
    w.fake.exit_all()
    assert await removal


async def test_a_resumed_spawn_keeps_the_priority_stored_in_the_line(tmp_path):
    w = await restarted_hub(tmp_path)
    prof = w.spawner("prof", WAIT)  # no longer staff: the place he had is kept
    stu = in_groups(w.spawner("stu", WAIT), "students")
    prof_start = await waiting(w, prof, 1)
    stu_start = await waiting(w, stu, 2)
    assert rows(w) == [("stu", 0), ("prof", 10)]
    await stopped_leftover(w, "alice")
    await served(w, prof_start)
    assert w.owner.get(prof.service_name) is not None and place(w, stu) == (A100, 1)
    await cancelled(stu, stu_start)


async def test_a_resumed_spawn_the_rules_now_forbid_leaves_the_line(tmp_path):
    w = await restarted_hub(tmp_path, {**RULES, "*": {"models": [], "max_gpus": 0}})
    prof = w.spawner("prof", WAIT)  # in no group now: CPU only
    with pytest.raises(SpawnException) as exc:
        await w.started(prof)
    assert exc.value.status_code == 403
    assert rows(w) == [("stu", 0)] and place(w, prof) is None  # nobody waits behind a refused spawn
    assert Ledger(w.db_url).waiting()[0].service == "jupyter-stu"


async def test_after_a_refused_resumed_spawn_left_the_line_the_next_is_served_when_a_gpu_frees(tmp_path):
    """The one behind a spawn that left the line is its head now: the release
    serves it at once, not the periodic retry (10 s)."""
    w = await restarted_hub(tmp_path, {**RULES, "*": {"models": [], "max_gpus": 0}})
    with pytest.raises(SpawnException):
        await w.started(w.spawner("prof", WAIT))  # in no group now: refused, out of line
    stu = in_groups(w.spawner("stu", WAIT), "students")
    stu_start = await waiting(w, stu, 1)
    await stopped_leftover(w, "alice")
    released = asyncio.get_running_loop().time()
    await asyncio.wait_for(served(w, stu_start), line_wait.RETRY_SECONDS / 2)
    assert asyncio.get_running_loop().time() - released < 2
    assert w.owner.get(stu.service_name).held.uuids == ("GPU-b0",) and rows(w) == []


async def test_a_row_whose_resumed_spawn_never_waits_leaves_at_its_deadline_and_the_next_is_served(
    tmp_path, monkeypatch, caplog
):
    """Prof's resumed spawn failed in a hook before it could wait: his row has no
    live wait. It holds its place until its deadline, then leaves, and stu
    (behind him, waiting) is served; nobody edits the database.

    Guards docs/line.md, "A hub restart": "A row whose spawn is still not waiting 2 minutes after
    the spawns were resumed leaves the line" and "the one behind it is served next".

    Guards docs/reliability.md, "The fault model": "A row still without a live wait 2 minutes after
    the resume leaves the line"."""
    monkeypatch.setattr(line_wait, "RETRY_SECONDS", 0.1)
    w = await restarted_hub(tmp_path)
    stu = in_groups(w.spawner("stu", WAIT), "students")
    stu_start = await waiting(w, stu, 2)
    short_deadlines(w, monkeypatch, 1.0)  # only now: a slow set-up must not use them up
    await stopped_leftover(w, "alice")
    await asyncio.sleep(0.2)
    assert not stu_start.done() and place(w, stu) == (A100, 2)  # prof's place holds until its deadline
    await asyncio.wait_for(served(w, stu_start), 5)
    assert w.owner.get(stu.service_name).held.uuids == ("GPU-b0",) and rows(w) == []
    assert "jupyter-prof had no live spawn" in caplog.text


async def test_a_request_that_does_not_wait_is_not_refused_for_rows_past_their_deadline(tmp_path, monkeypatch):
    """Guards docs/line.md, "A hub restart": "a request without gpu_wait is no longer refused for it".

    Guards docs/reliability.md, "The fault model": "so nobody waits behind a spawn that will not
    come"."""
    w = await restarted_hub(tmp_path)  # neither stu's nor prof's spawn comes back
    short_deadlines(w, monkeypatch, 0.3)
    await stopped_leftover(w, "alice")
    with pytest.raises(SpawnException) as exc:
        await w.started(w.spawner("dave", {"gpu_model": A100}))
    assert exc.value.status_code == 409 and "2 requests are waiting in line" in exc.value.message
    await asyncio.sleep(0.4)
    await w.started(w.spawner("dave", {"gpu_model": A100}))
    assert w.owner.get("jupyter-dave").held.uuids == ("GPU-b0",) and rows(w) == []


async def test_resuming_reads_the_line_again_while_the_ledger_is_down_goes_on_past_a_failing_row_and_a_failed_spawn_leaves(
    tmp_path, monkeypatch
):
    """At hub start: the first read of the line fails (the ledger is coming up), so it is
    read again; prof's row cannot be resumed (the hub's user store fails), which does not
    stop stu's; stu's resumed spawn fails in a hook before it waits, so his row leaves at
    once. The hub's objects here are small stand-ins: only what resume_waiting touches.

    Guards docs/reliability.md, "The fault model": "The line is read again every 5 s; no waiter's
    place is lost", "The waiting spawns are resumed, in order" and "The row leaves the line at once;
    the others are resumed all the same"."""
    from gpuspawner import hub_port
    from gpuspawner.hub import resume

    w = world(tmp_path)
    ledger = Ledger(w.db_url)
    ledger.enqueue("jupyter-stu", "stu", "", A100, 0, WAIT)
    ledger.enqueue("jupyter-prof", "prof", "", A100, 10, WAIT)

    class Users(dict):
        def __getitem__(self, name):
            if name == "prof":
                raise RuntimeError("the user store is down")
            return super().__getitem__(name)

    stu = SimpleNamespace(spawners={"": SimpleNamespace(pending=None, ready=False)})
    spawned = []

    def spawn(_app, user, server, options):
        spawned.append((user, server, options))
        failed = asyncio.get_running_loop().create_future()
        failed.set_exception(RuntimeError("pre_spawn_hook failed"))
        return failed

    real = Ledger.waiting
    reads = ledger_down_at_first(monkeypatch)
    monkeypatch.setattr(hub_port, "running_hub", lambda: SimpleNamespace(users=Users(stu=stu)))
    monkeypatch.setattr(hub_port, "spawn_in_background", spawn)
    assert await resume.resume_waiting(w.hub.line, w.owner) == 1
    assert len(reads) == 2 and spawned == [(stu, "", WAIT)]
    await until(lambda: w.hub.line.place("jupyter-stu") is None)
    assert [r.service for r in w.hub.line.rows] == ["jupyter-prof"]  # no live wait: its deadline runs
    assert [r.service for r in real(ledger)] == ["jupyter-prof"]


@pytest.mark.explore
def test_hooks_and_the_ledger_failing_as_a_restarted_hub_resumes_the_line_leave_no_row_stuck(tmp_path, monkeypatch):
    """A restarted hub resumes bob's and carol's waits (their rows from the earlier hub)
    while alice's leftover server holds the one GPU and may stop at any point. Each
    resumed spawn first runs JupyterHub's hooks (an authenticator's ``pre_spawn_start``,
    the admin's ``pre_spawn_hook``), which may fail, and up to two calls (a hook, the
    ledger) fail anywhere. The GPU invariant holds at every step; in the end every row
    has left the line (served, failed before it waited, or timed out), none is left for
    the next hub, and one served holds the GPU with its open ledger row."""
    from gpuspawner import hub_port
    from gpuspawner.hub import resume
    from tests.interleave import Run, Scenario, random_schedules, scaled
    from tests.unit.test_holdings import clean, ledger_faults

    current: dict = {}
    monkeypatch.setattr(hub_port, "running_hub", lambda: current["app"])
    real_spawn = hub_port.spawn_in_background

    def spawn_in_background(app, user, server, options):
        current["spawns"].append(real_spawn(app, user, server, options))
        return current["spawns"][-1]

    monkeypatch.setattr(hub_port, "spawn_in_background", spawn_in_background)
    ends: list[str] = []

    def scenario(run: Run) -> Scenario:
        w = World(tmp_path, run.executor, gpu_wait_timeout=30)
        w.leftover("alice")
        ledger = Ledger(w.db_url)
        for name in ("bob", "carol"):
            ledger.enqueue(f"jupyter-{name}", name, "", A100, 0, WAIT)
        ledger.dispose()

        def hub_user(name: str):
            spawner = w.spawner(name)

            async def spawn(server, options):
                def pre_spawn_hook():  # JupyterHub's hooks, before the spawner's start
                    return None

                await asyncio.get_running_loop().run_in_executor(None, pre_spawn_hook)
                spawner.user_options = dict(options)
                await spawner.start()

            return SimpleNamespace(name=name, spawners={"": spawner}, spawn=spawn)

        async def add_user(user, server):
            return None

        current["app"] = SimpleNamespace(
            users={n: hub_user(n) for n in ("bob", "carol")}, proxy=SimpleNamespace(add_user=add_user)
        )
        current["spawns"] = []

        async def restart():
            await resume.resume_waiting(w.hub.line, w.owner)
            return await asyncio.gather(*current["spawns"], return_exceptions=True)

        def faults(step):
            if "pre_spawn_hook" in step.label:
                return RuntimeError("pre_spawn_hook failed")
            return ledger_faults(step)

        def check(outcome):
            clean(outcome)
            for end in outcome.results.get("restart", ()):
                assert end is None or isinstance(end, (SpawnException, RuntimeError)), repr(end)
                ends.append("started" if end is None else getattr(end, "reason", None) or str(end))
            for user in current["app"].users.values():  # the line reserved the GPU for them
                ends.extend("served" for m in messages(user.spawners[""]) if m.startswith("Reserved"))
            left = {r.service for r in Ledger(w.db_url).waiting()}
            assert w.hub.line.rows == [] and left <= w.hub.line._unrecorded, (w.hub.line.rows, left)
            served = [n for n in ("bob", "carol") if w.owner.get(f"jupyter-{n}") is not None]
            open_ = {r.service for r in Ledger(w.db_url).open_allocations()}
            assert all(f"jupyter-{n}" in open_ | w.owner._unopened for n in served), (served, open_)

        return Scenario(
            ops={"restart": restart},
            events={
                "stop_alice": lambda: w.owner.remove("jupyter-alice") if w.owner.get("jupyter-alice") else None,
                "run_all": w.fake.run_all,
                "exit_all": w.fake.exit_all,
            },
            faults=faults,
            max_faults=2,
            invariant=w.invariant,
            check=check,
        )

    stats = random_schedules(scenario, seed=31, n=150)
    assert stats.schedules == scaled(150)
    assert "served" in ends and "pre_spawn_hook failed" in ends, sorted(set(ends))
