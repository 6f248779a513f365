"""The interleaving explorer finds races that a single run misses, and only those."""

from __future__ import annotations

import asyncio
import itertools
import time
from math import comb, factorial

import pytest

from gpuspawner.cluster.service_spec import build_service
from gpuspawner.cluster.swarm import Swarm, SwarmError
from gpuspawner.core.labels import Held
from tests.fakedocker import FakeDocker
from tests.interleave import (
    AnswerLost,
    Nondeterminism,
    Run,
    Scenario,
    ScheduleFailure,
    StepExecutor,
    explore,
    random_schedules,
    replay,
    scaled,
)


def counter_scenario(*, locked: bool, ops: int = 2):
    """``ops`` coroutines each read a shared counter, then write it + 1, through executor calls."""

    def scenario(run: Run) -> Scenario:
        state = {"n": 0}
        lock = asyncio.Lock()

        def read():
            return state["n"]

        def write(value):
            state["n"] = value

        async def increment():
            loop = asyncio.get_running_loop()
            if locked:  # after a first call, so that either op may come to the lock first
                await loop.run_in_executor(run.executor, lambda: None)
                await lock.acquire()
            try:
                value = await loop.run_in_executor(run.executor, read)
                await loop.run_in_executor(None, write, value + 1)  # the default executor is stepped too
            finally:
                if locked:
                    lock.release()

        def check(outcome):
            assert not outcome.errors
            assert state["n"] == ops, f"lost update: {state['n']} after {ops} increments"

        return Scenario(ops={f"inc{i}": increment for i in range(ops)}, check=check)

    return scenario


def steps_scenario(*counts: int):
    """Ops that each make ``k`` executor calls and nothing else."""

    def scenario(run: Run) -> Scenario:
        async def op(k):
            for i in range(k):
                await asyncio.get_running_loop().run_in_executor(run.executor, lambda i=i: i)

        return Scenario(ops=[lambda k=k: op(k) for k in counts])

    return scenario


def test_the_lost_update_is_found_and_replayed():
    scenario = counter_scenario(locked=False)
    with pytest.raises(ScheduleFailure) as found:
        explore(scenario)
    failure = found.value
    assert "lost update: 1 after 2 increments" in str(failure)
    assert "inc0: read()" in str(failure) and "inc1: read()" in str(failure)
    assert f"replay(scenario, {failure.schedule})" in str(failure)
    with pytest.raises(ScheduleFailure) as again:
        replay(scenario, failure.schedule)
    assert again.value.labels == failure.labels
    with pytest.raises(ScheduleFailure):
        replay(scenario, [])  # the first choice each time is the oldest call: the reads interleave
    assert replay(scenario, [0, 1, 0, 0]).labels == [  # one after the other: fine
        "inc0: read()",
        "inc0: write(1)",
        "inc1: read()",
        "inc1: write(2)",
    ]


def test_with_a_lock_every_schedule_passes():
    stats = explore(counter_scenario(locked=True))
    # The first to arrive takes the lock; the other arrives at one of 3 points before it can read.
    assert stats.complete and stats.schedules == 2 * 3
    stats = explore(counter_scenario(locked=True, ops=3))
    assert stats.complete and stats.outcomes == {"inc0=ok inc1=ok inc2=ok": stats.schedules}


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_two_ops_of_k_steps_have_binomial_many_schedules(k):
    stats = explore(steps_scenario(k, k))
    assert stats.complete and stats.schedules == comb(2 * k, k)
    assert stats.max_depth == 2 * k


def test_three_ops_have_multinomial_many_schedules():
    stats = explore(steps_scenario(2, 2, 2))
    assert stats.schedules == factorial(6) // 2**3 == 90
    assert stats.choice_points > stats.schedules  # the tree's inner nodes are counted once


def test_max_schedules_bounds_the_search():
    stats = explore(steps_scenario(4, 4), max_schedules=10)
    assert stats.schedules == 10 and not stats.complete


def test_a_scenario_that_is_not_the_same_each_run_is_refused():
    runs = itertools.count()

    def scenario(run: Run) -> Scenario:
        n = next(runs)  # state kept between runs: the replayed prefix differs

        async def op():
            await asyncio.get_running_loop().run_in_executor(run.executor, lambda: n)

        return Scenario(ops={f"a{n}": op, "b": op})

    with pytest.raises(
        Nondeterminism, match=r"choice 0: expected \['a0: <lambda>\(\)', 'b: <lambda>\(\)'\], got \['a1"
    ):
        explore(scenario)


def test_random_schedules_are_reproducible():
    found = []
    for _ in range(2):
        with pytest.raises(ScheduleFailure) as exc:
            random_schedules(counter_scenario(locked=False, ops=3), seed=7, n=200)
        found.append(exc.value.schedule)
    assert found[0] == found[1]
    assert random_schedules(counter_scenario(locked=True), seed=1, n=20).schedules == scaled(20)


def test_virtual_time_costs_no_wall_time():
    def scenario(run: Run) -> Scenario:
        async def sleeper():
            await asyncio.sleep(30)
            return asyncio.get_running_loop().time()

        async def impatient():
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.Event().wait(), timeout=5)
            return asyncio.get_running_loop().time()

        return Scenario(ops={"sleeper": sleeper, "impatient": impatient})

    started = time.monotonic()
    stats = explore(scenario)
    outcome = replay(scenario, [])
    assert time.monotonic() - started < 1
    assert outcome.results == {"sleeper": 30, "impatient": 5} and outcome.time == 30
    assert outcome.labels == ["time +5s", "time +25s"] and stats.schedules == 1


def test_op_errors_are_returned_for_the_check_to_judge():
    def scenario(run: Run) -> Scenario:
        async def refused():
            raise ValueError("no GPU free")

        def check(outcome):
            assert isinstance(outcome.errors["refused"], ValueError)

        return Scenario(ops={"refused": refused}, check=check)

    assert explore(scenario).outcomes == {"refused=ValueError": 1}


def test_an_op_that_never_finishes_is_reported_not_waited_for():
    def deadlock(run: Run) -> Scenario:
        async def waiter():
            await asyncio.Event().wait()

        return Scenario(ops={"waiter": waiter})

    waits = r"waiter: nothing can happen \(deadlock\); waits in waiter \(test_interleave.py:\d+\) > wait \(locks"
    with pytest.raises(ScheduleFailure, match=waits):
        explore(deadlock)
    assert explore(deadlock, fail_on_unfinished=False).unfinished == 1

    def forever(run: Run) -> Scenario:
        async def poller():
            while True:
                await asyncio.sleep(1)

        return Scenario(ops={"poller": poller})

    with pytest.raises(ScheduleFailure, match="poller: no end after 50 choices; waits in poller"):
        explore(forever, max_depth=50)


def test_events_fire_at_any_point_at_most_once():
    def scenario(run: Run) -> Scenario:
        seen = []

        async def op():
            loop = asyncio.get_running_loop()
            for _ in range(2):
                seen.append(await loop.run_in_executor(run.executor, lambda: fired))

        fired = []
        return Scenario(ops={"op": op}, events={"fire": lambda: fired.append(1)})

    stats = explore(scenario)
    # before the 1st step, before the 2nd, or never (the schedule ends with the op)
    assert stats.complete and stats.schedules == 3


def test_cancelling_an_op_and_abandoned_steps():
    """A cancelled op's pending call may still reach the daemon, even after
    the op is over (a worker thread had sent it), or never."""
    made = []

    def scenario(run: Run) -> Scenario:
        made.clear()

        async def spawn():
            await asyncio.get_running_loop().run_in_executor(run.executor, made.append, "service")

        def check(outcome):
            if "cancel spawn" in outcome.labels:
                assert isinstance(outcome.errors["spawn"], asyncio.CancelledError)

        return Scenario(ops={"spawn": spawn}, cancellable=("spawn",), check=check)

    stats = explore(scenario)
    assert stats.outcomes == {"spawn=ok": 1, "spawn=CancelledError": 2}
    late = replay(scenario, [1, 0])
    assert late.labels == ["cancel spawn", "spawn: append('service') (abandoned)"] and made == ["service"]
    never = replay(scenario, [1, 1])
    assert never.labels == ["cancel spawn", "end"] and made == []


def test_a_serial_executor_runs_calls_in_order_and_skips_abandoned_queued_ones():
    """As dockerspawner's ThreadPoolExecutor(1): the first call is at the
    worker and will run; a queued one whose caller gave up never does."""
    seen = set()

    def scenario(run: Run) -> Scenario:
        serial = run.serial_executor()

        async def op(name):
            loop = asyncio.get_running_loop()
            for _ in range(2):
                await loop.run_in_executor(serial, lambda: None)

        def check(outcome):
            seen.update(outcome.labels)

        return Scenario(ops={"a": lambda: op("a"), "b": lambda: op("b")}, cancellable=("b",), check=check)

    assert replay(scenario, [0, 0, 0, 0]).labels == ["a: <lambda>()", "b: <lambda>()"] * 2
    stats = explore(scenario)
    assert stats.complete and stats.outcomes == {"a=ok b=ok": 1, "a=ok b=CancelledError": 5}
    assert "b: <lambda>() (abandoned)" in seen  # cancelled while at the worker: it still runs
    # Cancelled while queued behind a's call: b's never runs.
    assert replay(scenario, [1]).labels == ["cancel b", "a: <lambda>()", "a: <lambda>()"]


def test_an_event_can_start_an_op_that_cancels_another():
    """JupyterHub's DELETE of a pending server: cancel the spawn, wait a second, then stop."""

    def scenario(run: Run) -> Scenario:
        log = []

        async def spawn():
            try:
                await asyncio.sleep(10)
                log.append("started")
            except asyncio.CancelledError:
                log.append("cancelled")
                raise

        async def delete():
            run.task("spawn").cancel()
            await asyncio.sleep(1)
            log.append("stopped")

        def check(outcome):
            assert log in (["started"], ["cancelled", "stopped"])

        return Scenario(ops={"spawn": spawn}, events={"delete": delete}, check=check)

    assert explore(scenario).outcomes == {"spawn=ok": 1, "delete=ok spawn=CancelledError": 1}


def test_steps_name_the_docker_calls_of_swarm():
    holding = Held(user="alice", server="", host="gpu-a", uuids=("GPU-1",), model="A100", port=None)
    kwargs = build_service(name="jupyter-alice", image="img", command=None, env={}, holding=holding)

    def scenario(run: Run) -> Scenario:
        fake = FakeDocker(nodes=["manager", "gpu-a"])
        swarm = Swarm(fake, run.executor)

        async def start():
            await swarm.create_service(**kwargs)
            return [t["Status"]["State"] for t in await swarm.tasks("jupyter-alice")]

        return Scenario(ops={"start": start}, events={"run": fake.run_all})

    outcome = replay(scenario, [0, 0])
    assert outcome.labels[0].startswith("start: create_service(task_template={")
    assert outcome.labels[1] == "start: tasks(filters={'service': 'jupyter-alice'})"
    assert explore(scenario).outcomes == {"start=ok": 3}


def test_a_stop_waits_for_the_container_in_every_interleaving():
    """The real Swarm seam against the fake: removing a service, then waiting
    for its task, never reports it ended while its container runs."""
    holding = Held(user="alice", server="", host="gpu-a", uuids=("GPU-1",), model="A100", port=None)

    def scenario(run: Run) -> Scenario:
        fake = FakeDocker(nodes=["manager", "gpu-a"])
        fake.create_service(**build_service(name="jupyter-alice", image="img", command=None, env={}, holding=holding))
        fake.run_all()
        swarm = Swarm(fake, run.executor)
        fake.calls.clear()

        async def stop():
            task_ids = [t["ID"] for t in await swarm.tasks("jupyter-alice")]
            await swarm.remove_service("jupyter-alice")
            ended = await swarm.wait_tasks_ended(task_ids, timeout=1)
            assert ended == (not fake.running_containers()), "ended must mean: no container runs"
            return ended

        def invariant():
            assert len(fake.running_containers()) <= 1

        def check(outcome):
            assert isinstance(outcome.results.get("stop"), bool) or isinstance(outcome.errors["stop"], SwarmError)

        return Scenario(
            ops={"stop": stop},
            events={
                "exit": fake.exit_all,
                "reap": fake.reap,
                "manager 500": lambda: fake.fail_next("tasks", status=500),
            },
            invariant=invariant,
            check=check,
        )

    stats = explore(scenario, max_schedules=5000)
    assert stats.complete
    assert {"stop=ok", "stop=SwarmError"} <= {o.split()[0] for o in stats.outcomes}


def test_a_scenario_with_a_step_executor_of_its_own_is_not_needed():
    """The run's executor is also the loop's default one."""

    def scenario(run: Run) -> Scenario:
        async def op():
            return await asyncio.get_running_loop().run_in_executor(None, lambda: 42)

        assert isinstance(run.executor, StepExecutor)
        return Scenario(ops={"op": op})

    outcome = replay(scenario, [])
    assert outcome.results == {"op": 42} and outcome.labels == ["op: <lambda>()"]


def test_a_step_may_fail_instead_of_running_at_most_max_faults_times():
    """Each of two calls may fail (the dependency blinked) instead of running; with
    one fault per schedule: no fault, the first fails, or the second does."""

    def scenario(run: Run, max_faults: int = 1) -> Scenario:
        async def op():
            loop = asyncio.get_running_loop()
            got = []
            for i in range(2):
                try:
                    got.append(await loop.run_in_executor(run.executor, lambda i=i: f"ran {i}"))
                except ConnectionError:
                    got.append("failed")
            return got

        def faults(step):
            return ConnectionError("the database is down") if "lambda" in step.label else None

        return Scenario(ops={"op": op}, faults=faults, max_faults=max_faults)

    seen = set()

    def check(outcome):
        seen.add(tuple(outcome.results["op"]))

    def checked(run):
        s = scenario(run)
        s.check = check
        return s

    stats = explore(checked)
    assert stats.complete and stats.schedules == 3
    assert seen == {("ran 0", "ran 1"), ("failed", "ran 1"), ("ran 0", "failed")}
    two = explore(lambda run: scenario(run, max_faults=2))
    assert two.complete and two.schedules == 4  # and both may fail


def test_a_fault_may_come_after_the_call_took_effect_and_each_listed_fault_is_a_choice():
    """A call whose faults are [before, after]: three schedules, the call runs and
    answers, fails without running, or runs and then fails (its effect stays)."""
    seen = set()

    def scenario(run: Run) -> Scenario:
        done: list[str] = []

        async def op():
            try:
                await asyncio.get_running_loop().run_in_executor(run.executor, lambda: done.append("ran"))
                return "answered", tuple(done)
            except ConnectionError:
                return "failed", tuple(done)

        def faults(step):
            return [ConnectionError("down"), AnswerLost(ConnectionError("dropped"))]

        return Scenario(ops={"op": op}, faults=faults, check=lambda outcome: seen.add(outcome.results["op"]))

    stats = explore(scenario)
    assert stats.complete and stats.schedules == 3
    assert seen == {("answered", ("ran",)), ("failed", ()), ("failed", ("ran",))}


def test_during_an_outage_every_call_fails_and_its_events_say_when_it_begins_and_ends():
    """Three calls in a row; a database that goes down and comes back once, at any
    point: each call fails exactly while it is down, never by choice."""
    seen = set()

    def scenario(run: Run) -> Scenario:
        down = [False]

        async def op():
            loop, got = asyncio.get_running_loop(), []
            for i in range(3):
                try:
                    got.append(await loop.run_in_executor(run.executor, lambda i=i: f"ran {i}"))
                except ConnectionError:
                    got.append("failed")
            return tuple(got)

        def outage(step):
            return ConnectionError("the database is down") if down[0] else None

        def up():
            down[0] = False

        return Scenario(
            ops={"op": op},
            events={"down": lambda: down.__setitem__(0, True), "up": up},
            outage=outage,
            check=lambda outcome: seen.add(outcome.results["op"]),
        )

    stats = explore(scenario)
    assert stats.complete
    assert ("ran 0", "ran 1", "ran 2") in seen and ("failed", "failed", "failed") in seen
    # Failures come in one run of calls: an outage, not single blinks.
    assert ("failed", "ran 1", "failed") not in seen and ("ran 0", "failed", "ran 2") in seen


def test_a_scale_asks_for_more_schedules_the_first_ones_unchanged(monkeypatch):
    """Guards docs/reliability.md, "The fault model": "samples twenty times as many, the first ones the
    same"."""

    def first_schedules(n):
        seen = []

        def recorded(run):
            s = counter_scenario(locked=True)(run)
            s.check = lambda outcome: seen.append(tuple(outcome.schedule))
            return s

        random_schedules(recorded, seed=3, n=n)
        return seen

    firsts = first_schedules(5)
    monkeypatch.setenv("GPUSPAWNER_EXPLORE_SCALE", "3")
    assert scaled(5) == 15
    more = first_schedules(5)
    assert len(more) == 15 and more[:5] == firsts
    monkeypatch.setenv("GPUSPAWNER_EXPLORE_SCALE", "0")
    with pytest.raises(ValueError, match="GPUSPAWNER_EXPLORE_SCALE"):
        scaled(5)
