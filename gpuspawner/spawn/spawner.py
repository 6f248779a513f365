"""GPUSwarmSpawner: dockerspawner's SwarmSpawner, with GPUs that are tracked.

A thin adapter from JupyterHub's calls to the hub's holdings
(:mod:`gpuspawner.holdings.holdings`). One start: validate the user's options, reserve
devices, create the service with ``NVIDIA_VISIBLE_DEVICES`` and a
``node.hostname`` constraint, and wait (with a timeout) for its task to run;
on any failure, or a cancel, remove the service, and the devices come back
once its task has ended. ``stop`` and ``poll`` end a holding the same way.
The GPU settings are in :mod:`gpuspawner.hub.settings`, the form in
:mod:`gpuspawner.spawn.form`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import docker.errors
from docker.utils import parse_bytes
from dockerspawner import SwarmSpawner
from jupyterhub.spawner import SpawnException
from traitlets import default

from .. import hub_port, metrics
from ..allocator.allocator import AllocationRefused, Request
from ..cluster.constraints import eligible
from ..cluster.service_spec import admin_conflicts, admin_constraints, build_service, task_resources
from ..cluster.swarm import TASK_FAILED, TASK_WAITING, SwarmError
from ..core.access import Access
from ..core.budget import Budget, hours_allowed, request_refusal
from ..core.budget import refusal as budget_refusal
from ..core.line_order import fmt_duration
from ..core.options import OptionsError, options_from_form, parse_user_options
from ..core.requests import ALL
from ..core.sharing import UNIT, fmt_list
from ..core.topology import numa_env
from ..holdings.holdings import Holding, HoldingBusy, Holdings
from ..holdings.ports import NoPortFree
from ..hub.app import GPUHub, HubConfigError
from ..hub.logs import LOGGED_BY_SPAWNER
from ..hub.settings import GPUSettings, validate_config
from ..ledger.ledger import LedgerError
from ..line.wait import extend_start_timeout, lasts_of, refused_out_of_line, reserve_or_wait
from ..reclaim.settings import ReclaimSettings
from .errors import CONFLICT, NOT_NOW, NOT_RESERVED, STALE, spawn_error
from .form import render_form
from .kept import asked, goes_first, keep_for, why_kept
from .progress import Progress
from .rules import access_of, budget_for_form, budget_of, groups_of

__all__ = ["GPUSwarmSpawner", "spawn_error", "validate_config"]

HOST_NETWORK = "host"


def _read_at_start(spawner, user_options) -> None:
    """JupyterHub's apply_user_options hook: nothing to apply before start()."""


class GPUSwarmSpawner(GPUSettings, ReclaimSettings, SwarmSpawner):
    """Spawn each server as a swarm service on a host with the GPUs the user chose."""

    task_node: str = ""  # the node the server's task runs on
    gpu_budget_hours: float | None = None  # how long it may hold its GPUs within its user's weekly budget
    _cancelled_removal: asyncio.Future | None = None  # a cancelled spawn's removal, kept from the collector

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._progress = Progress()  # for the spawn page

    @default("options_form")
    def _default_options_form(self):
        return GPUSwarmSpawner._render_options_form

    def options_from_form(self, formdata):
        """The form's fields as user_options (core/options.py). A method, not the trait's
        default: dockerspawner 12 defines a method of this name, which would shadow a
        default and take only its own ``image`` field."""
        return options_from_form(formdata)

    @default("apply_user_options")
    def _default_apply_user_options(self):
        # The options are read in start(), where they are checked against the
        # inventory and the user's limit at every spawn (stored options too).
        return _read_at_start

    # -- the hub's holdings ---------------------------------------------------

    @property
    def host_network(self) -> bool:
        return self.network_name == HOST_NETWORK

    @property
    def gpu_hub(self) -> GPUHub:
        """The hub's one owner of GPU state (every spawner and endpoint of the hub gets the same one)."""
        return GPUHub.of_spawner(self)

    def holdings(self) -> Holdings:
        """The hub's holdings (no swarm call)."""
        try:
            return self.gpu_hub.holdings
        except HubConfigError as exc:
            self.log.error("%s", exc)
            raise spawn_error(
                "GPU servers are unavailable: the hub's GPU configuration is invalid. Please tell an admin.",
                reason="gpu_config",
                log_message=str(exc),
                status_code=500,
            ) from exc

    async def _up_to_date(self) -> Holdings:
        """The holdings with fresh node status; at the hub's first use, rebuilt
        from what the swarm runs and what the ledger has open."""
        self.holdings()  # a hub whose GPU settings cannot work: the message above
        try:
            return await self.gpu_hub.up_to_date()
        except SwarmError as exc:
            raise spawn_error(
                "The cluster cannot be reached right now; please try again in a minute.",
                reason="swarm_unreachable",
                log_message=str(exc),
                status_code=503,
            ) from exc

    async def _render_options_form(self) -> str:
        error = ""
        try:
            holdings = await self._up_to_date()
            if any(self._reserves()):  # the counts say what a server reserving that can have
                await holdings.cluster.read_reservations(holdings.swarm, self.log)
        except SpawnException as exc:
            error, holdings = exc.message, self.holdings()
        access = self._access()
        budget = await budget_for_form(self, holdings, access)
        keeper = quotas = None
        if not error:
            keeper, quotas = self.gpu_hub.reservations, self.gpu_hub.quotas
            await keeper.refresh()
        return render_form(self, holdings, error, access, budget, keeper, quotas)

    def _access(self) -> Access:
        """What this user may have under ``gpu_access``, from their JupyterHub
        groups as they are now (read at each spawn and form)."""
        return access_of(self)

    # -- start -------------------------------------------------------------

    def _report(self, message: str, progress: int | None = None) -> None:
        self._progress.report(message, progress)

    async def progress(self):
        async for event in self._progress.follow(lambda: self.pending == "spawn"):
            yield event

    def _request(self, holdings: Holdings, access: Access) -> tuple[Request | None, bool]:
        """The user's options as an allocator request (None: CPU-only), and
        whether it may wait in line; 400 when invalid, 403 when the user's
        access rules forbid it (such a request never enters a line)."""
        models = [m.model for m in holdings.allocator.summary()]
        forbidden = access.refusal(self.user_options, models)
        if forbidden:
            metrics.REFUSED.labels("access").inc()
            raise spawn_error(forbidden, reason="gpu_access", status_code=403)
        try:
            options = parse_user_options(
                self.user_options,
                models=access.offered(models),
                hosts=holdings.allocator.hosts(),
                max_count=access.max_gpus,
                allow_host_choice=self.allow_host_choice,
                sharing=self.gpu_sharing,
                classes=self.model_classes(),
            )
        except OptionsError as exc:
            raise spawn_error(str(exc), reason="invalid_options", status_code=400) from exc
        if options.cpu_only:
            return None, False
        request = Request(
            model=options.model,
            count=options.count,
            host=options.host,
            owner=self.user.name,
            milli=options.milli,
            models=options.models,
        )
        return self._with_reservations(request), options.wait

    def model_classes(self) -> dict[str, list[str]]:
        """``gpu_model_classes`` with each model as the inventory names it (its alias, if any)."""
        aliases = self.gpu_model_aliases
        return {name: [aliases.get(m, m) for m in members] for name, members in self.gpu_model_classes.items()}

    def _around_lines(self, request: Request, kept: frozenset[str]) -> Request:
        """A request for any of several models, placed around their lines (backfill): on
        hosts that the lines of those models keep for none of their waiters (a host kept
        for one model's waiter is kept from the others too: its CPU and memory are that
        waiter's). A model whose line keeps every host (strict order) is left to its
        waiters; a refusal naming the lines when that leaves none."""
        if request.models is None:
            return replace(request, avoid=kept)
        line, lasts = self.gpu_hub.line, lasts_of(self)
        models, avoid = [], set(kept)
        for model in request.models:
            hosts = line.kept(model, lasts) if line.waiting_for(model) else frozenset()
            if hosts is not None:
                models.append(model)
                avoid |= hosts
        if not models:
            raise spawn_error(
                f"Requests are waiting in line for each of {', '.join(request.models)}; ask for one model "
                "with gpu_wait to wait in its line, or try again later.",
                reason="gpu_unavailable",
                status_code=NOT_NOW,
            )
        return replace(request, models=tuple(models), avoid=frozenset(avoid))

    def _with_reservations(self, request: Request) -> Request:
        """The request with what the service reserves besides GPUs (``cpu_guarantee``,
        ``mem_guarantee``, or ``extra_resources_spec``'s reservations): it is placed
        only where the node has that free."""
        cpu_milli, memory_mib = self._reserves()
        return replace(request, cpu_milli=cpu_milli, memory_mib=memory_mib)

    def _reserves(self) -> tuple[int, int]:
        """(CPU thousandths, memory MiB) the service reserves, as its spec will say (the
        admin's ``extra_task_spec`` may replace the spawner's resources)."""
        reserved = task_resources(self._resources(), self.extra_task_spec).get("Reservations") or {}
        cpu, mem = reserved.get("NanoCPUs"), reserved.get("MemoryBytes")
        if isinstance(mem, str):
            try:
                mem = parse_bytes(mem)
            except docker.errors.DockerException:
                mem = None  # the swarm refuses it when the service is created, with its message
        cpu_milli = -(-int(cpu) // 10**6) if isinstance(cpu, (int, float)) and cpu > 0 else 0
        memory_mib = -(-int(mem) // 2**20) if isinstance(mem, (int, float)) and mem > 0 else 0
        return cpu_milli, memory_mib

    def _line_priority(self) -> int:
        """This user's priority in a model's line (higher goes first): the
        most generous of their groups' ``priority`` in ``gpu_access``."""
        return self._access().priority

    def run_pre_spawn_hook(self):
        # JupyterHub's start_timeout timer starts after this hook: a spawn that
        # may wait in line gets gpu_wait_timeout more (the wait has its own limit).
        extend_start_timeout(self)
        return super().run_pre_spawn_hook()

    async def start(self):
        try:
            return await self._start()
        except SpawnException as exc:
            if exc.reason in LOGGED_BY_SPAWNER:
                # An answer, not a fault: this one line, below ERROR; the hub leaves
                # out JupyterHub's own lines about it (hub/logs.py).
                who = f"{self.user.name}/{self.name}" if self.name else self.user.name
                self.log.info("gpuspawner: %s refused (%s, %s): %s", who, exc.reason, exc.status_code, exc.log_message)
            raise

    async def _start(self):
        self._progress.clear()
        name = self.service_name
        self.holdings()  # a hub whose GPU settings cannot work: the message above
        line = self.gpu_hub.line
        async with refused_out_of_line(line, name):
            holdings = await self._up_to_date()
            access = self._access()
            request, wait = self._request(holdings, access)
            budget = await self._within_budget(holdings, access) if request is not None else None
            settings = await self._admin_settings()
            # A service left by an earlier run of this server (a killed hub, a
            # failed stop) may still run on its GPUs: it goes first.
            if not await self._remove(holdings):
                raise spawn_error(STALE, reason="stale_service", status_code=503)
        first = True

        async def reserve(avoid: Callable[[], frozenset[str] | None]) -> Holding:
            nonlocal first, budget
            if any(self._reserves()):  # what the nodes' other services reserve, read fresh
                await holdings.cluster.read_reservations(holdings.swarm, self.log)
            if request is not None and request.models is not None:
                for model in request.models:
                    await line.clear_unowned(model)  # a row past its deadline does not hold its model
            if request is not None and not first:  # served from the line: the wait may have used the budget up
                budget = await self._within_budget(holdings, access)
            first = False
            if request is not None:
                await self.gpu_hub.reservations.refresh()  # read at most every half minute
            # No await from here to the booking: a concurrent spawn of this user counts it, and
            # nobody can join a line that an any-of request's models are checked against.
            # The hosts kept for those ahead in line, as they are now (None: every host). A member
            # of a reservation open now for the model, or a request within its group's quota,
            # takes its kept GPUs wherever they are.
            if goes_first(self.gpu_hub, groups_of(self), request):
                kept: frozenset[str] = frozenset()
            else:
                ahead = avoid()
                kept = frozenset(holdings.allocator.hosts()) if ahead is None else ahead
            around = request if request is None else self._around_lines(request, kept)
            self.gpu_budget_hours = self._budget_hours(budget, around, access)
            holding = await self._reserve(holdings, around, access.max_gpus, wait, settings)
            if around is not None and around.models is not None and line.waiting_for(holding.held.model):
                line.went_ahead(holding.held.model, holding)  # served around that model's line: shown to its waiters
            return holding

        member = False  # of a reservation whose open window keeps this model, or within a quota: goes first
        if request is not None and request.model is not None:
            await self.gpu_hub.reservations.refresh()
            member = goes_first(self.gpu_hub, groups_of(self), request)
        holding = await reserve_or_wait(
            self, line, request and request.model, wait, reserve, spawn_error, member, request
        )
        if self.gpu_budget_hours is not None:
            self._report(
                f"Your weekly GPU budget lets it hold its GPUs for {fmt_duration(self.gpu_budget_hours * 3600)}", 25
            )
        try:
            if holding.held.port is not None:
                self.port = holding.held.port
            try:
                service = await holdings.create(name, await self._service_spec(holding, settings))
            except SwarmError as exc:
                raise spawn_error(
                    f"The server's service could not be created: {exc}", reason="service_create", status_code=500
                ) from exc
            self.object_id = service.get("ID", "")
            self._report("Service created", 40)
            await self.start_object()
            try:
                return await self.get_ip_and_port()
            except SwarmError as exc:
                raise spawn_error(
                    "The server's address could not be found; please try again.",
                    reason="service_address",
                    log_message=str(exc),
                    status_code=503,
                ) from exc
        except asyncio.CancelledError:
            # JupyterHub's DELETE on a pending server cancels the spawn, gives
            # it 1 s, then calls stop() (a 500 if the spawn is still pending).
            # The removal waits for the container to exit, so it goes on in the
            # background; stop() waits for it on the holding's lock, and the
            # GPUs stay reserved until no task of the service can run.
            self._cancelled_removal = asyncio.ensure_future(self._remove(holdings))
            self._cancelled_removal.add_done_callback(self._removal_done)
            raise
        except BaseException:
            await asyncio.shield(self._remove(holdings))
            raise

    def _removal_done(self, removal: asyncio.Future) -> None:
        """A cancelled spawn's removal ended: an error it met is logged (its GPUs stay
        reserved, and the reconcile loop or stop() finishes the job)."""
        if not removal.cancelled() and removal.exception() is not None:
            self.log.error(
                "Removing the cancelled spawn's service %s failed", self.service_name, exc_info=removal.exception()
            )

    async def _within_budget(self, holdings: Holdings, access: Access) -> Budget | None:
        """The user's weekly budget (None: none); 403 while it is used up or
        spoken for by their running servers."""
        try:
            budget = await budget_of(holdings, self.user.name, access, self.budget_committed)
        except LedgerError as exc:
            message, reason = NOT_RESERVED[LedgerError]
            raise spawn_error(message, reason=reason, log_message=str(exc), status_code=503) from exc
        self._refuse_over(budget)
        return budget

    @staticmethod
    def _refuse_over(budget: Budget | None, gpus: float | None = None) -> None:
        if budget is None:
            return
        over = budget_refusal(budget) if gpus is None else request_refusal(budget, gpus)
        if over:
            metrics.REFUSED.labels("budget").inc()
            raise spawn_error(over, reason="gpu_budget", status_code=403)

    def budget_committed(self) -> float:
        """GPU-hours the user's other servers may still use up to their time limits."""
        return self.gpu_hub.reclaimer.may_still_use(self.user.name, exclude=self.service_name)

    def _budget_hours(self, budget: Budget | None, request: Request | None, access: Access) -> float | None:
        """How long this server may hold its GPUs within ``budget`` (docs/access.md),
        counting the user's other servers as they are now; None: its own limits hold."""
        self.gpu_budget_hours = None  # reclaim_limits() below: its own limits, not an earlier run's
        if budget is None or request is None:
            return None
        budget = budget._replace(committed=self.budget_committed())
        if request.milli is not None:
            gpus = request.milli / UNIT
        else:  # ALL: at most the user's limit
            gpus = max(1, access.max_gpus) if request.count == ALL else int(request.count)
        self._refuse_over(budget, gpus)
        max_held = self.reclaim_limits().max_held
        return hours_allowed(budget, gpus, None if max_held is None else max_held / 3600)

    async def _reserve(
        self,
        holdings: Holdings,
        request: Request | None,
        limit: int,
        waiting: bool = False,
        settings: dict | None = None,
    ) -> Holding:
        if (
            request is None
            and self.gpu_place_cpu_only
            and settings is not None
            and holdings.allocator.resources.known()
        ):
            # A server without GPUs, placed by the allocator among the nodes the admin's constraints
            # allow (where the swarm says nothing of its nodes' resources, the swarm places it).
            allowed = admin_constraints(
                settings["extra_placement_spec"], settings["extra_task_spec"], settings["extra_create_kwargs"]
            )
            hosts = eligible(allowed, holdings.cluster.nodes.values())
            # Not on a host kept for a GPU waiter: its CPU and memory would delay that start.
            kept = self.gpu_hub.line.kept_by_any(lasts_of(self))
            request = self._with_reservations(Request(count=0, owner=self.user.name, hosts=hosts, avoid=kept))
        keeper = self.gpu_hub.reservations
        groups = groups_of(self)
        gpus = request is not None and (request.milli is not None or request.count != 0)
        try:
            holding = await holdings.reserve(
                self.service_name,
                self.user.name,
                self.name,
                request,
                max_per_owner=limit,
                policy=self.allocation_policy,
                port_range=self.host_network_ports if self.host_network else None,
                keep_free=keep_for(self.gpu_hub, groups, request, self.service_name) if gpus else None,
                kept_why=why_kept(self.gpu_hub, groups, request),
            )
        except AllocationRefused as exc:
            if not (waiting and exc.retry):  # a waiting request is refused again at each look
                metrics.REFUSED.labels("capacity" if exc.retry else "request").inc()
            reason = "gpu_unavailable" if exc.retry else "gpu_request"
            message = exc.message
            if exc.retry and not waiting and request is not None and request.model is not None:
                if self.gpu_hub.quotas.within(groups, request.model, asked(request)):  # waiting would get it back
                    hint = self.gpu_hub.quotas.refusal(request.model, groups, asked(request)) or ""
                    message += "" if hint in message else " " + hint
            raise spawn_error(message.strip(), reason=reason, status_code=exc.status) from exc
        except (HoldingBusy, NoPortFree, LedgerError) as exc:
            message, reason = next(v for k, v in NOT_RESERVED.items() if isinstance(exc, k))
            self.log.error("Not reserved for %s: %s", self.service_name, exc)
            raise spawn_error(message, reason=reason, log_message=str(exc), status_code=503) from exc
        c = holding.held
        if c.uuids:
            metrics.GRANTED.labels(c.model).inc()
            what = f"{fmt_list(c.milli, ' + ')} of" if c.shared else f"{len(c.uuids)} ×"
            self._report(f"Reserved {what} {c.model} on {c.host}", 20)
            for later in (keeper.notice_at_grant(holding), self.gpu_hub.quotas.notice_at_grant(holding)):
                if later:
                    self._report(later, 20)
            await self.gpu_hub.quotas.record(holding)  # (within or borrowed, for the ledger's usage)
        return holding

    async def _remove(self, holdings: Holdings) -> bool:
        """Remove this server's service; True once no task of it can run
        (its GPUs are then back). False: it stays reserved, and says why."""
        try:
            return await holdings.remove(self.service_name)  # an idle reclaim's stop names its own reason
        except SwarmError as exc:
            self.log.error("Could not remove service %s: %s", self.service_name, exc)
            return False

    async def _admin_settings(self) -> dict:
        """The admin's settings that go into the service, evaluated. One that
        could only conflict with what gpuspawner guarantees (validate_config
        refuses it at hub start) fails the spawn before any GPU is reserved."""
        settings = await hub_port.admin_settings(self)
        conflicts = admin_conflicts(settings)
        if conflicts:
            detail = "gpuspawner configuration error: " + "; ".join(conflicts)
            self.log.error("Not spawning %s: %s", self.service_name, detail)
            raise spawn_error(CONFLICT, reason="gpu_config", log_message=detail, status_code=500)
        return settings

    async def _service_spec(self, holding: Holding, settings: dict) -> dict:
        allocator = self.holdings().allocator
        env, mounts = self.share_enforcement_for(holding.held, allocator)
        env = {**env, **numa_env(allocator.topology(holding.held.host), holding.held.uuids)}
        publish = None if (self.use_internal_ip or self.host_network) else self.port
        return build_service(
            name=self.service_name,
            image=self.image,
            command=await self.get_command(),
            env=self.get_env(),
            holding=holding.held,
            network=self.network_name,
            publish_port=publish,
            mounts=self.mounts,
            enforcement=(env, mounts),
            driver_capabilities=self.nvidia_driver_capabilities,
            resources=self._resources(),
            extra_container=settings["extra_container_spec"],
            extra_placement=settings["extra_placement_spec"],
            extra_task=settings["extra_task_spec"],
            extra_endpoint=self.extra_endpoint_spec,
            extra_create=settings["extra_create_kwargs"],
        )

    def _resources(self) -> dict:
        resources = dict(
            mem_limit=self.mem_limit,
            mem_reservation=self.mem_guarantee,
            cpu_limit=int(self.cpu_limit * 1e9) if self.cpu_limit else None,
            cpu_reservation=int(self.cpu_guarantee * 1e9) if self.cpu_guarantee else None,
        )
        resources.update(self.extra_resources_spec)
        return resources

    async def start_object(self):
        """Wait for the service's task to run: bounded, and stopping at the
        first rejected or failed task with the reason the swarm gives. Every
        task seen is remembered: the GPUs are free only once it has ended."""
        holdings = self.holdings()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.task_start_timeout
        delay, last = 0.1, "no task yet"
        while True:
            try:
                tasks = await holdings.swarm.tasks(self.service_name)
            except SwarmError as exc:
                raise spawn_error(
                    "The server's service could not be followed while it started; please try again.",
                    reason="task_lookup",
                    log_message=str(exc),
                    status_code=503,
                ) from exc
            if tasks:
                await holdings.note_tasks(self.service_name, [t["ID"] for t in tasks])
                status = tasks[0].get("Status", {})
                state = status.get("State", "")
                node = self._hostname_of(tasks[0].get("NodeID", ""))
                if state == "running":
                    self.task_node = node
                    self._report(f"Task running on {node}", 60)
                    return
                why = status.get("Err") or status.get("Message") or state
                if state in TASK_FAILED:
                    raise spawn_error(
                        f"The server could not start on {node or 'its node'}: {why} (task {state})",
                        reason="task_failed",
                        status_code=500,
                    )
                last = f"{state}: {why}"
            if loop.time() >= deadline:
                raise spawn_error(
                    f"The server did not start within {self.task_start_timeout} s (last task state: {last})",
                    reason="task_timeout",
                    status_code=504,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    def _hostname_of(self, node_id: str) -> str:
        return self.holdings().cluster.hostname_of(node_id) or node_id[:12]

    async def _node_addr(self, hostname: str) -> str:
        cluster = self.holdings().cluster
        addr = cluster.node_addr(hostname)
        if not addr:
            await self._up_to_date()  # the node may have joined after the last refresh
            addr = cluster.node_addr(hostname)
        if not addr:
            raise spawn_error(f"The address of node {hostname} is unknown", reason="node_address", status_code=500)
        return addr

    async def get_command(self):
        cmd = self.cmd or await self.holdings().swarm.image_command(self.image)
        return cmd + self.get_args()

    async def get_ip_and_port(self):
        if self.host_network:
            return await self._node_addr(self.task_node), self.port
        if self.use_internal_hostname or self.use_internal_ip:
            return self.service_name, self.port
        service = await self.holdings().swarm.service(self.service_name)  # the port swarm published
        for port in service.get("Endpoint", {}).get("Ports") or []:
            if port.get("TargetPort") == self.port:
                return self.host_ip, port["PublishedPort"]
        raise spawn_error(
            f"The server's published port {self.port} was not found", reason="service_port", status_code=500
        )

    async def get_url(self):
        """Where the server really listens. With host networking that is its
        node's address and the port in its labels, which a hub killed
        mid-spawn never recorded: a restarted hub checks this URL."""
        if not self.host_network or self.server is None:
            return await super().get_url()
        holdings = await self._up_to_date()
        h = holdings.get(self.service_name)
        if h is None or h.held.port is None:
            return await super().get_url()
        if not self.task_node:
            tasks = await holdings.swarm.tasks(self.service_name)
            self.task_node = self._hostname_of(tasks[0].get("NodeID", "")) if tasks else h.held.host
        self.port = h.held.port
        addr = await self._node_addr(self.task_node)
        return f"{self.server.proto}://{addr}:{h.held.port}{self.server.base_url}"

    # -- stop / poll / state --------------------------------------------------

    async def stop(self, now=False):
        holdings = await self._up_to_date()
        await self.gpu_hub.line.stopped(self.service_name)  # a cancelled wait in line
        if not await self._remove(holdings):
            raise spawn_error(
                f"Your server's service {self.service_name} could not be removed yet; please try again.",
                reason="service_remove",
                status_code=503,
            )
        self.log.info("Removed service %s", self.service_name)
        self.object_id = ""
        self.clear_state()

    async def poll(self):
        """None while the task runs or is on its way; otherwise the server is
        over: its service is removed (JupyterHub does not call stop() for a
        server it found dead) and its GPUs come back once its task has ended."""
        try:
            holdings = await self._up_to_date()  # a restarted hub polls before anything else
            tasks = await holdings.swarm.tasks(self.service_name)
        except SpawnException:
            return None  # the manager cannot be asked: that says nothing about the server
        except SwarmError as exc:
            if not exc.not_found:
                return None  # the manager cannot tell: that says nothing about the server
            await self._remove(holdings)
            return 0
        if not tasks:
            return None  # created, no task yet
        await holdings.note_tasks(self.service_name, [t["ID"] for t in tasks])
        status = tasks[0].get("Status", {})
        state = status.get("State", "")
        down = await self._node_down(tasks[0].get("NodeID", ""))
        if down:
            # The manager may still say "running", but nobody can reach the
            # server. Its service is removed (the node stops the container
            # when it is back); its GPUs stay reserved until the swarm
            # confirms the task ended, and that node is not offered meanwhile.
            await self._remove(holdings)
            return f"node {down} is down"
        if state == "running" or state in TASK_WAITING:
            return None
        await self._remove(holdings)
        return f"task {state}: {status.get('Err') or status.get('Message', '')}"

    async def _node_down(self, node_id: str) -> str:
        """The task's node's hostname if the swarm says the node is down, else ''."""
        try:
            cluster = (await self._up_to_date()).cluster
        except SpawnException:
            return ""  # the manager cannot be asked: that says nothing about the node
        hostname = cluster.hostname_of(node_id)
        node = cluster.nodes.get(hostname or "")
        return hostname if node is not None and not node.ready else ""

    def get_state(self):
        state = super().get_state()
        if self.task_node:
            state["gpu_node"] = self.task_node
        if self.gpu_budget_hours is not None:
            state["gpu_budget_hours"] = self.gpu_budget_hours
        return state

    def load_state(self, state):
        super().load_state(state)
        self.task_node = state.get("gpu_node", "")
        hours = state.get("gpu_budget_hours")
        self.gpu_budget_hours = float(hours) if isinstance(hours, (int, float)) else None

    def clear_state(self):
        super().clear_state()
        self.task_node = ""
        self.gpu_budget_hours = None
