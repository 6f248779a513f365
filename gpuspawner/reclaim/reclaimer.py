"""Idle GPUs come back: the hub's side of idle reclaim and of the held-time limit.

Each accepted node report (see ``api.ReportHandler``) is read here per holder: for
each device of the report, its holders from the hub's own holdings, and each
holder's own processes (those the node's agent traced to the holder's service; the
hub believes a node only about devices it holds, and about services that hold them
there). :mod:`gpuspawner.core.idle` keeps the timers, :mod:`gpuspawner.core.memory`
each holder's memory against its share's; :meth:`Reclaimer.check`, run by the
hub every few seconds, warns (the notices users see on the home page and at
``GET /hub/api/gpuspawner/notices``) and stops through the hub the servers whose
warning has run out, with the end reason ``idle``, ``max_hours``, ``budget`` or
``memory`` in the ledger.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone

from prometheus_client import Counter as Counted
from prometheus_client import Gauge

from ..core.idle import BUDGET, IDLE, DeviceSample, IdleTimers, Limits, Notice
from ..core.memory import MEMORY, DeviceMemory, MemoryPolicy, MemoryWatch
from ..core.reports import NodeReport
from ..core.sharing import UNIT, entitled_mib
from ..holdings.holdings import Holding, Holdings, Phase, stop_for

__all__ = ["Reclaimer"]

log = logging.getLogger(__name__)

RECLAIMED = Counted(
    "gpuspawner_gpu_hours_reclaimed",
    "GPU-hours given back by stopping servers, by reason (idle: the idle time)",
    ["reason"],
)
STOPPED = Counted(
    "gpuspawner_servers_reclaimed", "Servers stopped for idleness, their held time, budget or memory", ["reason"]
)
IDLE_GPUS = Gauge("gpuspawner_idle_held_gpus", "GPUs (a share counts as its fraction) held by idle servers")
UNATTRIBUTED = Gauge("gpuspawner_unattributed_gpu_processes", "GPU processes no holder of their device owns")
OVER_MEMORY = Gauge(
    "gpuspawner_holders_over_memory", "Servers using more GPU memory than their share comes with", ["model"]
)

MAX_UNATTRIBUTED = 64  # kept per host, for admins
PEAK_STEP_MIB = 64  # a holder's peak memory is written again once it grows by more than this (or 2 %)

Stop = Callable[[Holding, str], Awaitable[bool]]
LimitsFor = Callable[[Holding], Limits]


def _server(h: Holding) -> str:
    return f"“{h.held.server}”" if h.held.server else "default"


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB"


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).isoformat().replace("+00:00", "Z")


class Reclaimer:
    """Idle and held-time reclaim for one hub's holdings. ``limits_for(h)``: the
    limits the holding's server is held to; ``stop(h, reason)``: stops a server
    through the hub (True when the stop began); ``on_active(h)``: a holder was
    busy on its GPUs."""

    def __init__(
        self,
        holdings: Holdings,
        *,
        limits_for: LimitsFor = lambda h: Limits(),
        stop: Stop | None = None,
        on_active: Callable[[Holding], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall=time.time,
    ):
        self.holdings = holdings
        self.clock, self.wall = clock, wall
        self.timers = IdleTimers(clock)
        self.memory = MemoryWatch(clock)
        self.limits_for = limits_for
        self.stop = stop
        self.on_active = on_active
        self.unattributed: dict[str, list[dict]] = {}  # host -> processes no holder owns
        self._timed: dict[str, Holding] = {}  # service -> the holding its timers are of
        self._stopping: set[str] = set()
        self._over_shown: set[str] = set()  # models the over-memory gauge has shown
        self._peaks: dict[str, int] = {}  # service -> the most memory the ledger has for it
        self._new_peaks: dict[str, tuple[Holding, int]] = {}  # service -> (its holding, a higher one) not yet written

    # -- readings ------------------------------------------------------------------

    def observe(self, report: NodeReport) -> None:
        """Take an accepted report: each holder's readings on this host's devices."""
        host = report.hostname
        samples: dict[str, list[DeviceSample]] = {}
        memory: dict[str, list[DeviceMemory]] = {}
        stray = []
        allocator = self.holdings.allocator
        for dev in report.devices:
            if dev.uuid is None or dev.mig_mode:
                continue  # MIG slices' processes are not read per slice
            booked = allocator.booked_on(dev.uuid)
            holders = [n for n in booked if self._held_on(n, host, dev.uuid)]
            for p in dev.compute:
                if p.service not in holders:
                    stray.append({"uuid": dev.uuid, "pid": p.pid, "used_mib": p.used_mib, "service": p.service})
            gpu = allocator.device(dev.uuid)
            for name in holders:
                own = tuple(p.used_mib for p in dev.compute if p.service == name)
                samples.setdefault(name, []).append(DeviceSample(dev.utilization_gpu, own, len(holders) > 1))
                if gpu is not None:
                    used = None if None in own else sum(own)  # type: ignore[arg-type]
                    entitled = entitled_mib(gpu.memory_mib, booked[name])
                    memory.setdefault(name, []).append(DeviceMemory(dev.uuid, used, entitled))
        self.unattributed[host] = stray[:MAX_UNATTRIBUTED]
        UNATTRIBUTED.set(sum(len(v) for v in self.unattributed.values()))
        for name, got in samples.items():
            h = self.holdings.get(name)
            if h is None:
                continue
            self._own_timers(h)
            if name in memory:
                self.memory.observe(name, memory[name], self.memory_policy(h))
                self._peak(h, sum(d.used_mib or 0 for d in memory[name]))
            if self.timers.observe(name, got, self.limits_for(h)) and self.on_active is not None:
                self.on_active(h)
        if samples:
            self.holdings.cluster.views.holders_changed(host)  # the map shows activity

    def _peak(self, h: Holding, mib: int) -> None:
        """A new most memory is written to the ledger at the next check: the first one
        seen, then once it has grown by a little (a slowly creeping use does not write
        at every report)."""
        pending = self._new_peaks.get(h.name)
        known = max(self._peaks.get(h.name, -1), pending[1] if pending else -1)
        if mib > 0 and (known < 0 or mib > known + max(PEAK_STEP_MIB, known // 50)):
            self._new_peaks[h.name] = (h, mib)

    async def _write_peaks(self) -> None:
        """Each pending peak to its holding's open allocation, while that holding is
        still the one under its name (a server started again under the name has its own)."""
        for name, (h, mib) in list(self._new_peaks.items()):
            if self.holdings.get(name) is not h:
                self._new_peaks.pop(name, None)
                continue
            try:
                await self.holdings.ledger_call(lambda db, n=name, m=mib: db.note_peak_memory(n, m))
            except Exception as exc:  # the ledger is down: written at a later check
                log.warning("The peak GPU memory of %s could not be recorded: %s", name, exc)
                return
            if self.holdings.get(name) is h:
                self._peaks[name] = max(mib, self._peaks.get(name, 0))
            if self._new_peaks.get(name) == (h, mib):
                del self._new_peaks[name]

    def _own_timers(self, h: Holding) -> None:
        """The timers of h's name are h's own: a server started again under the
        same name starts from zero, with no warning of the one before."""
        if self._timed.get(h.name) is not h:
            self.timers.forget(h.name)
            self.memory.forget(h.name)
            self._peaks.pop(h.name, None)
            self._new_peaks.pop(h.name, None)
            self._timed[h.name] = h

    def _held_on(self, name: str, host: str, uuid: str) -> bool:
        h = self.holdings.get(name)
        return h is not None and h.phase is Phase.RUNNING and h.held.host == host and uuid in h.held.uuids

    # -- decisions -----------------------------------------------------------------

    async def check(self) -> list[tuple[str, str]]:
        """Warn and stop where limits say so; the (service, reason) of each stop begun."""
        running = {n: h for n, h in self.holdings.all().items() if h.held.uuids and h.phase is Phase.RUNNING}
        for name in (set(self.timers.holders()) | set(self.memory.holders()) | set(self._timed)) - set(running):
            self.timers.forget(name)
            self.memory.forget(name)
            self._timed.pop(name, None)
        for name in (set(self._peaks) | set(self._new_peaks)) - set(running):
            self._peaks.pop(name, None)
            self._new_peaks.pop(name, None)
        for h in running.values():
            self._own_timers(h)
        await self._write_peaks()
        await self._hold_new(running)
        due, idle_gpus, over = [], 0.0, Counter[str]()
        for name, h in running.items():
            reason = self._reason(h)
            if self.timers.idle_for(name) is not None:
                idle_gpus += sum(h.held.milli) / UNIT
            if self.memory.over_devices(name):
                over[h.held.model] += 1
            if reason and name not in self._stopping:
                due.append((h, reason))
        IDLE_GPUS.set(idle_gpus)
        for model in set(self._over_shown) | set(over):
            OVER_MEMORY.labels(model).set(over[model])
        self._over_shown = set(over) | self._over_shown
        started = []
        for h, reason in due:
            # Decided again: an earlier stop's awaits may have let a reading in (activity
            # cancels an idle stop, less memory a memory stop), the holding end, or its
            # name go to a new server.
            if self._current(h) and self._reason(h) == reason:
                started.append((h.name, reason))
                await self._stop(h, reason)
        return started

    def _reason(self, h: Holding) -> str | None:
        """Why the holding's server must stop now, if it must."""
        reason = self.timers.decide(h.name, self.limits_for(h))
        if reason is None and self.memory.due(h.name, self.memory_policy(h)):
            reason = MEMORY
        return reason

    def memory_policy(self, h: Holding) -> MemoryPolicy:
        """What happens to the holding above its share's memory (its model's gpu_sharing entry)."""
        sharing = self.holdings.allocator.sharing.for_model(h.held.model)
        return MemoryPolicy() if sharing is None else sharing.memory

    def _current(self, h: Holding) -> bool:
        return self.holdings.get(h.name) is h and h.phase is Phase.RUNNING and self._timed.get(h.name) is h

    async def _hold_new(self, running: dict[str, Holding]) -> None:
        """Start timing new holdings; held time counts from the ledger's start where
        it has one (a holding adopted after a hub restart has been held for a while)."""
        new = [n for n in running if n not in self.timers.holders()]
        if not new:
            return
        started = {}
        try:
            records = await self.holdings.ledger_call(lambda db: db.open_allocations())
            started = {r.service: r.started_at.timestamp() for r in records or ()}
        except Exception as exc:  # the ledger is down: count from now
            log.warning("Idle reclaim: the ledger could not be read: %s", exc)
        now, wall = self.clock(), self.wall()
        for name in new:
            since = started.get(name)
            self.timers.hold(name, now if since is None else now - max(0.0, wall - since))

    async def _stop(self, h: Holding, reason: str) -> None:
        if self.stop is None:
            return
        idle = self.timers.idle_for(h.name) or 0.0
        gpus = sum(h.held.milli) / UNIT
        self._stopping.add(h.name)
        log.info("Stopping %s of %s (%s)", h.name, h.user, reason)
        try:
            stopped = await stop_for(h, reason, self.stop)
        except Exception as exc:  # begun, not done (its container still runs): the reconcile ends it
            log.error("Idle reclaim could not stop %s: %s", h.name, exc)
            stopped = False
        finally:
            self._stopping.discard(h.name)
        if stopped and self._timed.get(h.name) is h:
            self.timers.forget(h.name)
            self._timed.pop(h.name, None)
            STOPPED.labels(reason).inc()
            RECLAIMED.labels(reason).inc(gpus * (idle if reason == IDLE else 0.0) / 3600)

    def may_still_use(self, user: str, exclude: str = "") -> float:
        """GPU-hours ``user``'s servers (but ``exclude``) may still hold their GPUs,
        up to their time limits: what a weekly budget counts as spoken for. A
        server without a time limit adds nothing (its use counts as it goes); one
        not timed yet counts its whole limit."""
        total = 0.0
        for name, h in self.holdings.all().items():
            if h.user != user or name == exclude or not h.held.uuids or h.phase is Phase.REMOVING:
                continue
            limit = self.limits_for(h).max_held
            if limit is not None:
                left = limit - (self.timers.held_for(name) or 0.0)
                total += sum(h.held.milli) / UNIT * max(0.0, left) / 3600
        return total

    def held_for(self, h: Holding) -> float | None:
        """Seconds the holding has held its GPUs, as its timer counts (None: not timed yet)."""
        return self.timers.held_for(h.name) if self._timed.get(h.name) is h else None

    def ends_in(self, h: Holding) -> float | None:
        """Seconds until the holding's held-time limit stops its server; None: no limit."""
        limit = self.limits_for(h).max_held
        return None if limit is None else max(0.0, limit - (self.held_for(h) or 0.0))

    # -- what users and admins see -------------------------------------------------

    def notices_for(self, user: str) -> list[dict]:
        """The warnings of the user's servers, soonest stop first."""
        out = []
        for name, h in sorted(self.holdings.all().items()):
            if h.user == user:
                out += [self._notice(h, n) for n in self.timers.notices(name)]
                out += self._memory_notices(h)
        return sorted(out, key=lambda n: (n["stop_at"] is None, n["stop_at"] or ""))

    def _memory_notices(self, h: Holding) -> list[dict]:
        """A holder above its share's memory, told at once (under ``warn`` and ``stop``)."""
        policy = self.memory_policy(h)
        over = self.memory.over_devices(h.name)
        if policy.action == "report" or not over:
            return []
        uses = "; ".join(
            f"{_gib(d.used_mib or 0)} on {d.uuid}, where its share comes with {_gib(d.entitled_mib)}" for d in over
        )
        why = f"Your {_server(h)} server uses more GPU memory than its share: {uses}."
        stop_at = self.memory.stop_at(h.name, policy)
        at = left = None
        if stop_at is None:
            why += " Other holders of the GPU may run out of memory; please use less."
        else:
            seconds = max(0.0, stop_at - self.clock())
            left, at = round(seconds), _iso(self.wall() + seconds)
            why += f" It will be stopped at {at} unless it uses less by then."
        return [{"server": h.held.server, "reason": MEMORY, "stop_at": at, "seconds_left": left, "message": why}]

    def _notice(self, h: Holding, n: Notice) -> dict:
        left = max(0.0, n.stop_at - self.clock())
        at = _iso(self.wall() + left)
        server = _server(h)
        if n.reason == IDLE:
            why = f"Your {server} server has not used its GPU for a while; it will be stopped at {at} unless its GPU is used before then."
        elif n.reason == BUDGET:
            why = f"Your {server} server has used what your weekly GPU budget had left; it will be stopped at {at}."
        else:
            why = f"Your {server} server has held its GPU for as long as allowed; it will be stopped at {at}."
        return {
            "server": h.held.server,
            "reason": n.reason,
            "stop_at": at,
            "seconds_left": round(left),
            "message": why,
        }

    def activity(self, name: str) -> dict:
        """A holder's last GPU activity (UTC) and idle time, for admins."""
        last = self.timers.last_active(name)
        idle = self.timers.idle_for(name)
        return {
            "last_gpu_activity": None if last is None else _iso(self.wall() - (self.clock() - last)),
            "idle_seconds": None if idle is None else round(idle),
        }

    def idle_now(self) -> list[dict]:
        """The holders idle now, longest first: for ``gpuspawner idle``."""
        rows = []
        for name, h in self.holdings.all().items():
            idle = self.timers.idle_for(name)
            if idle is not None and h.held.uuids:
                notices = self.timers.notices(name)
                rows.append(
                    dict(
                        user=h.user,
                        server=h.held.server,
                        host=h.held.host,
                        devices=list(h.held.uuids),
                        warned=bool(notices),
                        **self.activity(name),
                    )
                )
        return sorted(rows, key=lambda r: -r["idle_seconds"])

    def memory_readings(self) -> list[tuple[tuple[str, str, str, str, str], int | None, int]]:
        """Each running holder's last reading of each device it holds, for the per-holder
        gauges (metrics.HolderMemoryGauges): (user, server, model, host, uuid), the MiB
        its own processes use there (None: not known) and the MiB its share there comes with."""
        rows = []
        for name in self.memory.holders():
            h = self.holdings.get(name)
            if h is None or not self._current(h):
                continue
            for uuid in h.held.uuids:
                d = self.memory.reading(name, uuid)
                if d is not None:
                    rows.append(((h.user, h.held.server, h.held.model, h.held.host, uuid), d.used_mib, d.entitled_mib))
        return rows

    def with_activity(self, uuid: str, holder: dict) -> dict:
        """The map's holder, with its GPU activity once a reading has told it, and its
        memory on the device against its share's (MIG slices, CPU-only and not yet read
        holders are shown as before)."""
        for name, h in self.holdings.all().items():
            if h.user == holder.get("user") and h.held.server == holder.get("server") and uuid in h.held.uuids:
                shown = dict(holder, **self.activity(name)) if self.timers.read(name) else dict(holder)
                reading = self.memory.reading(name, uuid)
                if reading is not None:
                    over = any(d.uuid == uuid for d in self.memory.over_devices(name))
                    shown.update(used_mib=reading.used_mib, entitled_mib=reading.entitled_mib, memory_over=over)
                return shown
        return holder
