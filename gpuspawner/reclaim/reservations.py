"""Reservations at the hub: the list from the ledger, what each open window
keeps free for its members, and the servers of others stopped at its start.

The rules are in :mod:`gpuspawner.plan.reservations` (pure). Here they meet the hub's
holdings and JupyterHub's groups: a holder is a member of a reservation when
its user is in the reservation's group now. :meth:`ReservationKeeper.check`,
run with the idle reclaim, tells the servers of others that must make room
(from :data:`NOTICE_BEFORE` ahead of the window's start; a server its held-time
limit ends before then is left alone), and stops them at the start, newest
first, through the hub with the end reason ``reservation``.

"Could not find out" is not "no reservation": while the ledger has never
answered, GPU requests are refused with a retry (the ledger is needed to book
them anyway); once read, the last list read is kept while the ledger is down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from datetime import datetime, timedelta, timezone

from prometheus_client import Gauge

from ..core.reservations import RESERVATION, WEEK, Reservation, ReservationError, conflicts
from ..core.sharing import UNIT, to_milli
from ..holdings.holdings import Holding, Holdings, Phase, stop_for
from ..ledger.checks import utc_now
from ..ledger.ledger import LedgerError
from ..plan.reservations import Candidate, Holder, Keep, Need, count_toward, keep_free, make_room, members_hold, needs

__all__ = ["NOTICE_BEFORE", "ReservationKeeper", "milli_asked"]

log = logging.getLogger(__name__)

NOTICE_BEFORE = timedelta(minutes=15)  # servers that must make room are told this long ahead
LEND_NOTICE = timedelta(minutes=1)  # a lent GPU a member now waits for is given back after this
REFRESH_SECONDS = 30.0  # the list is read from the ledger at most this often (and after each change)
GROUPS_SECONDS = 10.0  # a user's JupyterHub groups are asked again after this
STOPS_AT_ONCE = 8  # servers stopped together at a window's start
UNKNOWN = 10**9  # devices kept free of a model while the reservations are not known: all

RESERVED = Gauge(
    "gpuspawner_reserved_gpus",
    "GPUs of open reservation windows: held by the reservation's members, lent to others, or unused",
    ["model", "state"],
)

GroupsOf = Callable[[str], "Iterable[str] | None"]  # a user's groups now; None: not known
Waiting = Callable[[], "Iterable[tuple[str, str, int]]"]  # (user, model, thousandths asked) of each waiter


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def milli_asked(request: dict) -> int:
    """What a waiting request asks for, in thousandths of a GPU ("all" or a bad value: one GPU)."""
    if "gpu_share" in request:
        try:
            milli = to_milli(request["gpu_share"])
        except ValueError:
            return UNIT
        return milli if milli > 0 else UNIT
    count = request.get("gpu_count", 1)
    return count * UNIT if isinstance(count, int) and not isinstance(count, bool) and 0 < count <= 10_000 else UNIT


class ReservationKeeper:
    def __init__(
        self,
        holdings: Holdings,
        *,
        groups_of: GroupsOf,
        stop: Callable[[Holding, str], Awaitable[bool]] | None = None,
        ends_in: Callable[[Holding], float | None] = lambda h: None,
        held_for: Callable[[Holding], float | None] = lambda h: None,
        waiting: Waiting = lambda: (),
        wall: Callable[[], datetime] = utc_now,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.holdings = holdings
        self.groups_of = groups_of
        self.stop = stop
        self.ends_in = ends_in  # seconds until the holding's server must end anyway (its held-time limit)
        self.held_for = held_for  # seconds it has held its GPUs (from the ledger's start after a restart)
        self.waiting = waiting
        self.wall, self.clock = wall, clock
        self.reservations: list[Reservation] = []
        self.known = False  # the ledger has answered once
        self._read_at = -float("inf")
        self._reads = self._read_applied = 0  # reads begun, and the latest whose answer is kept
        self._groups: dict[str, tuple[float, frozenset[str] | None]] = {}  # user -> (when asked, groups)
        # (the holdings' version and the groups' age, {reservation ids looked at: their members' GPUs})
        self._held: tuple[tuple, dict[tuple, dict[int, float]]] | None = None
        self._holders: dict[str, tuple[Holding, Holder]] = {}  # holding name -> it, as last counted
        self._told: dict[str, tuple[Holding, datetime]] = {}  # holding name -> when it was first told to make room
        self._shown: set[tuple[str, str]] = set()  # the gauge's label pairs
        self._change = asyncio.Lock()  # a new reservation is checked against the list it is added to
        # A holding no window's start may stop: one within its group's quota (docs/quotas.md).
        self.protected: Callable[[str], bool] = lambda name: False

    # -- the list ------------------------------------------------------------------

    async def refresh(self, force: bool = False) -> None:
        """Read the list from the ledger (at most every REFRESH_SECONDS unless
        ``force``). On a LedgerError the last list read stays; a read that answers
        after a later one is not kept."""
        if not force and self.clock() - self._read_at < REFRESH_SECONDS:
            return
        self._reads += 1
        read = self._reads
        try:
            rows = await self.holdings.ledger_call(lambda db: db.reservations())
        except LedgerError as exc:
            log.warning("Reservations could not be read from the ledger: %s", exc)
            return
        if read < self._read_applied:
            return
        self._read_applied = read
        self.reservations, self.known, self._read_at = list(rows or []), True, self.clock()

    async def add(self, r: Reservation, capacity: int, guaranteed: int = 0) -> Reservation:
        """Store ``r`` unless it conflicts (ReservationError, naming what it conflicts
        with) on the ``capacity`` GPUs of its model less the ``guaranteed`` by quotas
        (a window may not take what a quota promises at any time). Raises LedgerError."""
        async with self._change:
            await self.refresh(force=True)
            if not self.known:
                raise LedgerError("the reservations could not be read from the ledger")
            left = capacity - guaranteed
            if guaranteed and r.milli > left * UNIT:
                raise ReservationError(
                    f"the cluster has {capacity} {r.model}, of which quotas guarantee {guaranteed} at any time: "
                    f"{max(0, left)} may be reserved, fewer than the {r.amount} asked for"
                )
            clash = conflicts(r, self.reservations, left, self.wall())
            if clash:
                names = "; ".join(c.describe() for c in clash)
                beyond = f" beyond the {guaranteed} that quotas guarantee" if guaranteed else ""
                raise ReservationError(
                    f"{r.amount} for {r.label} would need more than the {left} there are{beyond} "
                    f"while these are reserved too: {names}"
                )
            made = await self.holdings.ledger_call(lambda db: db.add_reservation(r))
            await self.refresh(force=True)
            return made if made is not None else r

    async def remove(self, reservation_id: int) -> Reservation | None:
        async with self._change:
            gone = await self.holdings.ledger_call(lambda db: db.remove_reservation(reservation_id))
            await self.refresh(force=True)
            return gone

    # -- who is a member -----------------------------------------------------------------

    def _groups_of(self, user: str) -> frozenset[str] | None:
        """``user``'s JupyterHub groups, asked at most every GROUPS_SECONDS; None: not known."""
        now = self.clock()
        known = self._groups.get(user)
        if known is None or now - known[0] >= GROUPS_SECONDS:
            try:
                found = self.groups_of(user)
            except Exception as exc:  # JupyterHub's database: not known, asked again later
                log.warning("The JupyterHub groups of %s could not be read: %s", user, exc)
                found = None
            known = self._groups[user] = (now, None if found is None else frozenset(found))
        return known[1]

    def groups(self, user: str) -> frozenset[str] | None:
        """``user``'s JupyterHub groups, asked at most every GROUPS_SECONDS; None: not known."""
        return self._groups_of(user)

    def member_of(self, groups: Iterable[str]) -> set[int]:
        mine = set(groups)
        return {r.id for r in self.reservations if r.group in mine and r.id is not None}

    def _near(self, now: datetime, ahead: timedelta) -> list[Reservation]:
        """The reservations whose window is open or opens within ``ahead``."""
        out = []
        for r in self.reservations:
            w = r.next_window(now)
            if w is not None and w.start <= now + ahead:
                out.append(r)
        return out

    def _members_hold(self, near: list[Reservation]) -> dict[int, float]:
        """Per reservation id, the GPUs of its model its members hold now (shares as
        fractions; a server being removed too, until its devices are given back), each
        holding counted toward one of ``near`` at most (the one that lacks the most:
        :func:`~gpuspawner.plan.reservations.count_toward`); worked out
        again only when a holding or the list changed, or the groups may have."""
        when = (self.holdings.version, int(self.clock() // GROUPS_SECONDS))
        ids = tuple(r.id for r in near)
        if self._held is None or self._held[0] != when:
            self._held = (when, {})
        known = self._held[1].get(ids)
        if known is not None:
            return known
        holders = self._member_holders(near)
        held = self._held[1][ids] = members_hold(near, holders, self.wall())
        return held

    def members_holding(self) -> set[str]:
        """The holdings counted toward a reservation whose window is open now (each
        toward one at most): a quota's take-back never stops them."""
        now = self.wall()
        near = self._near(now, timedelta(0))
        return set(count_toward(near, self._member_holders(near), now)) if near else set()

    def _member_holders(self, near: list[Reservation]) -> list[Holder]:
        """The holdings of ``near``'s models whose users are members of one of them, as the
        reservations see them."""
        models, groups = {r.model for r in near}, {r.group for r in near}
        holders, everyone, cached = [], self.holdings.all(), self._holders
        asked, fresh = self._groups, self.clock() - GROUPS_SECONDS  # (the groups asked since are kept)
        for name, h in everyone.items():
            # A member's server being removed still counts: its GPU comes back to the reservation,
            # and counting it as nobody's would have others stop for room it gives back.
            record = h.held
            if record.model not in models or not record.uuids:
                continue
            known = asked.get(record.user)
            mine = known[1] if known is not None and known[0] > fresh else self._groups_of(record.user)
            if not mine or groups.isdisjoint(mine):
                continue  # (a member of none counts toward none)
            kept = cached.get(name)
            holders.append(kept[1] if kept and kept[0] is h and kept[1].groups is mine else self._holder(name, h, mine))
        if len(self._holders) > 2 * len(everyone) + 64:  # (those of ended holdings, now and then)
            self._holders = {n: k for n, k in self._holders.items() if n in everyone}
        return holders

    def _holder(self, name: str, h: Holding, groups: frozenset[str]) -> Holder:
        """``h`` as the reservations see it, kept while the holding and its user's groups
        stay the same: a large hub counts thousands after every change of holdings, and
        made anew each time they would keep its garbage collector busy."""
        made = self._holders[name] = (h, Holder(name, h.held.model, sum(h.held.milli), groups))
        return made[1]

    def _members_waiting(self, near: list[Reservation]) -> dict[int, int]:
        """Per reservation that lends, what its members wait for in line: each ask rounded
        up to whole GPUs (a share asked is a GPU: lending reservations are of whole GPUs),
        in thousandths."""
        lending = [r for r in near if r.lend and r.id is not None]
        out: dict[int, int] = {}
        for user, model, milli in self.waiting() if lending else ():
            groups = self._groups_of(user) or frozenset()
            for r in lending:
                if r.model == model and r.group in groups:
                    out[r.id] = out.get(r.id, 0) + -(-milli // UNIT) * UNIT  # type: ignore[index]  # whole GPUs
        return out

    def needs(self, now: datetime, ahead: timedelta = timedelta(0)) -> list[Need]:
        """The open windows (and those opening within ``ahead``), each with what its members leave unused."""
        near = self._near(now, ahead)
        return needs(near, now, self._members_hold(near), ahead, self._members_waiting(near)) if near else []

    # -- what a request may take -----------------------------------------------------

    def status(self) -> list[dict]:
        """Each reservation as stored, with its current or next window and what its members hold now
        (each holding counted toward one open reservation at most)."""
        now = self.wall()
        held = self._members_hold(self._near(now, timedelta(0)))
        out = []
        for r in self.reservations:
            w = r.next_window(now)
            hold = round(held.get(r.id or 0, 0.0), 3)
            out.append(
                r.as_json()
                | {
                    "open": w is not None and now in w,
                    "window": None if w is None else {"start": _iso(w.start), "end": _iso(w.end)},
                    "members_hold": hold,
                    "unused": max(0, round(r.count - (hold if r.shares else int(hold + 1e-9)), 3)),
                }
            )
        return out

    def keep_free(self, groups: Iterable[str]) -> dict[str, Keep]:
        """Per model, what a request of a user in ``groups`` must leave free (the
        open windows of reservations they are not a member of). While the
        list has never been read, every device of every model: no GPU is handed out
        (a request that waits keeps its place, and is served once the list is read)."""
        if not self.known:
            return {m.model: Keep(UNKNOWN) for m in self.holdings.allocator.summary()}
        now = self.wall()
        return keep_free(self.needs(now), self.member_of(groups), now)

    def open_for(self, groups: Iterable[str], model: str | None) -> bool:
        """Whether a user in ``groups`` is a member of a reservation of ``model`` whose window is open."""
        mine, now = self.member_of(groups), self.wall()
        return any(r.id in mine and r.model == model and r.active(now) for r in self.reservations)

    def refusal(self, model: str, groups: Iterable[str]) -> str:
        """Why a request for ``model`` is not granted: the open windows that keep its GPUs."""
        if not self.known:
            return (
                "GPUs are not handed out until the hub can read its GPU reservations (its ledger "
                "database does not answer); please try again in a minute."
            )
        now, mine = self.wall(), self.member_of(groups)
        kept = [n for n in self.needs(now) if n.reservation.model == model and n.reservation.id not in mine]
        names = ", ".join(
            f"{n.kept} for {n.reservation.label} until {n.reservation.when(n.window.end)}" for n in kept if n.keep
        )
        return f"The free {model} GPUs are reserved ({names}); please try again later or ask for another model."

    # -- making room -------------------------------------------------------------------

    def must_make_room(self, now: datetime, ahead: timedelta = NOTICE_BEFORE) -> dict[str, tuple[Need, Holding]]:
        """Servers of others that must end for the open windows and those opening
        within ``ahead``, as things are now: holding name -> (the window's need that
        first requires it, the holding). Each moment a window opens is taken in turn,
        with what the windows of the model open then lack together (each holding
        counted toward one of them at most), so no more are stopped than all of them
        need. A member of any reservation of the model open then is left alone, and
        so is a server whose held-time limit ends it by then."""
        near = self._near(now, ahead)
        if not near:
            return {}
        everyone = self.holdings.all()

        def candidates(model: str, held: Collection[str]) -> list[Candidate]:
            found = [
                (n, h)
                for n, h in reversed(everyone.items())
                if n in held and h.phase is not Phase.REMOVING and not self.protected(n)
            ]
            found.sort(key=lambda nh: self.held_for(nh[1]) or 0.0)  # stable: newest first
            out = [Candidate(n, self._groups_of(h.user), self._ends_at(h, now)) for n, h in found]
            for c in out:
                if c.groups is None:
                    log.debug("The groups of the user of %s are not known: it is not stopped for a reservation", c.name)
            return out

        room = make_room(
            near,
            now,
            ahead,
            self._members_hold,
            self.holdings.allocator.model_devices,
            candidates,
            self._members_waiting(near),
        )
        return {name: (need, everyone[name]) for name, need in room.items()}

    def _ends_at(self, h: Holding, now: datetime) -> datetime | None:
        """When ``h``'s held-time limit ends it (None: nothing does)."""
        left = self.ends_in(h)
        return None if left is None else now + timedelta(seconds=left)

    def _stop_at(self, name: str, need: Need, h: Holding, now: datetime) -> datetime:
        """When a server that must make room is stopped: at the window's start; a lent GPU
        a member waits for, LEND_NOTICE after its holder was first told."""
        told = self._told.get(name)
        since = told[1] if told is not None and told[0] is h else now
        return since + LEND_NOTICE if need.reservation.lend else max(need.window.start, since)

    async def check(self) -> list[tuple[str, str]]:
        """Stop the servers that must make room for a window that has opened (several
        at once); the (service, reason) of each stop begun."""
        await self.refresh()
        now = self.wall()
        self._show(now)
        due = self.must_make_room(now)
        for name in set(self._told) - set(due):
            del self._told[name]  # no longer in the way
        for name, (_, h) in due.items():
            if name not in self._told or self._told[name][0] is not h:
                self._told[name] = (h, now)
        if self.stop is None:
            return []
        now_due = [(name, need, h) for name, (need, h) in due.items() if self._stop_at(name, need, h, now) <= now]
        room = asyncio.Semaphore(STOPS_AT_ONCE)
        stops = [self._stop_one(room, name, need, h) for name, need, h in now_due]
        began = [await stops[0]] if len(stops) == 1 else await asyncio.gather(*stops)  # one: no task of its own
        return [(name, RESERVATION) for (name, _, _), ok in zip(now_due, began) if ok]

    async def _stop_one(self, room: asyncio.Semaphore, name: str, need: Need, h: Holding) -> bool:
        async with room:
            # The others' stops may have let the holding end, or its name go to a new server.
            if self.holdings.get(name) is not h or h.phase is not Phase.RUNNING or self.stop is None:
                return False  # a spawn under way is stopped at a later check, once running
            log.info("Stopping %s of %s for the reservation %s", name, h.user, need.reservation.label)
            try:
                return await stop_for(h, RESERVATION, self.stop)
            except Exception as exc:  # begun, not done: the reconcile ends it
                log.error("Could not stop %s for a reservation: %s", name, exc)
                return False

    def _show(self, now: datetime) -> None:
        """The gauge: per model, GPUs of open windows their members hold, those a lending
        reservation has lent (neither held by members nor untouched), and the rest."""
        counts: dict[tuple[str, str], float] = {key: 0 for key in self._shown}
        near = self._near(now, timedelta(0))
        held = self._members_hold(near)
        allocator = self.holdings.allocator
        for r in near:
            hold = held.get(r.id or 0, 0.0)
            used = min(r.count, round(hold, 3) if r.shares else int(hold + 1e-9))
            free = allocator.room(r.model) / UNIT if r.shares else allocator.untouched(r.model)
            lent = max(0, round(r.count - used - free, 3)) if r.lend else 0
            for state, n in (("held", used), ("lent", lent), ("unused", round(r.count - used - lent, 3))):
                counts[(r.model, state)] = counts.get((r.model, state), 0) + n
        for (model, state), value in counts.items():
            RESERVED.labels(model, state).set(round(value, 3))
        self._shown = set(counts)

    def notices_for(self, user: str) -> list[dict]:
        now = self.wall()
        out = []
        for name, (need, h) in self.must_make_room(now).items():
            if h.user != user:
                continue
            at = max(now, self._stop_at(name, need, h, now))
            r = need.reservation
            server = f"“{h.held.server}”" if h.held.server else "default"
            why = (
                f"a member of {r.label} waits for the {r.model} lent to it"
                if r.lend
                else f"its {r.model} is reserved for {r.label} from {r.when(need.window.start)}"
            )
            out.append(
                {
                    "server": h.held.server,
                    "reason": RESERVATION,
                    "stop_at": _iso(at),
                    "seconds_left": round((at - now).total_seconds()),
                    "message": f"Your {server} server will be stopped at {r.when(at)}: {why}.",
                }
            )
        return out

    def notice_at_grant(self, h: Holding) -> str | None:
        """What a server granted just now is told when, as things are now, it will
        have to make room (for a window opening before its held-time limit ends, or
        within a week), or that its GPU is lent from an open window."""
        now = self.wall()
        left = self.ends_in(h)
        ahead = WEEK if left is None else timedelta(seconds=left)
        found = self.must_make_room(now, ahead).get(h.name)
        if found is not None:
            need, _ = found
            r = need.reservation
            return f"Its {r.model} is reserved for {r.label} from {r.when(need.window.start)}: the server will be stopped then"
        for r in self.reservations:
            w = r.active(now) if r.lend and r.model == h.held.model else None
            if w is not None and r.group not in (self._groups_of(h.user) or frozenset()):
                return (
                    f"{r.label} lends its unused {r.model} until {r.when(w.end)}: the server will be "
                    f"stopped {LEND_NOTICE.seconds // 60} minute after a member of {r.label} asks for one"
                )
        return None
