"""Who holds which GPUs: the one owner of every holding and of its life.

A holding is one server's claim on devices (or on shares of them), named by
its swarm service. It lives through these phases, and only this module moves
it from one to the next::

    reserved ──► creating ──► running ──► removing ──► (released: forgotten)
        │            │                        ▲
        └────────────┴── a failed or ─────────┘
                         cancelled start

* **reserved**: the allocator booked the devices and the ledger recorded them;
  no service exists yet.
* **creating**: the service is being created; it may or may not exist.
* **running**: the service exists (its task may still be on its way).
* **removing**: the service is being, or was, removed; its devices stay
  booked until no task of it can still run (the swarm forgets a removed
  service at once, but its container gets SIGTERM and a grace period).

Every ``await`` here lets a spawn, a stop, a poll or the reconcile loop run.
Reconciliation therefore never touches a holding in flight (reserved,
creating) nor one that changed since it asked the swarm what runs; a holding
whose service is gone goes to *removing*, never straight to released; and a
device is free again only when the tasks its holder is known to have run have
ended (or, where none was ever seen, ``stop_timeout`` after the service was
seen gone).

Labels are claims, not facts: a labelled service is taken as a hub server
only when its labels parse strictly and its name is the one the hub gives
that user's server; anything else is left alone, logged once, and listed in
:attr:`Holdings.foreign` for ``doctor``.

A labelled service the hub holds nothing for is adopted; its ledger row, when the ledger
has none open for it, starts at the service's creation (not at the adoption), so that its
GPU time is counted from when it began. A server the hub's database does not have (one
started after the backup a restored database was made from: JupyterHub has no record or
API token for it, so it cannot be taken over) is stopped with the end reason
:data:`NOT_IN_HUB_DATABASE` and one WARNING naming its user and server.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TypeVar

from .. import metrics
from ..allocator.adopt import AdoptReason
from ..allocator.allocator import Allocation, AllocationRefused, Refusal, Request
from ..cluster.cluster import GPUCluster
from ..cluster.swarm import Swarm, SwarmError, spec_reservations
from ..core.labels import LABEL, Held, LabelError, parse_labels
from ..core.sharing import UNIT
from ..ledger.ledger import Ledger, LedgerError
from ..plan.reservations import Keep
from .ports import NoPortFree, PortPool

__all__ = ["NOT_IN_HUB_DATABASE", "Holding", "Holdings", "HoldingBusy", "Phase", "stop_for"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# The end reason of a server the hub's database does not have (docs/end-reasons.md).
NOT_IN_HUB_DATABASE = "not in the hub's database"
_DOCKER_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


def created_at(service: Mapping) -> datetime | None:
    """When the swarm created ``service`` (its ``CreatedAt``: RFC 3339, to the nanosecond),
    never later than now; None when it does not say."""
    match = _DOCKER_TIME.fullmatch(str(service.get("CreatedAt") or ""))
    if match is None:
        return None
    whole, fraction, zone = match.groups()
    try:
        when = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    except ValueError:
        return None
    when = when.replace(microsecond=int((fraction or "0")[:6].ljust(6, "0")))
    return min(when.astimezone(timezone.utc), datetime.now(timezone.utc))


def server_words(held: Held) -> str:
    """``held``'s user and server as a log line names them."""
    return f"{held.user}'s server {held.server!r}" if held.server else f"{held.user}'s default server"


class Phase(str, enum.Enum):
    RESERVED = "reserved"
    CREATING = "creating"
    RUNNING = "running"
    REMOVING = "removing"


class HoldingBusy(Exception):
    """The server's earlier holding is still being removed."""


@dataclass(eq=False)
class Holding:
    name: str  # the service's name: one holding per name
    held: Held  # user, server, host, devices, shares, port (its service's labels write it down)
    phase: Phase
    tasks: set[str] = field(default_factory=set)  # every task id seen for the service
    problem: str = ""  # why its devices are still reserved, for admins
    created: bool = False  # a service may exist (its creation was asked for)
    creating: asyncio.Future | None = None  # the create call, which runs on even if its caller is cancelled
    gone_since: float | None = None  # when its service was first seen gone without a known task
    end_reason: str = ""  # set by the stop that began its end (idle reclaim): the ledger's reason
    started_at: datetime | None = None  # an adopted holding's service's creation: where a row opened for it starts
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one removal at a time
    since: float = field(default_factory=time.monotonic)  # when this hub made it: an order that never changes

    @property
    def user(self) -> str:
        return self.held.user


async def stop_for(h: Holding, reason: str, stop: Callable[[Holding, str], Awaitable[bool]]) -> bool:
    """``stop(h, reason)`` (through the hub), with ``reason`` the end reason whoever releases
    the holding records, unless a stop under way already named its own (an idle reclaim's,
    a reservation's). True when the stop began; when it did not (a stop or spawn under way),
    the reason is taken back. An exception propagates: begun, not done, the reason stays."""
    mine = not h.end_reason
    if mine:
        h.end_reason = reason
    stopped = await stop(h, reason)
    if not stopped and mine and h.end_reason == reason:
        h.end_reason = ""  # the reason is the other's
    return stopped


class Holdings:
    """Every holding of one hub, with the allocator and ledger it books in.

    Built once per hub; spawners, endpoints, metrics and the reconcile loop
    all use the same instance."""

    def __init__(
        self,
        cluster: GPUCluster,
        swarm: Swarm,
        *,
        ledger: Ledger | None = None,
        executor=None,
        name_for: Callable[[str, str], str] | None = None,
        stop_timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_free: Callable[[], None] = lambda: None,
    ):
        self.cluster = cluster
        self.allocator = cluster.allocator
        self.swarm = swarm
        self.ledger = ledger
        self.executor = executor  # for the ledger's blocking calls (None: the loop's default)
        self.name_for = name_for  # the service name the hub gives (user, server)
        self.stop_timeout = stop_timeout
        self.clock = clock
        self._holdings: dict[str, Holding] = {}
        self.ports = PortPool()  # for host networking
        self.foreign: dict[str, str] = {}  # labelled services not taken as hub servers -> why
        self._orphans: set[str] = set()
        self._unopened: set[str] = set()  # adopted holdings whose open allocation the ledger could not take yet
        self._told_unlisted: set[str] = set()  # adopted holdings whose devices not in the inventory were logged
        self._version = 0  # counts transitions; reconciliation skips what changed under it
        self._changed: dict[str, int] = {}
        self._reconciling = asyncio.Lock()
        self._ledger_order = asyncio.Lock()  # see _ledger_write
        self.rebuilt = False
        self.records_unread = False  # the ledger's open records could not be read at the rebuild
        self.granted = 0  # GPU holdings booked so far (the frag policy learns again sooner while they are few)
        self.on_free = on_free  # called when devices come back (the line is served)

    # -- views -------------------------------------------------------------------

    def get(self, name: str) -> Holding | None:
        return self._holdings.get(name)

    def all(self) -> dict[str, Holding]:
        return dict(self._holdings)

    @property
    def version(self) -> int:
        """A number that changes whenever a holding is made, changes phase or ends."""
        return self._version

    # -- transitions ---------------------------------------------------------------

    def _set(self, h: Holding, phase: Phase, problem: str = "") -> None:
        h.phase, h.problem = phase, problem
        self._touch(h.name)
        if h.held.uuids:
            self.cluster.views.holders_changed(h.held.host)  # the map shows phase and problem

    def _touch(self, name: str) -> None:
        self._version += 1
        self._changed[name] = self._version

    async def reserve(
        self,
        name: str,
        user: str,
        server: str,
        request: Request | None,
        *,
        max_per_owner: int,
        policy: str,
        port_range: tuple[int, int] | None = None,
        keep_free: Mapping[str, Keep] | None = None,
        kept_why: Callable[[str], str] = lambda model: f"The free {model} GPUs are reserved.",
    ) -> Holding:
        """Book devices (``request``; None: CPU-only) and a port, and record
        them in the ledger. ``keep_free``: per model, what must stay free
        (others' reservations; AllocationRefused with
        Refusal.RESERVED, saying ``kept_why(model)``, when they would not). Raises AllocationRefused, HoldingBusy (an earlier
        holding of this server is still being removed), LedgerError (nothing
        is left booked) or NoPortFree."""
        if name in self._holdings:
            raise HoldingBusy(name)
        gpus = request is not None and (request.milli is not None or request.count != 0)  # not a CPU-only placement
        if gpus and self.records_unread:
            # An earlier hub's server may still run on a device the ledger alone knows of.
            raise LedgerError("the GPU bookings of the earlier hub are not read from the ledger yet")
        alloc: Allocation | None = None
        if request is not None:
            alloc = self._allocate(name, request, max_per_owner, policy, keep_free or {}, kept_why)
        port = None
        if port_range is not None:
            port = self.ports.pick(name, *port_range)
            if port is None:
                self.allocator.release(name)
                raise NoPortFree(f"all host_network_ports {port_range} are in use")
        held = Held(
            user=user,
            server=server,
            host=alloc.host if alloc else "",
            uuids=alloc.uuids if alloc else (),
            model=alloc.model if alloc else "",
            port=port,
            milli=alloc.milli if alloc else (),
        )
        h = self._holdings[name] = Holding(name, held, Phase.RESERVED)
        self._touch(name)
        if alloc is not None and alloc.devices:
            try:
                await self._ledger_open(name, held, alloc)
            except BaseException:
                # No service exists: nothing can run on the devices.
                self._forget(h)
                raise
            self.granted += 1
        return h

    def _allocate(
        self,
        name: str,
        request: Request,
        max_per_owner: int,
        policy: str,
        keep_free: Mapping[str, Keep],
        kept_why: Callable[[str], str],
    ) -> Allocation:
        """The allocator's booking, unless it leaves less of its model free than
        ``keep_free`` says: then, for a share, as ``pack`` places it; then the request's
        other models, if it takes several."""
        reserved: str | None = None  # the first model found kept for others
        limited: str | None = None  # the first model its group's borrowing limit refused
        while True:
            try:
                with metrics.ALLOCATION_SECONDS.time():  # the decision alone, not the ledger's write
                    alloc = self.allocator.allocate(name, request, max_per_owner=max_per_owner, policy=policy)
            except AllocationRefused:
                if reserved is None and limited is None:
                    raise
                if reserved is None:
                    raise AllocationRefused(kept_why(limited), Refusal.LIMIT_REACHED) from None  # type: ignore[arg-type]
                raise AllocationRefused(kept_why(reserved), Refusal.RESERVED) from None
            kept = keep_free.get(alloc.model) if alloc.devices else None
            if not kept or kept.met(
                self.allocator.untouched(alloc.model),
                self.allocator.room(alloc.model) if kept.room else kept.devices * UNIT,  # room: only when asked
                sum(alloc.milli),
            ):
                return alloc
            self.allocator.release(name)
            if kept.most is not None and sum(alloc.milli) > kept.most:
                # A group's borrowing limit: a limit like a user's own, not GPUs kept for others.
                limited = limited or alloc.model
                others = tuple(m for m in request.models or () if m != alloc.model)
                if not others:
                    raise AllocationRefused(kept_why(limited), Refusal.LIMIT_REACHED)
                request = replace(request, models=others)
                continue
            if request.milli is not None and policy != "pack":
                # frag may put a share on an untouched device kept for others; pack puts it
                # on the fullest device that has room, untouched ones last.
                policy = "pack"
                continue
            reserved = reserved or alloc.model
            others = tuple(m for m in request.models or () if m != alloc.model)
            if not others:
                raise AllocationRefused(kept_why(reserved), Refusal.RESERVED)
            request = replace(request, models=others)

    async def create(self, name: str, spec: dict) -> dict:
        """Create the holding's service from ``spec`` (build_service's kwargs).
        On failure the holding is left *creating*: the caller removes it."""
        h = self._holdings.get(name)
        if h is None or h.phase is not Phase.RESERVED:
            raise SwarmError(f"{name} was stopped before its service was created")
        self._set(h, Phase.CREATING)
        h.created = True
        h.creating = asyncio.ensure_future(self.swarm.create_service(**spec))
        h.creating.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen, also if nobody awaits it
        service = await asyncio.shield(h.creating)
        if h.phase is Phase.CREATING:
            self._set(h, Phase.RUNNING)
        return service

    async def note_tasks(self, name: str, task_ids: Iterable[str]) -> None:
        """Remember the holding's tasks, here and in the ledger (a restarted hub
        must still know what may run on its devices)."""
        h = self._holdings.get(name)
        new = set(task_ids) - h.tasks if h else set()
        if h is None or not new:
            return
        h.tasks |= new
        if h.held.uuids:
            held: Holding = h  # the tasks are read when the call runs: a later note's are written too
            try:
                await self.ledger_call(lambda db: db.note_tasks(name, sorted(held.tasks)))
            except LedgerError as exc:  # kept here; written again with the next task seen
                log.warning("%s", exc)

    async def remove(self, name: str, *, wait: float | None = None, reason: str = "server stopped") -> bool:
        """Remove the service and give back its devices once no task of it can
        still run (waiting up to ``wait`` s, default ``stop_timeout``).

        True when nothing of it is left. False when the swarm could not be
        asked or a task still runs: its devices stay reserved (*removing*, with
        the reason shown to admins) and a later call or reconciliation
        finishes the job. Also removes a leftover service of that name that
        the hub holds nothing for."""
        h = self._holdings.get(name)
        if h is None:
            return await self._remove_service(name, set(), wait)
        async with h.lock:
            if self._holdings.get(name) is not h:
                return True  # removed meanwhile by whoever held the lock
            if h.phase is not Phase.REMOVING:
                self._set(h, Phase.REMOVING, h.problem)
            if h.creating is not None and not h.creating.done():
                # A cancelled start: the swarm may still create the service.
                await asyncio.wait([h.creating])
            if not h.created:
                await self._release(h, reason)  # no service was ever asked for
                return True
            try:
                ended = await self._remove_service(name, h.tasks, wait, h)
            except SwarmError as exc:
                self._set(h, Phase.REMOVING, f"its service could not be removed: {exc}")
                log.error("Could not remove service %s (its GPUs stay reserved): %s", name, exc)
                return False
            if not ended:
                self._set(h, Phase.REMOVING, "its container is still running")
                # Not waited for (a reconciliation's removal): its end is seen at a later round.
                level = logging.INFO if wait == 0 else logging.WARNING
                log.log(level, "Service %s still runs after its removal; its GPUs stay reserved", name)
                return False
            await self._release(h, reason)
            return True

    async def _remove_service(self, name: str, known: set[str], wait: float | None, h: Holding | None = None) -> bool:
        """Remove the service if it exists, and wait for its tasks to end."""
        tasks = set(known)
        try:
            tasks |= {t["ID"] for t in await self.swarm.tasks(name)}
            if h is not None and tasks - h.tasks:
                # Noted first: a removal whose answer is lost has still removed the service,
                # and then only these ids tell whether its containers have ended.
                await self.note_tasks(name, tasks)
            await self.swarm.remove_service(name)
        except SwarmError as exc:
            if not exc.not_found:
                raise
        if not tasks and h is not None and h.held.uuids:
            # No task was ever seen: whatever ran had the stop timeout to end.
            now = self.clock()
            if h.gone_since is None:
                h.gone_since = now
            if now - h.gone_since < self.stop_timeout:
                return False
        timeout = self.stop_timeout if wait is None else wait
        return await self.swarm.wait_tasks_ended(sorted(tasks), timeout)

    async def _release(self, h: Holding, reason: str) -> None:
        # Closed while still held: a reconcile's close_missing meanwhile would close it as gone.
        if h.held.uuids:
            try:
                if h.name in self._unopened:  # adopted, its devices never offered: what its labels say it held
                    held = h.held
                    await self._ledger_write(
                        lambda db: db.open(
                            h.name, held.user, held.server, held.host, held.model, held.uuids, held.milli, h.started_at
                        )
                    )
                await self._ledger_write(lambda db: db.close(h.name, None, h.end_reason or reason))
            except LedgerError as exc:  # the next reconciliation closes it
                log.warning("%s", exc)
            log.info("Released %s from %s", ", ".join(h.held.uuids), h.name)
        self._forget(h)

    def _forget(self, h: Holding) -> None:
        if self._holdings.get(h.name) is h:
            del self._holdings[h.name]
            self.allocator.release(h.name)
            self.cluster.pending.pop(h.name, None)
            self.ports.release(h.name)
            self._unopened.discard(h.name)
            self._told_unlisted.discard(h.name)
            self._touch(h.name)
            self.on_free()

    # -- reconciliation ------------------------------------------------------------

    async def reconcile(self, untracked: Callable[[str, str], bool] | None = None) -> dict[str, int]:
        """Make the holdings match the services the swarm runs.

        A labelled service the hub does not hold is adopted (at hub start,
        or a spawn that died with a killed hub); a holding whose service is
        gone is removed (its devices come back once its tasks ended).
        ``untracked(user, server)`` says the hub has no such server: its
        service, found so at two rounds in a row, is removed."""
        async with self._reconciling:
            return await self._reconcile(untracked)

    async def _reconcile(self, untracked) -> dict[str, int]:
        version = self._version
        services = await self.swarm.services(f"{LABEL}.devices")
        found: dict[str, Held] = {}
        reserved: dict[str, tuple[int, int]] = {}  # what each found service reserves besides GPUs
        created: dict[str, datetime | None] = {}  # when the swarm created each found service
        present = set()  # every labelled service, also those not taken as hub servers
        for service in services:
            spec = service.get("Spec", {})
            present.add(spec.get("Name", ""))
            claim = self._claim(spec.get("Name", ""), spec.get("Labels") or {})
            if claim is not None:
                found[spec["Name"]] = claim
                created[spec["Name"]] = created_at(service)
                # Booked only where the hub chose the host (a server the swarm placed counts by its task).
                reserved[spec["Name"]] = spec_reservations(spec) if claim.host else (0, 0)
        records_read = self.rebuilt or await self._adopt_open_records(found)
        adopted = 0
        for name, claim in found.items():
            # Skip what is held, and what changed since the swarm was asked
            # (e.g. a server stopped meanwhile: its service is gone by now).
            if name not in self._holdings and self._changed.get(name, 0) <= version:
                await self._adopt(name, claim, reserved=reserved[name], started_at=created[name])
                adopted += 1
        await self._open_unopened()
        self._tell_unlisted()
        removed = await self._remove_orphans(found, untracked, version)
        # Holdings whose service is gone, and those being removed (a stop that
        # failed, or whose container still ran): removed again, given back
        # once their tasks have ended.
        ending = [
            h
            for h in list(self._holdings.values())
            if (h.phase is Phase.REMOVING or h.phase is Phase.RUNNING and h.name not in present)
            and not h.lock.locked()
            and self._changed.get(h.name, 0) <= version
        ]
        released = 0
        for h in ending:
            if h.phase is Phase.RUNNING:
                log.warning("Service %s is gone; its GPUs come back once its tasks have ended", h.name)
            if await self._settle(h):
                released += 1
        if records_read:  # else an open record not yet adopted would be closed unseen
            await self._close_missing()
        # Not rebuilt while the ledger's open records are unread: the next round reads them.
        self.rebuilt = records_read
        self._changed = {n: v for n, v in self._changed.items() if v > version}
        held_devices = sum(len(h.held.uuids) for h in self._holdings.values())
        log.info(
            "GPU holdings reconciled with the swarm: %d services, %d adopted, %d released, %d devices held",
            len(found),
            adopted,
            released,
            held_devices,
        )
        return {
            "services": len(found),
            "adopted": adopted,
            "released": released,
            "held": held_devices,
            "removed": removed,
        }

    async def _settle(self, h: Holding) -> bool:
        """A holding whose service is gone: released once its tasks ended."""
        try:
            return await self.remove(h.name, wait=0, reason="service gone")
        except SwarmError as exc:
            log.warning("Service %s: %s", h.name, exc)
            return False

    def _claim(self, name: str, labels: dict) -> Held | None:
        """The service's labels as a hub server's, or None (logged once)."""
        try:
            claim = parse_labels(labels)
        except LabelError as exc:
            why = f"its labels are not valid: {exc}"
        else:
            if claim is None:
                return None
            expected = self.name_for(claim.user, claim.server) if self.name_for else name
            if name == expected:
                self.foreign.pop(name, None)
                return claim
            why = f"its name is not {expected!r}, the hub's name for {claim.user}'s server {claim.server!r}"
        if self.foreign.get(name) != why:
            log.warning("Service %s is not taken as a hub server: %s", name, why)
        self.foreign[name] = why
        return None

    async def _adopt(
        self,
        name: str,
        claim: Held,
        phase: Phase = Phase.RUNNING,
        reserved: tuple[int, int] = (0, 0),
        started_at: datetime | None = None,
    ) -> Holding:
        """Hold what a running service holds. ``started_at``: its creation, where a ledger
        row opened for it starts (the ledger keeps one it has open for the same devices)."""
        alloc, problems = self.cluster.adopt(name, claim, reserved)
        for problem in problems:
            if problem.reason is AdoptReason.NOT_IN_INVENTORY and not self._reported(claim.host):
                # Its node's agent has not reported yet (a hub's start): taken once it has.
                log.debug("Service %s: %s yet", name, problem)
                continue
            log.warning("Service %s: %s", name, problem)
            if problem.reason is AdoptReason.NOT_IN_INVENTORY:
                self._told_unlisted.add(name)
            if problem.reason.double_booking:
                metrics.DOUBLE_BOOKINGS.inc()
        h = self._holdings[name] = Holding(name, claim, phase, created=True, started_at=started_at)
        self._touch(name)
        if claim.port is not None:
            self.ports.hold(name, claim.port)
        if claim.uuids and phase is Phase.RUNNING:
            if not alloc.devices:
                # Its devices are not offered yet (no agent has reported them): recorded once
                # they are booked for it, or when it is released, whichever comes first.
                self._unopened.add(name)
                return h
            try:
                await self._ledger_open(name, claim, alloc, started_at)
            except LedgerError as exc:
                log.warning("%s (its allocation is recorded at a later reconcile)", exc)
                self._unopened.add(name)
        return h

    def _reported(self, host: str) -> bool:
        """Whether the inventory has heard from ``host``: it is listed, or has reported."""
        return host in self.cluster.static_hosts or host in self.cluster.reports

    def _tell_unlisted(self) -> None:
        """Once per holding: devices of an adopted holding that are still not in the
        inventory after its node has reported (at adoption, before any report, they are
        only logged at DEBUG)."""
        pending = self.cluster.pending
        self._told_unlisted &= set(pending)
        for name, (claim, _) in sorted(pending.items()):
            if name in self._told_unlisted or name not in self._holdings or not self._reported(claim.host):
                continue
            alloc = self.allocator.holding(name)
            booked = set(alloc.uuids) if alloc is not None else set()
            missing = [u for u in claim.uuids if u not in booked]
            log.warning(
                "Service %s: %s not in the inventory, although %s has reported; booked for it once offered",
                name,
                ", ".join(missing) + (" is" if len(missing) == 1 else " are"),
                claim.host,
            )
            self._told_unlisted.add(name)

    async def _open_unopened(self) -> None:
        """Record the allocations of adopted holdings that the ledger could not take
        when they were adopted, or whose devices were not offered yet (unrecorded, the
        next hub could not know a container may still run on their devices, nor count
        their GPU-hours)."""
        for name in sorted(self._unopened):
            h, alloc = self._holdings.get(name), self.allocator.holding(name)
            if h is None or not h.held.uuids:
                self._unopened.discard(name)
                continue
            if alloc is None or not alloc.devices:
                continue  # not offered yet: recorded once they are, or at its release
            try:
                await self._ledger_open(name, h.held, alloc, h.started_at)
            except LedgerError as exc:
                log.warning("%s", exc)
                return  # the next reconcile tries again
            self._unopened.discard(name)

    async def _adopt_open_records(self, running: dict[str, Held]) -> bool:
        """At hub start: allocations the ledger has open whose service is gone
        are booked again as *removing*, with their tasks, and given back only
        once those tasks have ended (a killed hub may have left a container
        running on them). False when the ledger could not be read: until it
        is, no GPU is handed out (see :meth:`reserve`)."""
        try:
            records = await self.ledger_call(lambda db: db.open_allocations())
        except LedgerError as exc:
            self.records_unread = True
            log.warning("The ledger's open allocations could not be read; no GPU is handed out until they are: %s", exc)
            return False
        self.records_unread = False
        for r in records or ():
            if r.service in running or r.service in self._holdings or not r.devices:
                continue
            claim = Held(
                user=r.user,
                server=r.server,
                host=r.host,
                uuids=tuple(r.devices),
                model=r.model,
                port=None,
                milli=r.milli,
            )
            h = await self._adopt(r.service, claim, Phase.REMOVING)
            h.tasks, h.created = set(r.tasks), True
            await self._settle(h)
        return True

    async def _remove_orphans(self, found: dict[str, Held], untracked, version: int) -> int:
        """Remove services of servers the hub does not know, found so twice in a
        row (not a spawn about to register). Nothing here waits: their devices
        come back at a later round, once their tasks have ended."""
        orphans = set()
        if untracked is not None:
            orphans = {
                name
                for name, c in found.items()
                if self._changed.get(name, 0) <= version and untracked(c.user, c.server)
            }
        removed = 0
        for name in sorted(orphans & self._orphans):
            h = self._holdings.get(name)
            if h is None or h.lock.locked():
                continue
            # JupyterHub has no record of the server, nor the API token its container was
            # given: nobody could log in to it, and JupyterHub cannot take it over. Stopped,
            # with its GPU time in the ledger and the reason it ended.
            log.warning(
                "Service %s runs %s, which the hub's database does not have (started after the backup "
                "the database was restored from, or made behind the hub's back); stopping it, its GPU "
                "time recorded with the end reason %r",
                name,
                server_words(h.held),
                NOT_IN_HUB_DATABASE,
            )
            h.end_reason = h.end_reason or NOT_IN_HUB_DATABASE
            await self._settle(h)
            removed += 1
        self._orphans = orphans
        return removed

    # -- the ledger ----------------------------------------------------------------

    async def _ledger_open(self, name: str, held: Held, alloc: Allocation, started_at: datetime | None = None) -> None:
        """Record the holding as open from ``started_at`` (None: now): its server (``held``),
        the devices booked for it, the CPU and memory it reserves on its host and the models
        its request accepted (not known for a holding adopted from the cluster)."""
        await self._ledger_write(
            lambda db: db.open(
                name,
                held.user,
                held.server,
                held.host,
                held.model,
                alloc.uuids,
                alloc.milli,
                started_at,
                cpu_milli=alloc.cpu_milli,
                memory_mib=alloc.memory_mib,
                accepts=alloc.accepts,
            )
        )

    async def _close_missing(self) -> None:
        """Close the allocations of services not held (also those a stop could not close)."""
        if self.ledger is not None:
            async with self._ledger_order:
                held = set(self._holdings)  # taken in its turn: see _ledger_write
                try:
                    await self.ledger_call(lambda db: db.close_missing(held))
                except LedgerError as exc:
                    log.warning("%s", exc)

    async def _ledger_write(self, call: Callable[[Ledger], T]) -> T | None:
        """Invariant: allocations are opened and closed in the order the
        holdings changed. Each write queues (FIFO) in the step of its change (a
        holding added or forgotten); close_missing snapshots the holdings in
        its turn. Else a new holding's open could run before an earlier close
        of its name, or a close_missing from before it, and lose its row."""
        async with self._ledger_order:
            return await self.ledger_call(call)

    async def ledger_call(self, call: Callable[[Ledger], T]) -> T | None:
        """One ledger call, off the event loop (database I/O); None without a
        ledger. Raises LedgerError."""
        if self.ledger is None:
            return None
        return await asyncio.get_running_loop().run_in_executor(self.executor, call, self.ledger)
