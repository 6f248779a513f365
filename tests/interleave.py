"""Systematic exploration of the interleavings of asyncio operations.

The code under test makes its blocking calls (Docker, the database) through an
executor. Here that executor is a :class:`StepExecutor`, which runs nothing by
itself: each call becomes a pending *step*. Whenever the event loop has
nothing left to run, the scheduler makes a *choice*: run one pending step,
fire an external event (a container exits, a user cancels a spawn), make a
pending step fail instead of running it (a dependency that blinks: the
scenario's ``faults`` says which steps may, with what), or jump virtual time to
the next timer. A schedule is the sequence of choices, by index, so a failing
one can be replayed exactly. Once every op is over, what they left running in the
background runs its calls in order before the scenario's check.

:func:`explore` walks every schedule depth-first (bounded), and
:func:`random_schedules` samples them for scenarios too large for that.
Nothing sleeps for real: the loop's clock is virtual.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import os
import random
import re
from asyncio import events
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AnswerLost",
    "Nondeterminism",
    "Outcome",
    "Run",
    "Scenario",
    "ScheduleFailure",
    "Stats",
    "StepExecutor",
    "explore",
    "random_schedules",
    "replay",
    "scaled",
]


@dataclass
class Step:
    """One call submitted to the executor, not run yet."""

    seq: int  # submission order, across the run's executors
    label: str
    fn: Callable
    args: tuple
    kwargs: dict
    future: concurrent.futures.Future


class StepExecutor(concurrent.futures.Executor):
    """An executor that only records calls: the scheduler runs them, one at a
    time, in the order it chooses, in its own thread.

    ``serial``: like ThreadPoolExecutor(1) (dockerspawner's), calls run in the
    order they were submitted, and a queued call whose caller gave up is
    skipped; the default is a pool of many threads: any order."""

    def __init__(self, serial: bool = False, seq: Iterator[int] | None = None):
        self.serial = serial
        self.pending: list[Step] = []
        self._seq = seq if seq is not None else itertools.count()

    def submit(self, fn, /, *args, **kwargs):
        task = _current_task()
        who = f"{task.get_name()}: " if task else ""
        future = concurrent.futures.Future()
        self.pending.append(Step(next(self._seq), who + _describe(fn, args, kwargs), fn, args, kwargs, future))
        return future

    def runnable(self) -> list[Step]:
        """The steps that may run next."""
        if not self.serial:
            return list(self.pending)
        # The first call is at the worker already; the queued ones were never sent if their caller gave up.
        self.pending[1:] = [s for s in self.pending[1:] if not s.future.cancelled()]
        return self.pending[:1]

    def fail(self, step: Step, exc: BaseException) -> None:
        """The step's call fails with ``exc`` (the dependency blinked): without
        running, or, for :class:`AnswerLost`, after it ran (the caller cannot know)."""
        self.pending.remove(step)
        if isinstance(exc, AnswerLost):
            try:
                step.fn(*step.args, **step.kwargs)
            except BaseException:  # noqa: BLE001, S110  (it ran; whatever it said was lost)
                pass
            exc = exc.error
        if step.future.set_running_or_notify_cancel():
            step.future.set_exception(exc)

    def run(self, step: Step) -> None:
        """Run a step. One whose caller gave up waiting (its future cancelled)
        still runs when chosen: a worker thread may already have sent it."""
        self.pending.remove(step)
        wanted = step.future.set_running_or_notify_cancel()
        try:
            result = step.fn(*step.args, **step.kwargs)
        except BaseException as exc:  # noqa: BLE001  (the caller gets it, as from a thread)
            if wanted:
                step.future.set_exception(exc)
        else:
            if wanted:
                step.future.set_result(result)

    def shutdown(self, wait=True, *, cancel_futures=False):
        pass  # the scheduler ends each run itself


class AnswerLost(Exception):
    """A fault for ``Scenario.faults``: the call took effect, then its caller got ``error``
    (a request the daemon carried out whose answer the connection dropped)."""

    def __init__(self, error: BaseException):
        super().__init__(f"after the call: {error!r}")
        self.error = error


@dataclass
class Scenario:
    """What one run explores. ``ops``: coroutine factories started together
    at time 0, each to finish. ``events``: callables the scheduler may fire at
    any choice point, at most once each (one that returns an awaitable starts
    a new op of that name). ``cancellable``: ops the scheduler may cancel
    while they run, as JupyterHub cancels a pending spawn. ``faults(step)``:
    the exception a pending step may fail with instead of running, or a list of
    them, each a choice (None or []: it cannot fail), at most ``max_faults`` times per schedule.
    ``outage(step)``: the exception a step fails with whenever it is run (None: it runs),
    for a dependency that is down for a while (its events say when). ``invariant()``
    runs whenever the loop has settled; ``check(outcome)`` at the end."""

    ops: dict[str, Callable[[], Awaitable]] | list[Callable[[], Awaitable]]
    events: dict[str, Callable[[], Any]] = field(default_factory=dict)
    cancellable: tuple[str, ...] = ()
    faults: Callable[[Step], BaseException | list[BaseException] | None] | None = None
    max_faults: int = 1
    outage: Callable[[Step], BaseException | None] | None = None
    invariant: Callable[[], None] | None = None
    check: Callable[[Outcome], None] | None = None


@dataclass
class Run:
    """Handed to the scenario factory: the run's loop, its executor (also the
    loop's default one), and the ops' tasks once started."""

    loop: asyncio.AbstractEventLoop
    executor: StepExecutor
    tasks: dict[str, asyncio.Task] = field(default_factory=dict)
    executors: list[StepExecutor] = field(default_factory=list)
    faults: int = 0  # steps made to fail so far (by ``faults``)
    outage_failures: int = 0  # steps failed by an outage

    def __post_init__(self):
        self.executors.append(self.executor)

    def serial_executor(self) -> StepExecutor:
        """Another executor of the run, with one worker (see StepExecutor)."""
        executor = StepExecutor(serial=True, seq=self.executor._seq)
        self.executors.append(executor)
        return executor

    def task(self, name: str) -> asyncio.Task:
        return self.tasks[name]

    def runnable(self) -> list[tuple[StepExecutor, Step]]:
        return sorted(((e, s) for e in self.executors for s in e.runnable()), key=lambda es: es[1].seq)


@dataclass
class Outcome:
    """How a schedule ended: each op's result or exception (CancelledError
    for a cancelled op), and where the ops that did not finish wait."""

    schedule: list[int]
    labels: list[str]
    results: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)
    unfinished: dict[str, str] = field(default_factory=dict)
    time: float = 0.0  # virtual seconds at the end
    loop_errors: list[str] = field(default_factory=list)  # what the loop's exception handler got

    def summary(self) -> str:
        parts = [f"{n}=ok" for n in self.results] + [f"{n}={type(e).__name__}" for n, e in self.errors.items()]
        return " ".join(sorted(parts) + [f"{n}=unfinished" for n in sorted(self.unfinished)])


@dataclass
class Stats:
    schedules: int = 0
    choice_points: int = 0  # distinct decision points visited
    max_depth: int = 0  # the most choices in one schedule
    complete: bool = False  # every schedule was explored
    unfinished: int = 0  # schedules that ended with ops still waiting
    outcomes: Counter = field(default_factory=Counter)  # Outcome.summary() -> schedules


class ScheduleFailure(AssertionError):
    """An invariant or check failed (or an op never finished): the message
    lists the schedule; ``replay(scenario, exc.schedule)`` reproduces it."""

    def __init__(self, reason: str, schedule: list[int], labels: list[str], outcome: Outcome | None = None):
        lines = [reason]
        if outcome is not None and outcome.errors:
            lines += ["operations that raised:"] + [f"  {n}: {e!r}" for n, e in outcome.errors.items()]
        lines.append(f"schedule ({len(schedule)} choices):")
        lines += [f"  {i:3d}  [{c}] {label}" for i, (c, label) in enumerate(zip(schedule, labels))]
        lines.append(f"replay(scenario, {schedule})")
        super().__init__("\n".join(lines))
        self.schedule, self.labels, self.outcome = schedule, labels, outcome


class Nondeterminism(RuntimeError):
    """A replayed prefix offered other choices than before: the scenario
    depends on something the scheduler does not control."""


class _VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the scheduler says."""

    def __init__(self):
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def next_timer(self) -> float | None:
        return min((h.when() for h in self._scheduled if not h.cancelled()), default=None)

    def settle(self, limit: int = 100_000) -> None:
        """Run callbacks until none is ready and no timer is due."""
        for _ in range(limit):
            due = self.next_timer()
            if not self._ready and (due is None or due > self._now):
                return
            self._run_once()
        raise RuntimeError(f"the loop did not settle after {limit} rounds (a busy loop without awaits on steps?)")


def _run(
    factory: Callable[[Run], Scenario],
    choose: Callable[[int, list[str]], int],
    max_depth: int,
    fail_on_unfinished: bool,
) -> Outcome:
    """One schedule. ``choose(depth, labels)`` picks each choice."""
    loop = _VirtualLoop()
    executor = StepExecutor()
    loop._default_executor = executor  # run_in_executor(None, ...) too
    names: Counter = Counter()
    loop.set_task_factory(functools.partial(_named_task, names))
    outcome = Outcome([], [])
    loop.set_exception_handler(lambda _, ctx: outcome.loop_errors.append(str(ctx.get("message"))))
    run = Run(loop, executor)
    previous = events._get_running_loop()
    events._set_running_loop(loop)
    try:
        scenario = factory(run)
        ops = scenario.ops if isinstance(scenario.ops, dict) else {f"op{i}": f for i, f in enumerate(scenario.ops)}
        for name, op in ops.items():
            run.tasks[name] = loop.create_task(op(), name=name)
        fired: set[str] = set()
        while True:
            _guard(loop.settle, "the loop raised", outcome)
            if scenario.invariant:
                _guard(scenario.invariant, "invariant failed", outcome)
            waiting = [n for n, t in run.tasks.items() if not t.done()]
            choices = _choices(run, scenario, waiting, fired)
            if not waiting and not choices:
                break
            if not choices or len(outcome.schedule) >= max_depth:
                why = "nothing can happen (deadlock)" if not choices else f"no end after {max_depth} choices"
                outcome.unfinished = {n: f"{why}; waits {_where(run.tasks[n])}" for n in waiting}
                break
            labels = [label for label, _ in choices]
            index = choose(len(outcome.schedule), labels)
            outcome.schedule.append(index)
            outcome.labels.append(labels[index])
            if choices[index][1] is None:
                break
            _guard(choices[index][1], f"choice {labels[index]!r} raised", outcome)
        if not outcome.unfinished:
            _drain(run, scenario, outcome)
        _collect(run, outcome)
        if outcome.unfinished and fail_on_unfinished:
            raise ScheduleFailure(
                "operations did not finish:\n" + "\n".join(f"  {n}: {w}" for n, w in outcome.unfinished.items()),
                outcome.schedule,
                outcome.labels,
                outcome,
            )
        if scenario.check:
            _guard(functools.partial(scenario.check, outcome), "check failed", outcome)
        return outcome
    finally:
        _wind_down(loop, run.executors)
        events._set_running_loop(previous)
        loop.close()


def _choices(run: Run, scenario: Scenario, waiting: list[str], fired: set[str]) -> list[tuple[str, Callable | None]]:
    """What may happen next, in a fixed order: steps (oldest first), events,
    cancels, time. Once every op is over, only the calls their callers gave up
    on, which may still arrive late, or never ("end")."""
    steps = [(e, s) for e, s in run.runnable() if waiting or s.future.cancelled()]
    choices: list[tuple[str, Callable | None]] = [
        (s.label + (" (abandoned)" if s.future.cancelled() else ""), functools.partial(_step, run, scenario, e, s))
        for e, s in steps
    ]
    if scenario.faults is not None and run.faults < scenario.max_faults:
        for e, s in steps:
            found = None if s.future.cancelled() else scenario.faults(s)
            for exc in found if isinstance(found, list) else [found] if found is not None else []:
                what = f"{type(exc.error).__name__} after it ran" if isinstance(exc, AnswerLost) else type(exc).__name__
                choices.append((f"fail {s.label}: {what}", functools.partial(_fail, run, e, s, exc)))
    if not waiting:
        return choices + [("end", None)] if choices else []
    choices += [
        (f"event {n}", functools.partial(_fire, run, n, fn, fired))
        for n, fn in scenario.events.items()
        if n not in fired
    ]
    choices += [
        (f"cancel {n}", functools.partial(_cancel, run, n, fired))
        for n in scenario.cancellable
        if n in waiting and f"cancel {n}" not in fired
    ]
    due = run.loop.next_timer()
    if due is not None:
        choices.append((f"time +{due - run.loop.time():g}s", functools.partial(setattr, run.loop, "_now", due)))
    return choices


def _drain(run: Run, scenario: Scenario, outcome: Outcome, limit: int = 1000) -> None:
    """Once every op is over, what they left running in the background (a serving of
    the line, a removal) carries on to its end, its calls run in order, so that the
    check sees where the hub comes to rest; the invariant holds at every step. Calls
    whose callers gave up stay a choice (they may come late, or never); timers do not fire."""
    for _ in range(limit):
        steps = [(e, s) for e, s in run.runnable() if not s.future.cancelled()]
        if not steps:
            return
        executor, step = steps[0]
        _guard(
            functools.partial(_step, run, scenario, executor, step), f"background call {step.label!r} raised", outcome
        )
        _guard(run.loop.settle, "the loop raised", outcome)
        if scenario.invariant:
            _guard(scenario.invariant, "invariant failed", outcome)
    raise ScheduleFailure(f"background work did not end after {limit} calls", outcome.schedule, outcome.labels, outcome)


def _collect(run: Run, outcome: Outcome) -> None:
    outcome.time = run.loop.time()
    for name, task in run.tasks.items():
        if not task.done():
            continue
        if task.cancelled():
            outcome.errors[name] = asyncio.CancelledError()
        elif task.exception() is not None:
            outcome.errors[name] = task.exception()
        else:
            outcome.results[name] = task.result()


def _guard(fn: Callable[[], Any], what: str, outcome: Outcome) -> None:
    try:
        fn()
    except ScheduleFailure:
        raise
    except Exception as exc:
        raise ScheduleFailure(
            f"{what}: {type(exc).__name__}: {exc}", outcome.schedule, outcome.labels, outcome
        ) from exc


def _step(run: Run, scenario: Scenario, executor: StepExecutor, step: Step) -> None:
    """Run the step, unless its dependency is down: then it fails as it would."""
    down = scenario.outage(step) if scenario.outage is not None else None
    if down is None:
        executor.run(step)
    else:
        run.outage_failures += 1
        executor.fail(step, down)


def _fail(run: Run, executor: StepExecutor, step: Step, exc: BaseException) -> None:
    run.faults += 1
    executor.fail(step, exc)


def _fire(run: Run, name: str, fn: Callable, fired: set) -> None:
    fired.add(name)
    result = fn()
    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
        run.tasks[name] = asyncio.ensure_future(result)
        run.tasks[name].set_name(name)


def _cancel(run: Run, name: str, fired: set) -> None:
    fired.add(f"cancel {name}")
    run.tasks[name].cancel()


def _wind_down(loop: _VirtualLoop, executors: list[StepExecutor]) -> None:
    """Cancel what is left so that no coroutine outlives its loop."""
    for _ in range(50):
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if not tasks and not any(e.pending for e in executors):
            return
        for task in tasks:
            task.cancel()
        for executor in executors:
            for step in executor.pending:
                step.future.cancel()
            executor.pending.clear()
        try:
            loop.settle()
            if loop.next_timer() is not None:
                loop._now = loop.next_timer()
        except Exception:  # noqa: BLE001  (the schedule is over; only the loop's cleanup is left)
            pass


def _named_task(counter: Counter, loop, coro, **kwargs) -> asyncio.Task:
    """Tasks named after the op that made them (spawn/1), not by a global counter, so that labels replay."""
    parent = asyncio.current_task(loop)
    base = parent.get_name() if parent else "task"
    counter[base] += 1
    return asyncio.Task(coro, loop=loop, name=f"{base}/{counter[base]}", **kwargs)


def _current_task() -> asyncio.Task | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def _where(task: asyncio.Task) -> str:
    """The chain of coroutine frames a task waits in, outermost first."""
    coro, frames = task.get_coro(), []
    while coro is not None and getattr(coro, "cr_frame", None) is not None:
        code = coro.cr_frame.f_code
        frames.append(f"{code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:{coro.cr_frame.f_lineno})")
        coro = getattr(coro, "cr_await", None)
    return "in " + " > ".join(frames) if frames else "(no frame)"


def _describe(fn: Callable, args: tuple, kwargs: dict) -> str:
    """A call as a short label: functools.partial, dockerspawner's
    ``self._docker("method", ...)`` and Swarm._call's ``lambda: fn(*args, **kwargs)`` are unwrapped."""
    if isinstance(fn, functools.partial):
        return _describe(fn.func, fn.args + args, {**fn.keywords, **kwargs})
    name = getattr(fn, "__name__", type(fn).__name__)
    if name == "_docker" and args and isinstance(args[0], str):
        name, args = args[0], args[1:]
    elif name == "<lambda>" and fn.__closure__:
        try:
            free = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))
        except ValueError:
            free = {}
        if callable(free.get("fn")):
            return _describe(free["fn"], tuple(free.get("args", ())), dict(free.get("kwargs", {})))
    parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _short(value: Any, width: int = 48) -> str:
    text = re.sub(r" at 0x[0-9a-f]+", "", repr(value))  # addresses differ between runs
    return text if len(text) <= width else text[: width - 1] + "…"


def explore(
    scenario: Callable[[Run], Scenario],
    *,
    max_schedules: int = 10_000,
    max_depth: int = 300,
    fail_on_unfinished: bool = True,
) -> Stats:
    """Every schedule, depth-first, in a fixed order (steps in the order they
    were submitted, then events, cancels, time). Raises ScheduleFailure at the
    first failing schedule."""
    stats = Stats()
    prefix: list[int] = []
    expected: list[list[str]] = []  # the choices offered along the prefix, last time
    while stats.schedules < max_schedules:
        offered: list[list[str]] = []

        def choose(depth: int, labels: list[str], prefix=prefix, expected=expected, offered=offered) -> int:
            if depth < len(prefix) and labels != expected[depth]:
                raise Nondeterminism(f"choice {depth}: expected {expected[depth]}, got {labels}")
            offered.append(labels)
            return prefix[depth] if depth < len(prefix) else 0

        outcome = _run(scenario, choose, max_depth, fail_on_unfinished)
        _count(stats, outcome, new_points=len(outcome.schedule) - len(prefix))
        path = outcome.schedule
        while path and path[-1] + 1 >= len(offered[len(path) - 1]):
            path = path[:-1]
        if not path:
            stats.complete = True
            break
        prefix, expected = path[:-1] + [path[-1] + 1], offered[: len(path)]
    return stats


def scaled(n: int) -> int:
    """``n`` times ``GPUSPAWNER_EXPLORE_SCALE`` (1 unless set): CI samples the bounded
    number, a run by hand as many more as it likes (``make explore EXPLORE_SCALE=20``)."""
    scale = int(os.environ.get("GPUSPAWNER_EXPLORE_SCALE") or "1")
    if scale < 1:
        raise ValueError(f"GPUSPAWNER_EXPLORE_SCALE must be a whole number ≥ 1, got {scale}")
    return n * scale


def random_schedules(
    scenario: Callable[[Run], Scenario], *, seed: int, n: int, max_depth: int = 300, fail_on_unfinished: bool = True
) -> Stats:
    """``scaled(n)`` schedules with uniformly random choices (reproducible from ``seed``;
    the first ``n`` are the same at any scale)."""
    rng = random.Random(seed)
    stats = Stats()
    for _ in range(scaled(n)):
        outcome = _run(scenario, lambda _, labels: rng.randrange(len(labels)), max_depth, fail_on_unfinished)
        _count(stats, outcome, new_points=len(outcome.schedule))
    return stats


def replay(
    scenario: Callable[[Run], Scenario], schedule: list[int], *, max_depth: int = 300, fail_on_unfinished: bool = True
) -> Outcome:
    """Run one schedule (then the first choice at each further point);
    raises ScheduleFailure as explore did."""

    def choose(depth: int, labels: list[str]) -> int:
        index = schedule[depth] if depth < len(schedule) else 0
        if index >= len(labels):
            raise Nondeterminism(f"choice {depth}: index {index} but only {len(labels)} choices: {labels}")
        return index

    return _run(scenario, choose, max_depth, fail_on_unfinished)


def _count(stats: Stats, outcome: Outcome, new_points: int) -> None:
    stats.schedules += 1
    stats.choice_points += new_points
    stats.max_depth = max(stats.max_depth, len(outcome.schedule))
    stats.unfinished += bool(outcome.unfinished)
    stats.outcomes[outcome.summary()] += 1
