"""Quotas at the hub (``c.GPUSwarmSpawner.gpu_quotas``, docs/quotas.md): which holdings
are borrowed, what a request must leave free for others' quotas, and the borrowed
servers taken back, with notice, for members who wait within their group's quota.

The rules are in :mod:`gpuspawner.plan.quotas` (pure). Here they meet the hub's
holdings, its waiting line and JupyterHub's groups. :meth:`QuotaKeeper.check`, run
with the idle reclaim, tells the users of the borrowed servers a waiter needs at once,
and stops them through the hub once their quota's notice has passed, with the end
reason ``preempted``. A user whose groups JupyterHub cannot say is counted in none:
their requests draw on no quota and their holdings count as borrowed; while any holder of
a model is so, nothing of that model is taken back ("could not find out" is not "in no
group").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

from prometheus_client import Counter, Gauge

from ..core.quotas import PriorityClass, class_of, unmet
from ..core.reservations import Reservation, ReservationError, conflicts
from ..core.sharing import UNIT, fmt
from ..holdings.holdings import Holding, Holdings, Phase, stop_for
from ..ledger.checks import utc_now
from ..ledger.ledger import LedgerError
from ..plan.quotas import Ask, Borrowed, Mark, Quota, Waiter, draws_on, in_turn, keep, marks, plan_reclaims, used
from ..plan.reservations import Holder, Keep
from .reservations import UNKNOWN, _iso, milli_asked

__all__ = ["PREEMPTED", "QuotaKeeper"]

log = logging.getLogger(__name__)

PREEMPTED = "preempted"  # the end reason of a borrowed server taken back for a quota
STOPS_AT_ONCE = 8
GROUPS_SECONDS = 10.0  # the marks are worked out again at least this often (groups change)

QUOTA_GPUS = Gauge(
    "gpuspawner_quota_gpus",
    "GPUs of each group's quota: held within it, held by its members beyond it (borrowed), left idle, "
    "and asked for within it by members who wait",
    ["group", "model", "state"],
)
TAKEN_BACK = Counter(
    "gpuspawner_quota_takebacks",
    "Borrowed servers stopped to give a group the GPUs of its quota",
    ["group", "model"],
)

GroupsOf = Callable[[str], "frozenset[str] | None"]  # a user's groups now (cached); None: not known
LineRow = tuple[str, str, str, dict]  # (service, user, model, user_options) of a waiter, in line order


def _clock_time(t: datetime) -> str:
    return f"{t.astimezone(timezone.utc):%H:%M} UTC"


def ask_of(request: dict) -> Ask:
    """What a waiting request asks of a host, for a take-back plan: a share of one device,
    or whole devices (a share of more than one GPU, split over devices: as many as it
    spans, rounded up; a bad value: one GPU)."""
    milli = milli_asked(request)
    return Ask(milli=milli) if "gpu_share" in request and milli < UNIT else Ask(count=max(1, -(-milli // UNIT)))


def hosts_of(request: dict) -> frozenset[str] | None:
    """The host a waiting request pins (``gpu_host``), as a set; None: any host."""
    host = request.get("gpu_host")
    return frozenset({host}) if isinstance(host, str) and host else None


@dataclass
class Told:
    """A borrowed holding being taken back: ``holding``, when its user was first told
    (``since``), for whom (``waiter``, which a later plan may change) and when it is
    stopped (``stop_at``, fixed when told: a later plan never moves it sooner)."""

    holding: Holding
    since: datetime
    waiter: Waiter
    stop_at: datetime


class Waiting(NamedTuple):
    """A waiter within its quota, as a plan sees it: the ``model`` it waits for, the
    plan's :class:`~gpuspawner.plan.quotas.Waiter`, its user's ``groups`` and the
    thousandths it asks (``milli``)."""

    model: str
    waiter: Waiter
    groups: frozenset[str]
    milli: int


class QuotaKeeper:
    def __init__(
        self,
        holdings: Holdings,
        quotas: Sequence[Quota] = (),
        classes: Sequence[PriorityClass] = (),
        *,
        groups_of: GroupsOf,
        stop: Callable[[Holding, str], Awaitable[bool]] | None = None,
        held_for: Callable[[Holding], float | None] = lambda h: None,
        waiting: Callable[[], Iterable[LineRow]] = lambda: (),
        waiting_key: Callable[[], object] = lambda: None,
        reserved: Callable[[Collection[str]], dict[str, Keep]] = lambda groups: {},
        reservation_members: Callable[[], Collection[str]] = lambda: (),
        wall: Callable[[], datetime] = utc_now,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.holdings = holdings
        self.quotas = list(quotas)
        self.classes = list(classes)
        self.groups_of = groups_of
        self.stop = stop
        self.held_for = held_for
        self.waiting = waiting
        self.waiting_key = waiting_key  # changes when the line does: its waiters are worked out again
        self.reserved = reserved  # what open reservation windows keep from a user in these groups
        self.reservation_members = reservation_members  # holdings counted toward open windows: never taken back
        self.wall, self.clock = wall, clock
        self._of_model: dict[str, dict[str, Quota]] = {}
        for q in self.quotas:
            self._of_model.setdefault(q.model, {})[q.group] = q
        self._marked: tuple[tuple, list[Holder], dict[str, Mark], dict[tuple[str, str], int]] | None = None
        self._waited: tuple[tuple, list[Waiting], dict[tuple[str, str], int]] | None = None
        self._told: dict[str, Told] = {}  # holding name -> its take-back
        self._promised: dict[str, datetime] = {}  # waiter -> when the first notice for it was given
        self._unknown: set[str] = set()  # holdings whose users' groups could not be read: never taken back

    def models(self) -> set[str]:
        return set(self._of_model)

    def guaranteed(self, model: str) -> int:
        """The GPUs of ``model`` quotas guarantee, rounded up to whole ones."""
        return -(-sum(q.milli for q in self._of_model.get(model, {}).values()) // UNIT)

    # -- who holds what within a quota -------------------------------------------------

    def _groups(self, user: str) -> frozenset[str]:
        return self.groups_of(user) or frozenset()

    def class_of(self, groups: Collection[str]) -> PriorityClass | None:
        """The priority class of a user in ``groups`` (None: no class applies)."""
        return class_of(self.classes, groups)

    def _preemptible(self, groups: Collection[str]) -> bool:
        found = self.class_of(groups)
        return found is None or found.preemptible

    def _holders(self) -> list[Holder]:
        """The holdings of models with quotas, oldest first: the longest held (the ledger's
        start after a restart), then the first this hub made, then by name. Those whose
        users' groups JupyterHub could not say are noted in ``_unknown``."""
        found = []
        self._unknown = set()
        for name, h in self.holdings.all().items():
            record = h.held
            if record.model in self._of_model and record.uuids:
                groups = self.groups_of(record.user)
                if groups is None:
                    self._unknown.add(name)
                held = Holder(name, record.model, sum(record.milli), groups or frozenset())
                found.append((-round(self.held_for(h) or 0.0), h.since, name, held))
        return [held for *_, held in sorted(found, key=lambda f: f[:3])]

    def _marks(self) -> tuple[list[Holder], dict[str, Mark], dict[tuple[str, str], int]]:
        """The holders (oldest first), each one's mark and each quota's use, worked out
        again when a holding changed or GROUPS_SECONDS passed (groups may have changed)."""
        when = (self.holdings.version, int(self.clock() // GROUPS_SECONDS))
        if self._marked is None or self._marked[0] != when:
            holders = self._holders() if self.quotas else []
            found = marks(self.quotas, holders)
            self._marked = (when, holders, found, used(self.quotas, holders, found))
        return self._marked[1], self._marked[2], self._marked[3]

    def marks(self) -> tuple[list[Holder], dict[str, Mark]]:
        """The holders (oldest first) and each one's mark."""
        holders, found, _ = self._marks()
        return holders, found

    def mark_of(self, name: str) -> Mark | None:
        """How ``name``'s holding stands (None: its model has no quota)."""
        return self._marks()[1].get(name)

    def use(self) -> dict[tuple[str, str], int]:
        """(group, model) -> the thousandths its members hold drawing on its quota."""
        return self._marks()[2]

    def _waiters(self) -> tuple[list[Waiting], dict[tuple[str, str], int]]:
        """The waiters within their groups' quotas, in turn (:func:`~gpuspawner.plan.quotas.in_turn`:
        those with a notice running for them first, then the line's order), and what each
        quota's members wait for within it (whether a waiter is within is counted in the
        line's order). Worked out again when the holdings, the line or the promises
        change, and at least every second (a fair-share line's order moves with time)."""
        if not self.quotas:
            return [], {}
        when = (self._marks_key(), self.waiting_key(), int(self.clock()))
        if self._waited is not None and self._waited[0] == when:
            return self._waited[1], self._waited[2]
        use = self.use()
        waiting: dict[tuple[str, str], int] = {}
        found: dict[str, Waiting] = {}
        for service, user, model, request in self.waiting():
            mine = self._of_model.get(model)
            if mine is None:
                continue
            milli, groups = milli_asked(request), self._groups(user)
            so_far = {g: use.get((g, model), 0) + waiting.get((g, model), 0) for g in mine}
            mark = draws_on(mine, so_far, groups, milli)
            if mark.within and mark.group is not None:
                waiting[(mark.group, model)] = waiting.get((mark.group, model), 0) + milli
                w = Waiter(service, mark.group, ask_of(request), hosts_of(request))
                found[service] = Waiting(model, w, groups, milli)
        order = in_turn([x.waiter for x in found.values()], self._promised)
        self._waited = (when, [found[w.key] for w in order], waiting)
        return self._waited[1], self._waited[2]

    def _marks_key(self) -> tuple:
        self._marks()
        assert self._marked is not None
        return self._marked[0]

    def waits_within(self, service: str) -> bool:
        """Whether ``service`` waits in line for a request within its group's quota."""
        return any(x.waiter.key == service for x in self._waiters()[0])

    def _ahead(self, waiters: list[Waiting], service: str | None) -> dict[tuple[str, str], int] | None:
        """What the waiters within their quotas ahead of ``service`` wait for (None: it is not one of them)."""
        at = next((i for i, x in enumerate(waiters) if x.waiter.key == service), None)
        if at is None:
            return None
        ahead: dict[tuple[str, str], int] = {}
        for x in waiters[:at]:
            key = (x.waiter.group, x.model)
            ahead[key] = ahead.get(key, 0) + x.milli
        return ahead

    # -- what a request may take ---------------------------------------------------------

    def keep_free(
        self, groups: Collection[str], asks: dict[str, int] | None = None, service: str | None = None
    ) -> dict[str, Keep]:
        """Per model, what a request of a user in ``groups`` (of the server ``service``, if
        it waits in line) must leave free for others' quotas, and (with ``asks``: model ->
        thousandths asked) its borrowing limit. A waiter within its quota is kept only from
        what those ahead of it within theirs wait for; any other request, from all of it."""
        if not self.quotas:
            return {}
        waiters, waiting = self._waiters()
        ahead = self._ahead(waiters, service)
        return keep(
            self.quotas, self.use(), waiting if ahead is None else ahead, groups, asks, self._preemptible(groups)
        )

    def within(self, groups: Collection[str], model: str | None, milli: int) -> bool:
        """Whether a request of ``milli`` thousandths of ``model`` by a user in ``groups``
        is within their group's quota now (such a request is not held back by the line)."""
        mine = self._of_model.get(model or "")
        if not mine or milli <= 0:
            return False
        use = self.use()
        return draws_on(mine, {g: use.get((g, model), 0) for g in mine}, groups, milli).within  # type: ignore[arg-type]

    def refusal(self, model: str, groups: Collection[str], milli: int) -> str | None:
        """Why a request is not granted, where quotas are the reason (None: they are not)."""
        mine = self._of_model.get(model)
        if not mine:
            return None
        use = self.use()
        so_far = {g: use.get((g, model), 0) for g in mine}
        mark = draws_on(mine, so_far, groups, milli)
        q = mine.get(mark.group) if mark.group is not None else None
        if q is not None and mark.within:
            return (
                f"Your group {q.group} is guaranteed {q.amount} GPUs and holds {fmt(so_far[q.group])}: "
                f"wait in line, and borrowed GPUs are taken back for you within {_minutes(q.notice)}."
            )
        if q is not None and q.borrow is not None and so_far[q.group] + milli > q.milli + q.borrow:
            return (
                f"Your group {q.group} holds {fmt(so_far[q.group])} {model} GPUs of its quota of "
                f"{fmt(q.milli)} and may borrow at most {fmt(q.borrow)} beyond it; please try again "
                "when its members hold fewer."
            )
        idle = [f"{fmt(max(0, o.milli - so_far[g]))} for {g}" for g, o in sorted(mine.items()) if g not in groups]
        return f"The free {model} GPUs are kept for groups' quotas ({', '.join(idle)}); please try again later."

    # -- taking back ---------------------------------------------------------------------

    def must_take_back(self) -> dict[str, tuple[Holding, Waiter]]:
        """The borrowed holdings that the waiters within their quotas need, as things are
        now: name -> (the holding, the waiter it is taken back for). One already told is
        nearer its stop than any other, so a plan keeps it unless a sooner way shows up.

        Never taken back: a holding within its quota, one of a class that may not be, one
        counted toward an open reservation window, one whose user's groups are not known.
        No take-back at all for a model while a holder's groups are not known (who is
        within its quota is then not known either). A holding being removed counts as gone.
        Each waiter leaves what is kept from it (others' quotas not lent, open windows)."""
        waiters, _ = self._waiters()
        if not waiters:
            return {}
        holders, found = self.marks()
        everyone = self.holdings.all()
        unknown_models = {h.model for h in holders if h.key in self._unknown}
        members = set(self.reservation_members())
        out: dict[str, tuple[Holding, Waiter]] = {}
        allocator = self.holdings.allocator
        for model in sorted({x.model for x in waiters} - unknown_models):
            removing = {n for n, h in everyone.items() if h.phase is Phase.REMOVING and h.held.model == model}
            hosts: dict[str, dict[str, dict[str, int]]] = {}
            for uuid, held in allocator.model_devices(model).items():
                gpu = allocator.device(uuid)
                if gpu is not None:
                    hosts.setdefault(gpu.host, {})[uuid] = {k: m for k, m in held.items() if k not in removing}
            borrowed = []
            for h in holders:
                held = everyone.get(h.key)
                if h.model != model or found[h.key].within or held is None or h.key in removing:
                    continue
                cls = self.class_of(h.groups)
                if cls is not None and not cls.preemptible or h.key in self._unknown or h.key in members:
                    continue  # never taken back
                told = self._told.get(h.key)
                ready = (
                    (told.stop_at - self.wall()).total_seconds()
                    if told is not None and told.holding is held
                    else self._notice_of(model).total_seconds()
                )
                cost = h.milli / UNIT * (self.held_for(held) or 0.0) / 3600
                borrowed.append(Borrowed(h.key, cost, max(0.0, ready), cls.rank if cls else 0))
            mine = []
            for x in (x for x in waiters if x.model == model):
                k = self.keep_free(x.groups, {model: x.milli}, x.waiter.key).get(model, Keep())
                kept = k.devices + self.reserved(x.groups).get(model, Keep()).devices
                if kept >= UNKNOWN:
                    continue  # the reservations are not known: nothing is granted, so nothing is stopped for it
                mine.append(x.waiter._replace(kept=kept))
            for name, w in plan_reclaims(mine, hosts, borrowed).items():
                out[name] = (everyone[name], w)
        return out

    async def check(self) -> list[tuple[str, str]]:
        """Tell the users of the borrowed servers that waiters need, and stop those whose
        notice has passed (several at once); the (service, reason) of each stop begun."""
        now = self.wall()
        due = self.must_take_back()
        waiting = {x.waiter.key for x in self._waiters()[0]}
        for key in set(self._promised) - waiting:  # served, or out of line
            del self._promised[key]
        for name in set(self._told) - set(due):
            h = self._told.pop(name).holding
            log.info("%s of %s is no longer taken back for a quota", name, h.user)
        for name, (h, w) in due.items():
            self._promised.setdefault(w.key, now)
            told, notice = self._told.get(name), self._of_model[h.held.model][w.group].notice
            if told is not None and told.holding is h:
                # For whom may change; when it is stopped never comes sooner than its user was told.
                told.waiter, told.stop_at = w, max(told.stop_at, told.since + notice)
                continue
            self._told[name] = Told(h, now, w, now + notice)
            log.info("%s of %s is taken back for %s's quota at %s", name, h.user, w.group, _iso(now + notice))
        self._waited = None  # (the promises may have changed the waiters' turn)
        self._show()
        if self.stop is None:
            return []
        now_due = [(name, h) for name, (h, _) in due.items() if self._told[name].stop_at <= now]
        room = asyncio.Semaphore(STOPS_AT_ONCE)
        began = await asyncio.gather(*(self._stop_one(room, name, h) for name, h in now_due))
        for (name, h), ok in zip(now_due, began):
            if ok:
                TAKEN_BACK.labels(due[name][1].group, h.held.model).inc()
        return [(name, PREEMPTED) for (name, _), ok in zip(now_due, began) if ok]

    def _show(self) -> None:
        """The gauge, from :meth:`status`."""
        for q in self.status():
            for state in ("within", "borrowed", "idle", "waiting"):
                QUOTA_GPUS.labels(q["group"], q["model"], state).set(float(q[state]))

    async def _stop_one(self, room: asyncio.Semaphore, name: str, h: Holding) -> bool:
        async with room:
            if self.holdings.get(name) is not h or h.phase is not Phase.RUNNING or self.stop is None:
                return False  # ended meanwhile, or a spawn under way: stopped at a later check, once running
            # Other stops ran while this one waited its turn: still borrowed, still needed?
            told, mark = self._told.get(name), self.mark_of(name)
            waiting = {x.waiter.key for x in self._waiters()[0]}
            if told is None or mark is None or mark.within or told.waiter.key not in waiting:
                return False
            log.info("Stopping %s of %s: its GPUs are taken back for a quota", name, h.user)
            try:
                return await stop_for(h, PREEMPTED, self.stop)
            except Exception as exc:  # begun, not done: the reconcile ends it
                log.error("Could not stop %s for a quota: %s", name, exc)
                return False

    # -- what users and admins see ---------------------------------------------------------

    def notices_for(self, user: str) -> list[dict]:
        now = self.wall()
        out = []
        for name, told in sorted(self._told.items()):
            h, w = told.holding, told.waiter
            if h.user != user or self.holdings.get(name) is not h:
                continue
            at = max(now, told.stop_at)
            server = f"“{h.held.server}”" if h.held.server else "default"
            out.append(
                {
                    "server": h.held.server,
                    "reason": PREEMPTED,
                    "stop_at": _iso(at),
                    "seconds_left": round((at - now).total_seconds()),
                    "message": (
                        f"Your {server} server will be stopped at {_clock_time(at)}: its {h.held.model} is "
                        f"borrowed, and a member of {w.group} asks for the GPUs of its quota. Save your work."
                    ),
                }
            )
        return out

    def describe(self, name: str) -> str | None:
        """How ``name``'s holding stands, for its user (None: its model has no quota)."""
        mark = self.mark_of(name)
        h = self.holdings.get(name)
        if mark is None or h is None:
            return None
        if mark.within:
            return f"Within {mark.group}'s quota: never taken back for another group's"
        beyond = f" beyond {mark.group}'s quota" if mark.group else ""
        cls = self.class_of(self._groups(h.user))
        if name in self._unknown:
            return f"Borrowed{beyond}: not taken back while your groups cannot be read"
        if cls is not None and not cls.preemptible:
            return f"Borrowed{beyond}, from GPUs no quota keeps idle: never taken back (class {cls.name})"
        return f"Borrowed{beyond}: it may be taken back with {_notice(self._notice_of(h.held.model))}"

    def stop_in(self, name: str) -> tuple[float, str] | None:
        """(seconds until it is taken back, for whose quota) once its user was told; None: not told."""
        told = self._told.get(name)
        if told is None or self.holdings.get(name) is not told.holding:
            return None
        return max(0.0, (told.stop_at - self.wall()).total_seconds()), told.waiter.group

    def for_waiter(self, service: str) -> str | None:
        """What a waiter within its group's quota waits for (None: it is not one)."""
        waiters, _ = self._waiters()
        mine = next((x.waiter for x in waiters if x.waiter.key == service), None)
        if mine is None:
            return None
        at = [
            t.stop_at
            for name, t in self._told.items()
            if t.waiter.key == service and self.holdings.get(name) is t.holding
        ]
        if at:
            return f"Within {mine.group}'s quota: borrowed GPUs are taken back for you at {_clock_time(max(at))}"
        return f"Within {mine.group}'s quota: served as soon as GPUs of the quota are free"

    def _notice_of(self, model: str) -> timedelta:
        """The shortest notice of the model's quotas: the least a borrower of it is told ahead."""
        return min((q.notice for q in self._of_model.get(model, {}).values()), default=timedelta(0))

    def form_notes(self, groups: Collection[str], free: dict[str, int]) -> list[str]:
        """The form's lines on quotas for a user in ``groups`` (``free``: model -> GPUs the
        form offers them): what their group's quota has left, never taken back, and
        what beyond it they would borrow."""
        use = self.use()
        out = []
        for model, mine in sorted(self._of_model.items()):
            left = {g: q.milli - use.get((g, model), 0) for g, q in mine.items() if g in groups}
            group = min(left, key=lambda g: (-left[g], g), default=None)  # as a request draws on it
            within = max(0, left[group]) if group is not None else 0
            if group is not None:
                q = mine[group]
                out.append(
                    f"{group}'s quota: {fmt(within)} of its {fmt(q.milli)} {model} GPUs left for its members, "
                    "never taken back for another group's."
                )
            beyond = free.get(model, 0) - within // UNIT
            cls = self.class_of(groups)
            many = "GPU" if beyond == 1 else "GPUs"
            if beyond > 0 and cls is not None and not cls.preemptible:
                out.append(
                    f"{beyond} {model} {many} free beyond what quotas keep idle: never taken back (class {cls.name})."
                )
            elif beyond > 0:
                out.append(
                    f"{beyond} {model} {many} free to borrow: "
                    f"{'it' if beyond == 1 else 'they'} may be taken back with {_notice(self._notice_of(model))}."
                )
        return out

    async def record(self, h: Holding) -> None:
        """Write in the ledger how ``h``, granted just now, stands against the quotas (a
        ledger that cannot be written is logged: the server starts all the same)."""
        mark = self.mark_of(h.name)
        if mark is None:
            return
        try:
            await self.holdings.ledger_call(lambda db: db.note_quota(h.name, mark.group, not mark.within))
        except LedgerError as exc:
            log.warning("The quota of %s could not be written in the ledger: %s", h.name, exc)

    def notice_at_grant(self, h: Holding) -> str | None:
        """What a server granted just now is told when its GPUs are borrowed."""
        mark = self.mark_of(h.name)
        if mark is None or mark.within or not self._preemptible(self._groups(h.user)):
            return None
        return f"Its {h.held.model} is borrowed: it may be taken back with {_notice(self._notice_of(h.held.model))}"

    def problems(
        self, group_exists: Callable[[str], bool | None], reservations: Iterable[Reservation] = ()
    ) -> list[tuple[str, str]]:
        """(problem, fix) of the quotas as the cluster and JupyterHub are now: quotas of a model
        that add up to more GPUs than its nodes have (or no node has it), groups JupyterHub
        does not have (``group_exists``: None where it cannot say), and ``reservations``
        (made before the quotas were set, or the nodes were fewer) that need more than the
        quotas leave."""
        totals = {m.model: m.total for m in self.holdings.allocator.summary()}
        out = [
            (line, "lower gpu_quotas or add GPUs of the model: until then a guarantee may not be met")
            for line in unmet(self.quotas, {m: n * UNIT for m, n in totals.items()})
        ]
        now, reservations = self.wall(), [r for r in reservations if r.model in self._of_model]
        for r in reservations:
            left = totals.get(r.model, 0) - self.guaranteed(r.model)
            try:
                clash = r.milli > left * UNIT or bool(conflicts(r, reservations, left, now))
            except ReservationError:
                clash = True
            if clash and not r.over(now):
                out.append(
                    (
                        f"the reservation {r.describe()} needs more than the {max(0, left)} {r.model} "
                        "that quotas leave",
                        "lower gpu_quotas or the reservation: while both stand, its members may wait",
                    )
                )
        for group in sorted({q.group for q in self.quotas}):
            try:
                exists = group_exists(group)
            except Exception as exc:  # JupyterHub's database: not known, and not named
                log.warning("Whether the JupyterHub group %s exists could not be read: %s", group, exc)
                exists = None
            if exists is False:
                out.append(
                    (
                        f"gpu_quotas names the group {group!r}, which JupyterHub does not have",
                        "create it (the admin page, or c.JupyterHub.load_groups): until then nobody draws on its quota",
                    )
                )
        return out

    def status(self) -> list[dict]:
        """Per quota: what it guarantees, what its members hold within it and beyond, what
        they wait for within it, what it leaves idle, and the servers taken back for it."""
        holders, found = self.marks()
        _, waiting = self._waiters()
        within: dict[tuple[str, str], int] = {}
        beyond: dict[tuple[str, str], int] = {}
        for h in holders:
            m = found[h.key]
            if m.group is not None:
                side = within if m.within else beyond
                side[(m.group, h.model)] = side.get((m.group, h.model), 0) + h.milli
        out = []
        for q in self.quotas:
            key = (q.group, q.model)
            taking = [
                {"server": name, "user": t.holding.user, "stop_at": _iso(t.stop_at)}
                for name, t in sorted(self._told.items())
                if t.waiter.group == q.group
                and t.holding.held.model == q.model
                and self.holdings.get(name) is t.holding
            ]
            out.append(
                {
                    "group": q.group,
                    "model": q.model,
                    "quota": fmt(q.milli),
                    "borrow_limit": None if q.borrow is None else fmt(q.borrow),
                    "lend_limit": None if q.lend is None else fmt(q.lend),
                    "notice_seconds": round(q.notice.total_seconds()),
                    "within": fmt(within.get(key, 0)),
                    "borrowed": fmt(beyond.get(key, 0)),
                    "idle": fmt(max(0, q.milli - within.get(key, 0) - beyond.get(key, 0))),
                    "waiting": fmt(waiting.get(key, 0)),
                    "taking_back": taking,
                }
            )
        return out


def _minutes(t: timedelta) -> str:
    """E.g. "10 minutes", "1 minute", "0.5 minutes"."""
    minutes = t.total_seconds() / 60
    return f"{minutes:g} minute" + ("" if minutes == 1 else "s")


def _notice(t: timedelta) -> str:
    """E.g. "10 minutes' notice", "1 minute's notice"."""
    words = _minutes(t)
    return words + ("' notice" if words.endswith("s") else "'s notice")
