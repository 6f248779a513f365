"""Waiting in line for a GPU model: the hub's live line, and a spawn's wait in it.

One :class:`WaitLine` per hub (the hub's :class:`~gpuspawner.hub.app.GPUHub` makes it).
Its rows mirror the ledger's (:mod:`gpuspawner.ledger.line`), so the order
survives a hub restart; the order rules are :mod:`gpuspawner.core.line_order`'s.

A waiting spawn registers how to reserve for itself; whenever devices come
back (a holding is released: the hub calls :meth:`WaitLine.poke`), and every few seconds
anyway, the line is served in order (:class:`gpuspawner.plan.backfill.Round`): each
waiter tries to reserve, on success its spawn carries on, and one that is not
served keeps its planned host, so that those behind it are served only on other
hosts (backfill; ``gpu_line_backfill = False``: nobody behind it). A failure that
may pass (the ledger, no free port, the server's old service still going) keeps
every place; the waits' own ``gpu_wait_timeout`` bounds them.

A row is owned by a live wait, or has a deadline, or is gone: a head whose
spawn is not live (a hub restart, before it is resumed) holds its place for
:data:`UNOWNED_SECONDS`, and nobody behind it is served meanwhile; a row still
without a live wait then (its resumed spawn failed before it could wait, in a
hook or the ledger) leaves the line.

While a spawn waits it holds no slot of JupyterHub's ``concurrent_spawn_limit``:
JupyterHub counts every pending spawn against that limit, so the limit the hub
checks is raised by one per waiting spawn (see docs/line.md and
:func:`gpuspawner.hub_port.hold_spawn_slot`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from itertools import count
from typing import NamedTuple

from jupyterhub.spawner import SpawnException

from .. import hub_port, metrics
from ..allocator.records import accepted
from ..allocator.refusals import NOT_NOW, AllocationRefused, Refusal
from ..core.fairshare import FairShare, by_group
from ..core.line_order import Standing, Waiter, by_model, estimate, held_now, kept_text, order_reason, position
from ..core.requests import Request
from ..core.sharing import UNIT
from ..holdings.holdings import Holding, Holdings
from ..ledger.checks import utc_now
from ..ledger.ledger import LedgerError
from ..plan.backfill import Round, Start, StartsCache, devices_needed, planned_start

__all__ = ["WaitLine", "extend_start_timeout", "lasts_of", "refused_out_of_line", "reserve_or_wait"]

log = logging.getLogger(__name__)

RETRY_SECONDS = 10.0  # a waiter's line is served at least this often (devices may come back unannounced)
LOOK_SECONDS = 1.0  # how often a waiting spawn looks at its place in line
UNOWNED_SECONDS = 120.0  # how long a row keeps its place without a live wait (a resumed spawn is live in seconds)
PASSED_SHOWN = 10  # servers granted ahead of a waiter that the queue API shows it
USE_SECONDS = 30.0  # with fair share, the waiters' recent use is read again at most this often
# Refusals that may pass: the head keeps its place and the line is tried again.
PASSING = frozenset({"stale_service", "ledger_unavailable", "no_port"})

# (the hosts kept for those ahead, worked out when it books: None, every host) -> the holding
Avoid = Callable[[], "frozenset[str] | None"]
Reserve = Callable[[Avoid], Awaitable[Holding]]


class Live(NamedTuple):
    """A waiting spawn: how to reserve, its result, what it asks for (None: not known,
    nobody behind it is served) and the seconds within which its server must end
    (its held-time limit; None: no bound)."""

    reserve: Reserve
    result: asyncio.Future
    request: Request | None
    lasts: float | None


NOT_WAITED_FOR = (Refusal.LIMIT_REACHED, Refusal.SHARES_UNENFORCED)  # the user's own servers; an admin's fix


def waits_for(exc: SpawnException) -> bool:
    """Whether a refused reservation is one to wait in line for: none free right
    now (not impossible, not forbidden, not the user's own limit, not a node only
    an admin can mend: a waiter at the head would hold up the model's whole line)."""
    cause = exc.__cause__
    return isinstance(cause, AllocationRefused) and cause.retry and cause.reason not in NOT_WAITED_FOR


class WaitLine:
    def __init__(
        self,
        holdings: Holdings,
        fair: FairShare | None = None,
        *,
        groups_of: Callable[[str], Iterable[str] | None] = lambda user: None,
        members_of: Callable[[str], Iterable[str] | None] = lambda group: None,
        backfill: bool = True,
        ends_in: Callable[[str], float | None] = lambda holding: None,
    ):
        self.holdings = holdings
        self.fair = fair  # None: priority, then arrival
        self.backfill = backfill  # False: nobody is served ahead of a waiter that is not
        self.ends_in = ends_in  # holding name -> seconds until its held-time limit ends it (None: no bound)
        self.groups_of, self.members_of = groups_of, members_of  # JupyterHub's, for fair share by group
        # A waiter the line does not hold back (within its group's quota, docs/quotas.md): tried
        # even behind a head that blocks a strict line.
        self.goes_first: Callable[[str], bool] = lambda service: False
        self._whose: dict[str, str] = {}  # by group: user -> the group its figure is of
        self._used: dict[str, float] = {}  # user -> recent use, as last read (fair share)
        self._used_read = -float("inf")  # when (monotonic)
        self._reads = self._read_applied = 0  # reads begun, and the latest whose answer is kept
        self.rows: list[Waiter] = []  # as in the ledger
        self.loaded = False
        self._live: dict[str, Live] = {}  # the waiting spawns
        self.passed: dict[str, list[dict]] = {}  # waiting service -> servers granted ahead of it (backfill)
        self._plans: dict[str, tuple[float, Round]] = {}  # model -> (when (monotonic), its line's last plan)
        # model -> each waiter's host in the latest plan of its line: a serving's, or one made
        # for a new request (kept), which may have moved it sooner; a plan keeps it where it can.
        self._hosts: dict[str, dict[str, str | None]] = {}
        self._starts = StartsCache(self._start_here, holdings.allocator.version, time.monotonic)
        self._ids = count(1)  # without a ledger
        self._serving: asyncio.Task | None = None
        self._again = False
        self._cancelled: set[str] = set()  # waits cancelled whose server is not stopped yet
        self._unowned: dict[str, float] = {}  # service -> when its row was first seen without a live wait
        self._leaving: set[asyncio.Task] = set()
        self._unrecorded: set[str] = set()  # left the line, but the ledger's row could not be removed yet
        self._models_shown: set[str] = set()  # models whose line length the metrics show
        # waiting spawn -> the estimate of its wait, or when its model's holders started
        self._outlook: dict[str, str | list[datetime]] = {}

    # -- the rows ------------------------------------------------------------------

    async def load(self) -> None:
        """The ledger's rows, at first use (a restarted hub finds its line)."""
        if not self.loaded:
            try:
                rows = await self.holdings.ledger_call(lambda db: db.waiting())
            except LedgerError as exc:  # tried again at the next spawn
                log.warning("%s", exc)
                return
            if not self.loaded:
                self.rows, self.loaded = list(rows or []), True
                self._count()
                self.restart_clocks()  # no row read back has a live wait yet

    def standing(self) -> Standing | None:
        """What orders the line now (None: priority, then arrival)."""
        return None if self.fair is None else Standing(self.fair, self._used, utc_now(), self._whose)

    def lines(self) -> dict[str, list[Waiter]]:
        return by_model(self.rows, self.standing())

    def place(self, service: str) -> tuple[str, int] | None:
        return position(self.rows, service, self.standing())

    def reason(self, service: str) -> str:
        """Why ``service`` stands where it does in line ("" when not in line)."""
        row = next((w for w in self.rows if w.service == service), None)
        return "" if row is None else order_reason(row, self.standing())

    async def read_use(self, *, now: bool = False) -> None:
        """With fair share, the waiters' recent use from the ledger (at most every
        :data:`USE_SECONDS`, or ``now``). When the ledger cannot answer, the figures
        last read stay (a user never read counts none) and it is asked again next time."""
        fair = self.fair
        if fair is None or not self.rows or not now and time.monotonic() - self._used_read < USE_SECONDS:
            return
        users = sorted({w.user for w in self.rows})
        groups: dict[str, list[str]] = {}
        members: dict[str, list[str]] = {}
        self._reads += 1
        read = self._reads
        try:
            if fair.by_group:  # JupyterHub's groups now, read before the ledger's await
                groups = {u: list(self.groups_of(u) or ()) for u in users}
                members = {g: list(self.members_of(g) or ()) for g in {g for gs in groups.values() for g in gs}}
            everyone = sorted(set(users).union(*members.values()))
            used = await self.holdings.ledger_call(lambda db: db.recent_use(everyone, fair))
        except LedgerError as exc:
            log.warning("The line's order keeps the recent use last read: %s", exc)
            return
        except Exception:  # never stop serving the line
            log.exception("The line's order keeps the recent use last read")
            return
        if read < self._read_applied:
            return  # a later read (of more users, maybe) already answered
        self._read_applied = read
        used = dict(used or {})
        whose: dict[str, str] = {}
        if fair.by_group:
            used, whose = by_group(users, groups, members, used)
        self._used, self._whose, self._used_read = used, whose, time.monotonic()

    def outlook(self, service: str) -> str:
        """What a waiting spawn is told of its wait: the estimate, or before any server of
        its model has ended, how many hold it and for how long (as of now)."""
        known = self._outlook.get(service, "")
        if isinstance(known, str):
            return known
        now = utc_now()
        return held_now([(now - started).total_seconds() for started in known])

    def waiting_for(self, model: str) -> int:
        return sum(1 for w in self.rows if w.model == model)

    async def join(self, service: str, user: str, server: str, model: str, priority: int, request: dict) -> Waiter:
        """Into ``model``'s line (a service in it keeps its place). Raises LedgerError."""
        self._unrecorded.discard(service)  # its row, if still in the ledger, is its place again
        row = await self.holdings.ledger_call(lambda db: db.enqueue(service, user, server, model, priority, request))
        if row is None:  # no ledger
            row = Waiter(next(self._ids), service, user, server, model, priority, utc_now(), dict(request))
        if all(w.service != service for w in self.rows):
            self.rows.append(row)
            self._count()
            if row.user not in self._used:
                await self.read_use(now=True)
        return row

    async def leave(self, service: str) -> None:
        """Out of line at once; the ledger's row goes too, now or, when the ledger
        cannot be written, at the next serving of the line (a row left there would
        have the next hub resume a spawn its user was told had ended)."""
        self._drop(service)
        try:
            await self.holdings.ledger_call(lambda db: db.dequeue(service))
        except LedgerError as exc:
            self._unrecorded.add(service)
            log.warning("%s left the line; its row is removed from the ledger once it answers: %s", service, exc)
        else:
            self._unrecorded.discard(service)

    async def record_leaves(self) -> None:
        """The ledger rows of those who left while it could not be written (the
        line's serving and the hub's reconcile loop call it)."""
        for service in sorted(self._unrecorded):
            if self.place(service) is None:
                await self.leave(service)

    async def remove(self, user: str, server: str, error: Exception) -> Waiter | None:
        """An admin takes a request out of the line (and the ledger): a live wait
        ends with ``error``; None when the user's server is not in line. Logged by
        the caller (the API's handler, which names the admin)."""
        await self.load()
        row = next((w for w in self.rows if (w.user, w.server) == (user, server)), None)
        if row is None:
            return None
        live = self._live_wait(row.service)
        if live is not None:
            live[1].set_exception(error)
        await self.leave(row.service)
        return row

    def leave_soon(self, service: str) -> None:
        """:meth:`leave`, from a callback."""
        task = asyncio.get_running_loop().create_task(self.leave(service))
        self._leaving.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._leaving.discard)

    def passed_by(self, waiters: Iterable[str], holding: Holding) -> None:
        """``holding`` was granted ahead of ``waiters`` (backfill, on a host none of
        them needs): each of them is shown it, the most recent :data:`PASSED_SHOWN`."""
        for service in waiters:
            shown = self.passed.setdefault(service, [])
            shown.append({"user": holding.held.user, "server": holding.held.server, "host": holding.held.host})
            del shown[:-PASSED_SHOWN]

    def _drop(self, service: str) -> None:
        self._unowned.pop(service, None)
        self.passed.pop(service, None)
        before = len(self.rows)
        gone = {w.model for w in self.rows if w.service == service}
        self.rows = [w for w in self.rows if w.service != service]
        for model in gone:
            self._hosts.get(model, {}).pop(service, None)
        for model in gone - {w.model for w in self.rows}:
            self._plans.pop(model, None)  # an empty line has no plan
            self._hosts.pop(model, None)
        if len(self.rows) != before:
            self._count()
            self.poke()  # the next one may be served now

    def _count(self) -> None:
        metrics.line_lengths({model: len(line) for model, line in self.lines().items()}, self._models_shown)

    # -- serving ------------------------------------------------------------------

    def poke(self) -> None:
        """Serve the line soon (devices came back, or the line changed)."""
        self._again = True
        if self._serving is None or self._serving.done():
            try:
                self._serving = asyncio.get_running_loop().create_task(self._serve_all())
            except RuntimeError:  # no loop (a test without one): nothing waits
                self._serving = None

    async def _serve_all(self) -> None:
        if self._unrecorded:
            await self.record_leaves()
        await self.read_use()
        while self._again:
            self._again = False
            for line in self.lines().values():
                try:
                    await self._serve(line)
                except Exception:  # never stop serving the others
                    log.exception("Serving the line for %s failed", line[0].model)

    def _live_wait(self, service: str) -> Live | None:
        live = self._live.get(service)
        if live is None or live[1].done():
            return None
        self._unowned.pop(service, None)
        return live

    async def _expired(self, w: Waiter) -> bool:
        """Whether ``w``'s row, without a live wait for :data:`UNOWNED_SECONDS`, left the line now."""
        now = time.monotonic()
        if now - self._unowned.setdefault(w.service, now) < UNOWNED_SECONDS:
            return False
        log.warning(
            "%s had no live spawn for %d s at the head of the line for %s (its resumed spawn failed "
            "before it could wait): out of line",
            w.service,
            UNOWNED_SECONDS,
            w.model,
        )
        self._unowned.pop(w.service, None)
        await self.leave(w.service)
        return True

    async def clear_unowned(self, model: str) -> None:
        """Heads of ``model``'s line past their deadline without a live wait leave it
        (before a request that does not wait is told how many wait)."""
        for w in self.lines().get(model, []):
            if self._live_wait(w.service) is not None or not await self._expired(w):
                return

    def unowned(self, service: str) -> bool:
        """In line without a live wait."""
        return self.place(service) is not None and self._live_wait(service) is None

    def restart_clocks(self) -> None:
        """Every row's deadline counts from now (the line was read, or its spawns resumed)."""
        now = time.monotonic()
        self._unowned = {w.service: now for w in self.rows if w.service not in self._live}

    def _round(self, model: str) -> tuple[float, Round]:
        """(when it is made (monotonic), a new plan of a serving of ``model``'s line): its
        planned starts are in seconds from when it was made, as the bookings are when
        asked; a waiter keeps its host in the latest plan of the line unless another starts it sooner."""
        at, allocator = time.monotonic(), self.holdings.allocator
        before = dict(self._hosts.get(model, {}))  # (a copy: plans made meanwhile add to it)
        return at, Round(allocator.planner(), self.backfill, self._starts.starts(at), before, allocator.could_take)

    def _remember(self, model: str, plan: Round) -> None:
        """The hosts ``plan`` gives the waiters of ``model``'s line, for the next plan (a
        serving cut short planned only some of them: the others keep theirs)."""
        waiting = {w.service for w in self.rows if w.model == model}  # (not those who left meanwhile)
        if waiting:
            known = self._hosts.setdefault(model, {})
            known.update((who, host) for who, host in plan.planned.items() if who in waiting)

    def _start_here(self, request: Request, host: str) -> Start | None:
        """When ``request`` would start on ``host`` as its holders reach their limits (seconds from now)."""
        allocator = self.holdings.allocator
        devices = allocator.host_devices(host, accepted(request) or None)
        return planned_start(request, devices, self.ends_in, allocator.host_room(host))

    async def _serve(self, line: list[Waiter]) -> None:
        """Reserve for each in ``line``, in order, on the hosts not kept for those ahead
        (worked out again when a reservation books, if a holding changed meanwhile)."""
        model = line[0].model
        at, plan = self._round(model)
        ahead: list[tuple[str, Request | None]] = []  # those not served, in order
        members_only = False  # strict: a reservation keeps the GPUs the head waits for; its members may be behind
        for w in line:
            if plan.blocked and not self.goes_first(w.service):
                continue  # strict, or a row ahead without a live wait keeps the line
            live = self._live_wait(w.service)
            if live is None:
                if self.place(w.service) is not None and not await self._expired(w):
                    plan.wait(w.service, None)  # not live yet (a restarted hub resumes it): its place holds
                    ahead.append((w.service, None))
                continue
            reserve, result, request, lasts = live
            version = self.holdings.version

            def avoid(
                lasts: float | None = lasts, version: int = version, members_only: bool = members_only
            ) -> frozenset[str] | None:
                nonlocal plan, at
                if members_only:
                    return None
                if self.holdings.version != version:  # a holding changed while it got ready to book
                    at, plan = self._replan(model, ahead)
                # The plan's starts count from when it was made; this request's end from now.
                return plan.avoid(None if lasts is None else lasts + time.monotonic() - at)

            try:
                holding = await reserve(avoid)
            except SpawnException as exc:
                if waits_for(exc):
                    if members_only:
                        continue
                    if not self.backfill and getattr(exc.__cause__, "reason", None) is Refusal.RESERVED:
                        members_only = True  # (strict: nobody else behind it is served)
                        continue
                    plan.wait(w.service, request)  # not yet: the host it would fit first is kept for it
                    ahead.append((w.service, request))
                    continue
                if exc.reason in PASSING:
                    log.info("%s keeps its place in line for %s: %s", w.service, w.model, exc.log_message or exc)
                    break
                if not result.done():
                    result.set_exception(exc)
                self._drop(w.service)
                continue
            if result.done():  # the wait ended (cancelled) while reserving: give them back
                if self.holdings.get(w.service) is holding:
                    await self.holdings.remove(w.service)
                break
            self._drop(w.service)
            result.set_result(holding)
            self.passed_by(plan.planned, holding)
        if any(w.model == model for w in self.rows):  # (not a line that emptied meanwhile)
            self._plans[model] = (at, plan)
        self._remember(model, plan)

    def _replan(self, model: str, ahead: Iterable[tuple[str, Request | None]]) -> tuple[float, Round]:
        """A new plan of the waiters ``ahead`` (in order) in ``model``'s line, from the bookings as they are now."""
        at, plan = self._round(model)
        for service, request in ahead:
            if plan.blocked:
                break
            plan.wait(service, request)
        self._remember(model, plan)
        return at, plan

    def kept(self, model: str, lasts: float | None = None) -> frozenset[str] | None:
        """The hosts a new request for ``model`` (that must end within ``lasts`` s;
        None: no bound) may not be placed on, as the line's plan is now (every
        waiter's planned host); None: it may not be placed at all (strict, or a row
        without a live wait keeps the line). Nothing is awaited."""
        ahead = [
            (w.service, live.request if (live := self._live_wait(w.service)) else None)
            for w in self.lines().get(model, [])
        ]
        _, plan = self._replan(model, ahead)
        return plan.avoid(lasts)

    def kept_by_any(self, lasts: float | None = None) -> frozenset[str]:
        """The hosts a server without GPUs (that must end within ``lasts`` s) may not be
        placed on: those the plans of every line keep, as they are now (its CPU and
        memory would delay a planned start there). A line in strict order plans no
        host, and keeps none from it. Nothing is awaited."""
        kept: set[str] = set()
        for model in self.lines():
            kept |= self.kept(model, lasts) or frozenset()
        return frozenset(kept)

    def planned_host(self, service: str) -> str | None:
        """The host kept for ``service`` at its line's last serving (None: none, or behind others)."""
        plan = self._plan_of(service)
        return None if plan is None else plan[1].planned.get(service)

    def _plan_of(self, service: str) -> tuple[float, Round] | None:
        row = next((w for w in self.rows if w.service == service), None)
        return None if row is None else self._plans.get(row.model)

    def went_ahead(self, model: str, holding: Holding) -> Holding:
        """A new request for ``model`` was granted while others wait for it (backfill): shown to them."""
        self.passed_by([w.service for w in self.lines().get(model, [])], holding)
        return holding

    def planned_at(self, service: str) -> datetime | None:
        """When ``service`` is planned to start on the host kept for it, where the
        holders it waits for have time limits (None: not known)."""
        known = self._plan_of(service)
        if known is None:
            return None
        at, plan = known
        start = plan.start_of(service)  # worked out as the bookings are when first asked
        if start is None or start[1] is None:
            return None
        return utc_now() + timedelta(seconds=max(0.0, at + start[0] - time.monotonic()))

    def plan_text(self, service: str) -> str:
        """What a waiter is told of its planned start ("" where it is not known): the
        host kept for it and about when a server there reaches its time limit."""
        when, host = self.planned_at(service), self.planned_host(service)
        if when is None or host is None:
            return ""
        return f"Planned: about {when:%H:%M} UTC on {host}, when a server there reaches its time limit"

    def why(self, service: str) -> str:
        """What ``service`` waits for, as its line's last plan has it ("" before one, or
        in strict order): the host kept for it with what is free there now and when it
        starts, or that every host that could take it is kept for those ahead."""
        known = self._plan_of(service)
        if known is None or service not in known[1].planned:
            return ""
        plan, host = known[1], known[1].planned[service]
        request = plan.request_of(service)
        if host is None or request is None:
            return kept_text(None, 0, 0, "", service in plan.kept_out)
        devices = self.holdings.allocator.host_devices(host, accepted(request) or None)
        milli = request.milli
        if milli is not None and milli < UNIT:
            needs, free = 0, sum(1 for held in devices.values() if UNIT - sum(held.values()) >= milli)
        else:
            needs = devices_needed(request, devices)
            free = min(needs, sum(1 for held in devices.values() if not held))
        when = self.planned_at(service)
        start = f"about {when:%H:%M} UTC, when a server there reaches its time limit" if when else ""
        return kept_text(host, needs, free, start, False)

    # -- one spawn's wait ------------------------------------------------------------

    async def wait(
        self,
        service: str,
        reserve: Reserve,
        timeout: float,
        report: Callable[[str], None],
        request: Request | None = None,
        lasts: float | None = None,
    ) -> Holding:
        """Wait (at most ``timeout`` s) until the line reserves for ``service``
        (``request``: what it asks for, to plan its host; None: nobody behind it is
        served; ``lasts``: within how many seconds its server must end, None: no
        bound); ``report`` gets each new place in line. Cancelling it leaves the line at once."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future = loop.create_future()
        self._live[service] = Live(reserve, result, request, lasts)
        deadline, poked = loop.time() + timeout, 0.0
        last: tuple | None = None  # (place, plan, why) last reported
        cancelled = False
        try:
            while not result.done():
                place = self.place(service)
                if place is None:
                    break
                plan = self.plan_text(service)
                why = "" if plan else self.why(service)  # (a planned start says it all)
                if (place, plan, why) != last:
                    if place != (last or (None,))[0]:
                        self._outlook[service] = await self._guess(*place)
                    last = (place, plan, why)
                    order = f"Fair share orders this line: {self.reason(service)}" if self.fair else ""
                    report(
                        f"You are number {place[1]} in line for {place[0]}"
                        + _sentence(plan or why)
                        + _sentence("" if plan else self.outlook(service))
                        + _sentence(order)
                    )
                if loop.time() - poked >= RETRY_SECONDS:
                    poked = loop.time()
                    self.poke()
                left = deadline - loop.time()
                if left <= 0:
                    break
                await asyncio.wait({result}, timeout=min(LOOK_SECONDS, left))
            if not result.done():
                raise TimeoutError
            return result.result()
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            self._live.pop(service, None)
            self._outlook.pop(service, None)
            if not result.done():
                result.cancel()  # a reservation under way is given back (see _serve)
            if cancelled:
                self.cancel(service)
                if result.done() and not result.cancelled() and result.exception() is None:
                    # Served as it was cancelled: what the line reserved goes back.
                    if self.holdings.get(service) is result.result():
                        await asyncio.shield(self.holdings.remove(service))
            else:
                await asyncio.shield(self.leave(service))  # served or not, its row goes

    def cancel(self, service: str) -> None:
        """A cancelled wait: out of line at once; its row goes when its server
        is stopped (:meth:`stopped`), as JupyterHub stops a spawn it cancels.
        A hub that shuts down cancels every task too, and stops nothing
        (``cleanup_servers = False``): its rows stay for the next hub."""
        self._drop(service)
        self._cancelled.add(service)

    async def stopped(self, service: str) -> None:
        """The server was stopped: a wait of it that was cancelled leaves the ledger's line too."""
        if service in self._cancelled:
            self._cancelled.discard(service)
            await self.leave(service)

    async def _guess(self, model: str, place: int) -> str | list[datetime]:
        """The estimate of the wait, from how long servers of ``model`` ran; before
        any has ended, when the servers that hold the model now started."""
        try:
            runs = await self.holdings.ledger_call(lambda db: db.run_seconds(model)) or []
            guess = estimate(runs, place, sum(m.total for m in self.holdings.allocator.summary() if m.model == model))
            if guess:
                return guess
            records = await self.holdings.ledger_call(lambda db: db.open_allocations()) or []
        except LedgerError:
            return ""
        return [r.started_at for r in records if r.model == model]


def _sentence(text: str) -> str:
    return f". {text}" if text else ""


def extend_start_timeout(spawner) -> None:
    """JupyterHub's ``start_timeout`` for this spawn: the admin's, plus
    ``gpu_wait_timeout`` when it may wait in line (read before each spawn)."""
    base = getattr(spawner, "_start_timeout_base", None)
    if base is None:
        base = spawner._start_timeout_base = spawner.start_timeout
    options = spawner.user_options or {}
    spawner.start_timeout = base + (spawner.gpu_wait_timeout if options.get("gpu_wait") is True else 0)


def busy_refusal(model: str, waiting: int, make_error) -> SpawnException:
    people = "1 request is" if waiting == 1 else f"{waiting} requests are"
    return make_error(
        f"No {model} is free for you now: {people} waiting in line for it. "
        "Tick “If none is free, wait in line” (gpu_wait) to join the line.",
        reason="gpu_unavailable",
        status_code=NOT_NOW,
    )


@asynccontextmanager
async def refused_out_of_line(line: WaitLine, service: str) -> AsyncIterator[None]:
    """A spawn's checks before the line: a spawn resumed after a hub restart
    that they refuse (its user's rules changed, a stale service) leaves the
    place it had, so that nobody waits behind a spawn that has failed."""
    try:
        yield
    except Exception:
        if line.place(service) is not None:
            await line.leave(service)
        raise


async def reserve_or_wait(
    spawner,
    line: WaitLine,
    model: str | None,
    wait: bool,
    reserve: Reserve,
    spawn_error,
    member: bool = False,
    request: Request | None = None,
) -> Holding:
    """Reserve now, or (with ``wait``) wait in ``model``'s line while none is
    free. While others wait for ``model``, a request is placed only on hosts the
    line's plan keeps for none of them (:meth:`WaitLine.kept`): it never delays
    those ahead. A ``member`` of a reservation whose open window keeps the model
    is not held back by the line (the GPUs kept are its to take first).
    ``request``: what it asks for (its host is planned while it waits);
    ``spawn_error`` makes the SpawnExceptions users see."""
    if wait:  # a hub loads its line at start (line_resume): others need not wait for the ledger here
        await line.load()
    name = spawner.service_name
    in_line = line.place(name) is not None
    lasts = lasts_of(spawner)

    def ahead() -> frozenset[str] | None:
        """The hosts kept for those in ``model``'s line, as they are when it books."""
        return line.kept(model, lasts) if model is not None and line.waiting_for(model) else frozenset()

    if model is None or not in_line and (member or not line.waiting_for(model)):
        try:
            return await reserve(ahead)
        except SpawnException as exc:
            if not (wait and model and waits_for(exc)):
                raise
    elif not wait:
        await line.clear_unowned(model)
        if not line.waiting_for(model):
            return await reserve(ahead)
        if in_line or line.kept(model, lasts) is None:
            raise busy_refusal(model, line.waiting_for(model), spawn_error)
        try:
            return line.went_ahead(model, await reserve(ahead))
        except SpawnException as exc:
            if waits_for(exc):
                raise busy_refusal(model, line.waiting_for(model), spawn_error) from exc
            raise
    elif not in_line and line.kept(model, lasts) is not None:
        try:
            return line.went_ahead(model, await reserve(ahead))
        except SpawnException as exc:
            if not waits_for(exc):
                raise
    assert model is not None
    joining = asyncio.ensure_future(
        line.join(name, spawner.user.name, spawner.name, model, spawner._line_priority(), spawner.user_options)
    )
    try:
        await asyncio.shield(joining)
    except asyncio.CancelledError:  # cancelled as its row was written: out of line
        await asyncio.wait([joining])
        line.cancel(name)
        raise
    except (LedgerError, ValueError) as exc:
        spawner.log.error("%s could not wait in line: %s", name, exc)
        raise spawn_error(
            "Your request cannot wait in line right now (the hub's GPU ledger cannot record it); "
            "please try again in a minute.",
            reason="ledger_unavailable",
            log_message=str(exc),
            status_code=503,
        ) from exc
    return await _wait(spawner, line, reserve, spawn_error, request, lasts)


def lasts_of(spawner) -> float | None:
    """Within how many seconds a server of ``spawner`` is sure to have given its GPUs
    back once granted: its held-time limit, plus its start (``start_timeout``) and one
    reclaim interval (the limit is checked that often); None: no limit."""
    held = spawner.reclaim_limits().max_held
    if held is None:
        return None
    return held + getattr(spawner, "_start_timeout_base", spawner.start_timeout) + spawner.gpu_reclaim_interval


async def _wait(
    spawner, line: WaitLine, reserve: Reserve, spawn_error, request: Request | None, lasts: float | None
) -> Holding:
    settings = hub_port.spawn_limit_settings()
    hub_port.hold_spawn_slot(settings, +1)
    since = time.monotonic()
    try:
        holding = await line.wait(
            spawner.service_name, reserve, spawner.gpu_wait_timeout, spawner._report, request, lasts
        )
    except TimeoutError:
        hours = spawner.gpu_wait_timeout / 3600
        raise spawn_error(
            f"No GPU became free for you within {hours:g} h of waiting in line (gpu_wait_timeout); please try again later.",
            reason="gpu_wait_timeout",
            status_code=NOT_NOW,
        ) from None
    finally:
        hub_port.hold_spawn_slot(settings, -1)
    metrics.WAIT_SECONDS.labels(holding.held.model).observe(time.monotonic() - since)
    return holding
