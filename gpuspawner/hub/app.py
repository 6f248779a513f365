"""GPUHub: the one owner of the hub's GPU state.

One per hub, built from the hub's config by ``configure(c)`` (or, where the
config does not call it, by the first spawn), and kept in the hub's tornado
settings: handlers reach it as ``self.settings["gpuspawner"]``, spawners as
their user's ``settings["gpuspawner"]``. It owns the cluster and its views,
the holdings and the ledger they write, the waiting line, the idle reclaimer,
the device gauges and the background loops, each given its collaborators when
it is made. The parts are made at first use (the static inventory is read
then, as before: a hub whose inventory cannot be read still serves, and says
why at each spawn); :meth:`start` and :meth:`stop` start and end the loops.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from traitlets import TraitError
from traitlets.config import Config

from .. import hub_port, metrics
from ..allocator.fragment import Mix, Placed
from ..cluster.cluster import GPUCluster, InventorySettings
from ..cluster.service_spec import enforcement_mode
from ..cluster.swarm import Swarm, SwarmError
from ..core.enforcement import missing
from ..core.inventory import InventoryError
from ..core.inventory_files import load_inventory
from ..core.link_classes import parse_link_required
from ..core.quotas import QuotaError, parse_classes, parse_quotas
from ..core.reports import NodeReport
from ..holdings.holdings import Holding, Holdings
from ..holdings.views import holders_of
from ..ledger.ledger import Ledger, LedgerError, default_db_url
from ..line.wait import WaitLine
from ..reclaim.quotas import QuotaKeeper
from ..reclaim.reclaimer import Reclaimer
from ..reclaim.reservations import ReservationKeeper, milli_asked
from ..reclaim.settings import ReclaimSettings
from . import logs
from .database_wait import keep_idle_transaction_ended
from .resume import resume_waiting
from .settings import SPAWNER_SECTIONS, GPUSettings, placement_mix, spawner_values

__all__ = ["KEY", "GPUHub", "HubConfigError", "HubSettings"]

KEY = "gpuspawner"  # the GPUHub's key in the hub's tornado settings
LEARN_DAYS = 14  # the frag policy learns its mix from what servers held this far back
LEARN_SECONDS = 3600.0  # and learns it again this often


class HubConfigError(Exception):
    """The hub's GPU settings cannot work (an inventory or ledger that cannot be read)."""


class HubSettings(GPUSettings, ReclaimSettings):
    """The hub-wide GPU settings, read from the hub's config as its spawners read them."""

    @classmethod
    def from_config(cls, config: Config, sections=SPAWNER_SECTIONS) -> HubSettings:
        """``sections``: the spawner class's config sections, least specific first."""
        names = set(cls.class_trait_names(config=True))
        values = spawner_values(config, sections)
        own = Config({cls.__name__: {k: v for k, v in values.items() if k in names}})
        if "JupyterHub" in config:
            own.JupyterHub = config.JupyterHub
        return cls(config=own)

    def inventory_settings(self) -> InventorySettings:
        spec = self.gpu_inventory
        return InventorySettings(
            static=tuple(load_inventory(spec)) if spec and "static" in self.gpu_inventory_source else (),
            sources=tuple(self.gpu_inventory_source),
            aliases=tuple(sorted(self.gpu_model_aliases.items())),
            stale_intervals=self.agent_stale_intervals,
            max_temperature_c=self.gpu_max_temperature,
            local_host=self.local_gpu_host,
        )

    def ledger_url(self) -> str:
        hub_db = self.config.JupyterHub.get("db_url", "sqlite:///jupyterhub.sqlite")
        return self.gpu_db_url or default_db_url(hub_db, os.getcwd())


class GPUHub:
    """The hub's GPU state and its background loops.

    ``source()`` returns the hub's config and its spawner class (a GPUSwarmSpawner);
    it is read once, at first use, inside the running hub, where every config file
    and the command line have been read (``configure(c)`` runs part-way through
    one of them)."""

    def __init__(
        self,
        source: Callable[[], tuple[Config, type]],
        *,
        log: logging.Logger | logging.LoggerAdapter | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.source = source
        self.log = log or logging.getLogger("JupyterHub")
        self.clock, self.wall = clock, wall
        self._settings: HubSettings | None = None
        self._config: Config | None = None  # with the spawner class, as source() gave them
        self._spawner_class: type | None = None
        self._holdings: Holdings | None = None
        self._line: WaitLine | None = None
        self._reclaimer: Reclaimer | None = None
        self._reservations: ReservationKeeper | None = None
        self._quotas: QuotaKeeper | None = None
        self._mix_read: float | None = None  # when the frag policy's mix was last learned (clock)
        self._mix_from = (0, 0)  # (servers it was learned from, holdings granted then)
        self._gauges: metrics.DeviceGauges | None = None
        self._holder_gauges: metrics.HolderMemoryGauges | None = None
        self._tasks: set[asyncio.Task] = set()
        self._log_undo: Callable[[], None] | None = None  # gpuspawner's loggers back as they were

    @classmethod
    def from_config(cls, config: Config, spawner_class: type, log=None, **clocks) -> GPUHub:
        """The GPUHub of a hub whose spawners are ``spawner_class`` (a GPUSwarmSpawner)."""
        return cls(lambda: (config, spawner_class), log=log, **clocks)

    @property
    def settings(self) -> HubSettings:
        """The hub's GPU settings, read at first use. Raises HubConfigError for a bad value."""
        if self._settings is None:
            config, spawner_class = self.source()
            try:
                self._settings = HubSettings.from_config(config, spawner_class.section_names())
            except TraitError as exc:
                raise HubConfigError(" ".join(str(exc).split())) from exc
            self._spawner_class, self._config = spawner_class, config
        return self._settings

    def enforcement_seen(self, report: NodeReport) -> None:
        """After a node's report: under ``gpu_share_enforcement_missing = "refuse"``, no
        share goes to that node while its agent finds missing what its mode needs."""
        s = self.settings
        if s.gpu_share_enforcement_missing == "refuse":
            why = missing(enforcement_mode(s.gpu_share_enforcement, report.hostname), report.enforcement)
            self.holdings.allocator.set_unenforced(report.hostname, why)

    @classmethod
    def of_spawner(cls, spawner) -> GPUHub:
        """The hub's GPUHub, from the spawner's user's hub settings; made there at
        the first spawn when the hub's config did not call ``configure(c)``."""
        settings = getattr(spawner.user, "settings", None)
        if not isinstance(settings, dict):  # a spawner outside a hub: a hub of its own
            settings = spawner.__dict__.setdefault("_gpuspawner_settings", {})
        hub = settings.get(KEY)
        if hub is None:
            hub = settings[KEY] = cls.from_config(spawner.config, type(spawner), spawner.log)
            if hub_port.running_hub() is not None:
                hub.show_metrics()
        return hub

    def __deepcopy__(self, memo) -> GPUHub:
        # traitlets deep-copies config values (tornado_settings); the hub's state is one.
        return self

    # -- the parts, made at first use ------------------------------------------------

    @property
    def holdings(self) -> Holdings:
        """Raises HubConfigError while the inventory or the ledger's URL cannot work."""
        if self._holdings is None:
            self._make_parts()
        assert self._holdings is not None
        return self._holdings

    @property
    def line(self) -> WaitLine:
        self.holdings  # noqa: B018 - made with the holdings
        assert self._line is not None
        return self._line

    @property
    def reclaimer(self) -> Reclaimer:
        self.holdings  # noqa: B018 - made with the holdings
        assert self._reclaimer is not None
        return self._reclaimer

    @property
    def reservations(self) -> ReservationKeeper:
        self.holdings  # noqa: B018 - made with the holdings
        assert self._reservations is not None
        return self._reservations

    @property
    def quotas(self) -> QuotaKeeper:
        self.holdings  # noqa: B018 - made with the holdings
        assert self._quotas is not None
        return self._quotas

    def _make_parts(self) -> None:
        s = self.settings
        swarm = Swarm(hub_port.docker_connection(self._spawner_class, self._config))
        try:
            cluster = GPUCluster(s.inventory_settings(), holders_of=self._holders_of)
            ledger = Ledger(s.ledger_url())
            quotas = parse_quotas(s.gpu_quotas, s.gpu_model_aliases)
            classes = parse_classes(s.gpu_priority_classes)
        except (InventoryError, LedgerError, QuotaError) as exc:
            raise HubConfigError(str(exc)) from exc
        cluster.allocator.set_sharing(s.gpu_sharing)
        try:
            cluster.allocator.set_mix(placement_mix(s.allocation_policy, s.gpu_placement_mix, s.gpu_model_aliases))
            cluster.allocator.set_link_required(parse_link_required(s.gpu_link_required, s.gpu_model_aliases))
        except ValueError as exc:
            raise HubConfigError(str(exc)) from exc
        holdings = Holdings(
            cluster,
            swarm,
            ledger=ledger,
            name_for=hub_port.service_names(self._spawner_class, self._config),
            stop_timeout=s.server_stop_timeout,
            clock=self.clock,
            on_free=self._devices_back,
        )
        self._reclaimer = reclaimer = Reclaimer(
            holdings,
            limits_for=self._limits_for,
            stop=self._stop_server,
            on_active=self._touch if s.gpu_activity_updates_last_activity else None,
            clock=self.clock,
            wall=self.wall,
        )

        def ends_in(name: str) -> float | None:
            h = holdings.get(name)
            return None if h is None else reclaimer.ends_in(h)

        self._line = WaitLine(
            holdings,
            s.fairshare(),
            groups_of=_groups_of,
            members_of=_members_of,
            backfill=s.gpu_line_backfill,
            ends_in=ends_in,
        )
        self._reservations = ReservationKeeper(
            holdings,
            groups_of=_groups_of,
            stop=self._stop_server,
            ends_in=self._reclaimer.ends_in,
            held_for=self._reclaimer.held_for,
            waiting=lambda: [(w.user, w.model, milli_asked(w.request)) for w in self._line.rows] if self._line else [],
            wall=lambda: datetime.fromtimestamp(self.wall(), timezone.utc),
            clock=self.clock,
        )
        self._quotas = QuotaKeeper(
            holdings,
            quotas,
            classes,
            groups_of=self._reservations.groups,  # (asked of JupyterHub at most every few seconds, for both)
            stop=self._stop_server,
            held_for=self._reclaimer.held_for,
            waiting=self._waiting_in_order,
            waiting_key=lambda: (id(self._line.rows), len(self._line.rows)) if self._line else None,
            reserved=self._reservations.keep_free,
            reservation_members=self._reservations.members_holding,
            wall=lambda: datetime.fromtimestamp(self.wall(), timezone.utc),
            clock=self.clock,
        )
        self._reservations.protected = lambda name: bool((m := self._quotas.mark_of(name)) and m.within)
        self._line.goes_first = self._quotas.waits_within
        self._holdings = holdings

    def _waiting_in_order(self) -> list[tuple[str, str, str, dict]]:
        """(service, user, model, user_options) of each waiter, each model's line in its order."""
        if self._line is None:
            return []
        return [(w.service, w.user, w.model, w.request) for line in self._line.lines().values() for w in line]

    async def up_to_date(self) -> Holdings:
        """The holdings with fresh node status; at first use, rebuilt from what
        the swarm runs and what the ledger has open. Raises HubConfigError, SwarmError."""
        holdings = self.holdings
        await holdings.cluster.refresh(holdings.swarm, self.log)
        if not holdings.rebuilt:
            await holdings.reconcile()
        return holdings

    # -- what the parts are given ----------------------------------------------------

    def _devices_back(self) -> None:
        if self._line is not None:
            self._line.poke()  # the line is served

    def _holders_of(self, uuid: str) -> list[dict]:
        """Who holds a device, as the map shows it: holdings, with GPU activity."""
        if self._holdings is None or self._reclaimer is None:
            return []
        return [self._reclaimer.with_activity(uuid, h) for h in holders_of(self._holdings, uuid)]

    def _limits_for(self, h: Holding):
        """The reclaim limits of the holding's server: its own spawner's (its user's
        rules), else the hub's settings."""
        app = hub_port.running_hub()
        _, spawner = hub_port.user_spawner(app, h.held.user, h.held.server) if app else (None, None)
        return (spawner if isinstance(spawner, ReclaimSettings) else self.settings).reclaim_limits()

    async def _stop_server(self, h: Holding, reason: str) -> bool:
        app = hub_port.running_hub()
        if app is None or not await hub_port.stop_server(app, h.held.user, h.held.server):
            return False
        self.log.info("Stopped %s's server %r: %s", h.user, h.held.server, reason)
        return True

    def _touch(self, h: Holding) -> None:
        app = hub_port.running_hub()
        if app is not None:
            hub_port.touch_activity(app, h.held.user, h.held.server)

    # -- what users see --------------------------------------------------------------

    def why_waiting(self, service: str) -> str:
        """What a waiter waits for, in a sentence: a request within its group's quota, the
        borrowed GPUs taken back for it; else the line's plan (where, and when if known),
        or why it stands behind others."""
        return self.quotas.for_waiter(service) or self.line.plan_text(service) or self.line.why(service)

    def notices_for(self, user) -> list[dict]:
        """For ``c.JupyterHub.template_vars``: the logged-in user's notices."""
        if user is None or getattr(user, "kind", "user") != "user":
            return []
        try:
            return self.notices_of(user.name)
        except HubConfigError:  # a page must render even when the GPU side cannot
            return []

    def notices_of(self, user: str) -> list[dict]:
        """The user's notices (idle, held-time and memory limits, reservations, quotas), soonest first."""
        notices = self.reclaimer.notices_for(user) + self.reservations.notices_for(user) + self.quotas.notices_for(user)
        return sorted(notices, key=lambda n: (n["stop_at"] is None, n["stop_at"] or ""))

    # -- metrics and background loops -----------------------------------------------

    def show_metrics(self) -> None:
        """The device gauges at the hub's /metrics, read from this hub's cluster, and
        (with ``gpu_metrics_per_holder``) each holder's memory, from its reclaimer."""
        if self._gauges is None:
            self._gauges = metrics.DeviceGauges(
                lambda: self.holdings.cluster, per_host=lambda: self.settings.gpu_metrics_per_host
            )
            if not metrics.show(self._gauges):
                self.log.warning("gpuspawner: another hub in this process shows its devices at /metrics")
        if self._holder_gauges is None:
            self._holder_gauges = self.holder_gauges()
            metrics.show(self._holder_gauges)

    def holder_gauges(self) -> metrics.HolderMemoryGauges:
        """Each holder's GPU memory per device, as /metrics shows it (``gpu_metrics_per_holder``)."""
        return metrics.HolderMemoryGauges(
            lambda: self.reclaimer.memory_readings(), enabled=lambda: self.settings.gpu_metrics_per_holder
        )

    def start(self) -> None:
        """Start the background loops (in the hub's event loop) and the gauges; gpuspawner's
        modules log through the hub's logger until :meth:`stop` (hub/logs.py)."""
        if self._log_undo is None:
            self._log_undo = logs.log_through_hub(self.log)
            self._spawn_task(_until_cancelled(self._log_undo))  # also undone if the loop ends first
        self.show_metrics()
        loops = (self._keep_reconciling(), metrics.watch_event_loop(), self._keep_reclaiming())
        for job in (*loops, keep_idle_transaction_ended(hub_port.hub_session)):
            self._spawn_task(job)

    async def stop(self) -> None:
        """End the background loops (and a read of the nodes' reservations) and hide the gauges."""
        reading = self._holdings.cluster.reading if self._holdings is not None else None
        tasks = [*self._tasks, *([reading] if reading is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._gauges is not None:
            metrics.hide(self._gauges)
            self._gauges = None
        if self._holder_gauges is not None:
            metrics.hide(self._holder_gauges)
            self._holder_gauges = None
        if self._log_undo is not None:
            self._log_undo()
            self._log_undo = None

    async def _keep_reconciling(self) -> None:
        """At hub start, and then every ``reconcile_interval`` seconds, make the
        GPU holdings match the services the swarm runs (see Holdings.reconcile)."""
        first = True
        while True:
            try:
                holdings = await self.up_to_date()  # the first use rebuilds holdings from the swarm
                if first:
                    self._spawn_task(self._resume(holdings))  # the spawns waiting in line when the hub stopped
                    await holdings.cluster.views.warm_counts()  # the first metrics scrape finds them made
                else:
                    await holdings.reconcile(_untracked)
                    await self.line.record_leaves()  # rows the ledger could not drop when their wait ended
                await self._learn_mix(holdings)
                first = False
            except SwarmError as exc:
                self.log.warning("GPU reconciliation: the swarm could not be asked: %s", exc)
            except Exception as exc:  # never let the loop die; say what happened in one line
                self.log.error("GPU reconciliation failed: %s", getattr(exc, "message", exc))
            interval = self._every("reconcile_interval")
            if interval <= 0:
                return
            await asyncio.sleep(interval)

    async def _keep_reclaiming(self) -> None:
        """Every ``gpu_reclaim_interval`` seconds, warn and stop where limits say so."""
        while True:
            try:
                await self.reclaimer.check()
            except Exception as exc:  # never let the loop die; say what happened in one line
                self.log.error("GPU idle reclaim failed: %s", getattr(exc, "message", exc))
            try:
                await self.reservations.check()
            except Exception as exc:
                self.log.error("Making room for GPU reservations failed: %s", getattr(exc, "message", exc))
            try:
                await self.quotas.check()
            except Exception as exc:
                self.log.error("Taking borrowed GPUs back for quotas failed: %s", getattr(exc, "message", exc))
            await asyncio.sleep(self._every("gpu_reclaim_interval"))

    async def _learn_mix(self, holdings: Holdings) -> None:
        """For frag without a configured mix: the mix of what servers held over the last
        LEARN_DAYS (the ledger), read every LEARN_SECONDS, and sooner while the ledger is
        young: once as many servers were granted since as it was learned from (a mix
        learned from few servers is a poor guess; a hub with weeks of history never
        doubles them within the hour). When the ledger cannot answer, the mix last
        learned stays."""
        s = self.settings
        if s.allocation_policy != "frag" or s.gpu_placement_mix:
            return
        learned_from, granted = self._mix_from
        doubled = holdings.granted - granted >= max(1, learned_from)
        if self._mix_read is not None and self.clock() - self._mix_read < LEARN_SECONDS and not doubled:
            return
        granted = holdings.granted
        since = datetime.fromtimestamp(self.wall(), timezone.utc) - timedelta(days=LEARN_DAYS)
        try:
            records = await holdings.ledger_call(lambda db: db.history(since=since)) or []
        except LedgerError as exc:
            self.log.warning("gpuspawner: the frag policy keeps the mix it knows: %s", exc)
            return
        mix = Mix.learned(Placed(r.model, r.milli, r.cpu_milli, r.memory_mib, r.accepts) for r in records)
        holdings.allocator.set_mix(mix)
        self._mix_read, self._mix_from = self.clock(), (len(records), granted)
        shapes = 0 if mix is None else len(mix.shapes)
        self.log.info("gpuspawner: frag places by %d kinds of request from %d servers", shapes, len(records))

    def _every(self, name: str) -> float:
        """A loop's interval: its setting, or its default while the settings cannot be read."""
        try:
            return getattr(self.settings, name)
        except HubConfigError:
            return HubSettings.class_traits()[name].default_value

    def _spawn_task(self, job) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    async def _resume(self, holdings: Holdings) -> None:
        try:
            await resume_waiting(self.line, holdings)
        except Exception as exc:  # the hub runs on; say what happened in one line
            self.log.error("Resuming the spawns waiting in line failed: %s", getattr(exc, "message", exc))


async def _until_cancelled(then: Callable[[], None]) -> None:
    """Wait until cancelled (the hub stops, or its event loop ends), then call ``then``."""
    try:
        await asyncio.Event().wait()
    finally:
        then()


def _groups_of(user: str) -> list[str] | None:
    """The user's JupyterHub groups now; None outside a running hub or for an unknown user."""
    app = hub_port.running_hub()
    return None if app is None else hub_port.user_groups(app, user)


def _members_of(group: str) -> list[str] | None:
    """The members of a JupyterHub group now; None outside a running hub or for an unknown group."""
    app = hub_port.running_hub()
    return None if app is None else hub_port.group_members(app, group)


def _untracked(user: str, server: str) -> bool:
    """True when the running hub has no such server running or starting."""
    app = hub_port.running_hub()
    if app is None:
        return False
    found, spawner = hub_port.user_spawner(app, user, server)
    return found is None or spawner is None or not spawner.active
