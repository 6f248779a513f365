"""GPUSwarmSpawner: dockerspawner's SwarmSpawner, with GPUs that are tracked.

The flow of one start: validate the user's options, reserve devices with the
process-wide allocator, create the service with ``NVIDIA_VISIBLE_DEVICES`` and
a ``node.hostname`` constraint, wait (with a timeout) for its task to run, and
on any failure remove the service and give the devices back. ``stop`` and
``poll`` give them back when the server ends.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import socket
from fractions import Fraction

import jinja2
from dockerspawner import SwarmSpawner
from jupyterhub.spawner import SpawnException
from traitlets import Bool, Dict, Enum, Float, Integer, List, TraitError, Tuple, Unicode, Union, default, validate

from .allocator import POLICIES, AllocationRefused, Request
from . import metrics
from .cluster import SOURCES, GPUCluster, InventorySettings
from .inventory import MODEL_RE, InventoryError, load_inventory
from .ledger import Ledger, LedgerError, default_db_url
from .options import OptionsError, options_from_form, parse_user_options
from .service_spec import (
    ENFORCEMENT_MODES,
    HAMI_LIBRARY,
    MPS_PIPE_DIR,
    Holding,
    build_service,
    enforcement_mode,
    share_enforcement,
    visible_devices,
)
from .sharing import SharingPolicy, fmt, fmt_list, to_milli
from .swarm import TASK_FAILED, TASK_WAITING, Swarm, SwarmError

__all__ = ["GPUSwarmSpawner"]

HOST_NETWORK = "host"


# What a share means on the GPU, in the form, by enforcement mode (see docs/sharing.md).
SHARE_NOTES = {
    "none": "A share is shared with other users' servers without isolation: "
            "each server can still use all of the GPU's memory and compute, so keep to your share.",
    "mps": "Your share's memory and compute are enforced by CUDA MPS on the GPU.",
    "hami": "Your share's memory and compute are enforced on the GPU (HAMi-core).",
}
MAX_SHARE_CHOICES = 20


def _share_choices(summary, room) -> list[str]:
    """The shares the form offers: each shareable model's list, or multiples of
    its quantum up to what one device (or, with split, the user's limit) allows."""
    out: set[int] = set()
    for m in summary:
        if not m.shareable or m.largest_share <= 0 or room <= 0:
            continue
        if m.shares:
            out.update(to_milli(x) for x in m.shares if x <= room)
            continue
        top = min(room, m.largest_share if not m.split else room)
        n = int(top / m.quantum)
        step = max(1, -(-n // MAX_SHARE_CHOICES))
        out.update(to_milli(m.quantum * k) for k in range(step, n + 1, step))
    return [fmt(x) for x in sorted(out)]


def spawn_error(message: str, *, reason: str, status_code: int, log_message: str = "") -> SpawnException:
    """A SpawnException whose message is what the user sees, on the form, the
    progress page and the REST API alike (JupyterHub otherwise shows str(exc),
    which carries the status and class name)."""
    exc = SpawnException(message, reason=reason, status_code=status_code, log_message=log_message)
    exc.jupyterhub_message = message
    return exc


@functools.lru_cache(maxsize=8)
def _templates(paths: tuple[str, ...]) -> jinja2.Environment:
    """The admin's template folders first, then gpuspawner's own; autoescaped."""
    loaders = [jinja2.FileSystemLoader(list(paths)), jinja2.PackageLoader("gpuspawner", "templates")]
    return jinja2.Environment(loader=jinja2.ChoiceLoader(loaders), autoescape=True)


class GPUSwarmSpawner(SwarmSpawner):
    """Spawn each server as a swarm service on a host with the GPUs the user chose."""

    gpu_inventory = Union(
        [Dict(), Unicode()],
        default_value={},
        help="""The cluster's GPUs: a dict, or the path of a YAML or JSON file,
        shaped ``{hostname: [{uuid, model, memory_mib, index?}, ...]}``.
        ``model`` is the name NVML reports (e.g. ``NVIDIA A100 80GB PCIe``);
        it is what users see and choose. Empty: CPU-only servers only.""",
    ).tag(config=True)

    gpu_inventory_source = List(
        Enum(list(SOURCES)),
        default_value=["static"],
        help="""Where the GPUs come from, one or more of:
        ``static`` (the ``gpu_inventory`` file or dict), ``agent`` (reports
        that ``gpuspawner-agent`` posts from each node; see the README), and
        ``local`` (NVML in the hub's own process, for a hub on a single GPU
        host). With ``static`` and ``agent`` together, a host listed in the
        static inventory keeps the devices listed there, and its agent's
        reports only say whether they are healthy.""",
    ).tag(config=True)

    gpu_model_aliases = Dict(
        value_trait=Unicode(),
        help="""Friendlier names for GPU models, by the name NVML reports:
        ``{"NVIDIA A100 80GB PCIe": "A100 (80 GB)"}``. A MIG slice is named
        after its GPU (``"A100 (80 GB) · MIG 1g.10gb"``) unless its full name
        has an alias of its own.""",
    ).tag(config=True)

    @validate("gpu_model_aliases")
    def _valid_aliases(self, proposal):
        try:
            _check_aliases(proposal.value)
        except ValueError as exc:
            raise TraitError(str(exc)) from None
        return proposal.value

    gpu_max_temperature = Float(
        90.0,
        help="""GPUs reported hotter than this (°C) are not offered until they
        cool down. Lost GPUs and GPUs with uncorrected ECC errors are never offered.""",
    ).tag(config=True)

    agent_stale_intervals = Float(
        3.0,
        min=1.0,
        help="""A node whose agent has not reported for this many of its
        reporting intervals is not offered (its running servers are left
        alone) until it reports again.""",
    ).tag(config=True)

    local_gpu_host = Unicode(
        help="""With ``gpu_inventory_source`` ``local``: the swarm node the
        hub's own GPUs belong to. Default: this machine's hostname.""",
    ).tag(config=True)

    @default("local_gpu_host")
    def _default_local_gpu_host(self):
        return socket.gethostname()

    gpu_db_url = Unicode(
        "",
        help="""SQLAlchemy URL of the database that keeps the history of GPU
        allocations (who held which devices, from when to when; see
        docs/ledger.md), e.g. the hub's own PostgreSQL. Empty (default): the
        SQLite file ``gpuspawner.sqlite`` beside the hub's SQLite database.""",
    ).tag(config=True)

    def _ledger_url(self) -> str:
        hub_db = self.config.JupyterHub.get("db_url", "sqlite:///jupyterhub.sqlite")
        return self.gpu_db_url or default_db_url(hub_db, os.getcwd())

    reconcile_interval = Integer(
        60,
        min=0,
        help="""Seconds between reconciliations of GPU holdings with the
        services the swarm runs: a labelled service the hub does not track is
        adopted, and the devices of a service that is gone are given back.
        Also done at hub start (with ``gpuspawner.hubconfig.configure``) and by
        the admin's rescan. 0: only at start and on rescan.""",
    ).tag(config=True)

    gpu_sharing = Dict(
        help="""Which GPU models users may ask a share of (``gpu_share``), by
        model name, ``"*"`` for the rest: ``{"NVIDIA A100 80GB PCIe":
        {"quantum": 0.05, "split": True}, "Tesla T4": {"shares": [0.25, 0.5]}}``.
        ``quantum``: shares are multiples of it; ``shares``: the only ones
        offered; ``split``: a share larger than one device has free may span
        devices of one host. Empty (default): whole GPUs only. What a share
        means on the GPU depends on ``gpu_share_enforcement``.""",
    ).tag(config=True)

    @validate("gpu_sharing")
    def _valid_sharing(self, proposal):
        try:
            SharingPolicy.parse(proposal.value)
        except ValueError as exc:
            raise TraitError(str(exc)) from None
        return proposal.value

    gpu_share_enforcement = Union(
        [Enum(list(ENFORCEMENT_MODES)), Dict()],
        default_value="none",
        help="""What enforces a server's share of a GPU on its node: ``none``
        (bookkeeping and framework hints only: a process can still use the whole
        GPU), ``mps`` (the node runs the CUDA MPS control daemon: memory and SM
        limits per client), ``hami`` (HAMi-core's libvgpu.so is on the node:
        memory and SM limits enforced in the container). One mode, or
        ``{hostname: mode, "*": mode}``. See docs/sharing.md.""",
    ).tag(config=True)

    gpu_share_mps_pipe_dir = Unicode(
        MPS_PIPE_DIR, help="With ``mps``: the MPS control daemon's pipe directory on the nodes."
    ).tag(config=True)

    gpu_share_hami_library = Unicode(
        HAMI_LIBRARY, help="With ``hami``: the path of HAMi-core's libvgpu.so on the nodes."
    ).tag(config=True)

    allocation_policy = Unicode(
        "pack",
        help=f"""How to pick a host for a request: {', '.join(POLICIES)}.
        ``pack`` (default) takes the host with the least free room that still
        fits, keeping whole hosts free for large requests; ``spread`` takes the
        host with the most free room.""",
    ).tag(config=True)

    @validate("allocation_policy")
    def _valid_policy(self, proposal):
        if proposal.value not in POLICIES:
            raise TraitError(
                f"Unknown allocation_policy {proposal.value!r}; choose one of: {', '.join(POLICIES)}"
            )
        return proposal.value

    max_gpus_per_user = Integer(
        1,
        min=0,
        help="""The most GPUs one user may hold, counted across all their servers.
        0 allows CPU-only servers only.""",
    ).tag(config=True)

    allow_host_choice = Bool(
        False,
        help="""Let users pin their server to a host (``gpu_host``). Off by
        default: the allocator chooses.""",
    ).tag(config=True)

    nvidia_driver_capabilities = Unicode(
        "compute,utility",
        help="""``NVIDIA_DRIVER_CAPABILITIES`` for GPU servers: which driver
        libraries the NVIDIA container runtime mounts.""",
    ).tag(config=True)

    task_start_timeout = Integer(
        50,
        min=1,
        help="""Seconds to wait for the service's task to run before giving up,
        removing the service and releasing its GPUs. Keep it below
        ``Spawner.start_timeout`` so that users see this clearer message.""",
    ).tag(config=True)

    server_stop_timeout = Integer(
        30,
        min=0,
        help="""Seconds to wait, after a server's service is removed, for its
        container to exit (it gets SIGTERM, then SIGKILL after the swarm's grace
        period). Its GPUs go to the next user only once it has exited.""",
    ).tag(config=True)

    host_network_ports = Tuple(
        Integer(min=1, max=65535),
        Integer(min=1, max=65535),
        default_value=(20000, 29999),
        help="""With ``network_name = "host"``, each server listens on its node's
        own network at a port picked from this range (inclusive), one per
        server, so that servers on one node don't collide.""",
    ).tag(config=True)

    options_form_template = Unicode(
        "options_form.html",
        help="Name of the Jinja template of the spawn form, looked up in ``template_paths`` first.",
    ).tag(config=True)

    template_paths = List(
        Unicode(),
        help="Folders with templates that override gpuspawner's own (e.g. options_form.html).",
    ).tag(config=True)

    # Filled in at start; kept in the hub's state so a restarted hub knows it.
    gpu_holding: Holding | None = None
    task_node: str = ""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._events: list[dict] = []  # progress() passes these on to the spawn page
        self._new_event = asyncio.Event()
        self._gpu_cluster: GPUCluster | None = None  # the process-wide one, found once

    @default("options_form")
    def _default_options_form(self):
        return GPUSwarmSpawner._render_options_form

    @default("options_from_form")
    def _default_options_from_form(self):
        return options_from_form

    # -- shared state ----------------------------------------------------

    @property
    def swarm(self) -> Swarm:
        return Swarm(self.client, self.executor)

    @property
    def holder(self) -> str:
        return self.service_name

    @property
    def host_network(self) -> bool:
        return self.network_name == HOST_NETWORK

    def _inventory_settings(self) -> InventorySettings:
        spec = self.gpu_inventory
        return InventorySettings(
            static=tuple(load_inventory(spec)) if spec and "static" in self.gpu_inventory_source else (),
            sources=tuple(self.gpu_inventory_source),
            aliases=tuple(sorted(self.gpu_model_aliases.items())),
            stale_intervals=self.agent_stale_intervals,
            max_temperature_c=self.gpu_max_temperature,
            local_host=self.local_gpu_host,
        )

    def _cluster_state(self) -> GPUCluster:
        if self._gpu_cluster is not None:
            return self._gpu_cluster
        key = [self.gpu_inventory, self.gpu_inventory_source, self.gpu_model_aliases,
               self.agent_stale_intervals, self.gpu_max_temperature, self.local_gpu_host, self.gpu_sharing]
        try:
            cluster = GPUCluster.shared(key, self._inventory_settings)
            if cluster.ledger is None:
                cluster.ledger = Ledger(self._ledger_url())
                cluster.allocator.set_sharing(self.gpu_sharing)
            metrics.register_cluster(cluster)
            self._gpu_cluster = cluster
            return cluster
        except (InventoryError, LedgerError) as exc:
            self.log.error("%s", exc)
            raise spawn_error(
                "GPU servers are unavailable: the hub's GPU configuration is invalid. Please tell an admin.",
                reason="gpu_config",
                log_message=str(exc),
                status_code=500,
            ) from exc

    async def _cluster(self) -> GPUCluster:
        cluster = self._cluster_state()
        try:
            await cluster.refresh(self.swarm, self.log)
        except SwarmError as exc:
            raise spawn_error(
                "The cluster cannot be reached right now; please try again in a minute.",
                reason="swarm_unreachable",
                log_message=str(exc),
                status_code=503,
            ) from exc
        return cluster

    # -- the form --------------------------------------------------------

    async def _render_options_form(self) -> str:
        error = ""
        try:
            cluster = await self._cluster()
        except SpawnException as exc:
            error, cluster = exc.message, self._cluster_state()
        allocator = cluster.allocator
        held = allocator.held_by_owner(self.user.name)
        summary = allocator.summary()
        room = max(0, self.max_gpus_per_user - held)  # a Fraction when the user holds shares
        hosts = [h for h in allocator.hosts() if h in cluster.nodes and cluster.nodes[h].schedulable]
        max_count = int(min(room, max((m.largest_block for m in summary), default=0)))
        # The last choice is preselected only while it can be had: a disabled
        # radio is not submitted, and would silently give a CPU-only server.
        last = (self.user_options or {}).get("gpu_model")
        selected_free = last if any(m.model == last and m.free for m in summary) and max_count else None
        return _templates(tuple(self.template_paths)).get_template(self.options_form_template).render(
            models=summary,
            max_count=max_count,
            limit=self.max_gpus_per_user,
            held=held,
            hosts=hosts if self.allow_host_choice else [],
            selected_free=selected_free,
            error=error,
            room=room,
            share_choices=_share_choices(summary, room),
            share_note=SHARE_NOTES[enforcement_mode(self.gpu_share_enforcement, "*")],
        )

    # -- start -------------------------------------------------------------

    def _report(self, message: str, progress: int | None = None) -> None:
        event = {"message": message}
        if progress is not None:
            event["progress"] = progress
        self._events.append(event)
        self._new_event.set()

    async def progress(self):
        # JupyterHub stops reading when the spawn finishes, so each event is
        # passed on as soon as it is reported, not at the next poll.
        sent = 0
        while True:
            self._new_event.clear()
            for event in self._events[sent:]:
                yield event
            sent = len(self._events)
            if not self._spawn_pending:
                return
            try:
                await asyncio.wait_for(self._new_event.wait(), timeout=1)
            except asyncio.TimeoutError:
                pass

    async def start(self):
        self._events.clear()
        cluster = await self._cluster()
        cluster.busy.add(self.holder)  # a rescan must not take what is not running yet
        try:
            return await self._start(cluster)
        finally:
            cluster.busy.discard(self.holder)

    async def _start(self, cluster: GPUCluster):
        try:
            request = parse_user_options(
                self.user_options,
                models=[m.model for m in cluster.allocator.summary()],
                hosts=cluster.allocator.hosts(),
                max_count=self.max_gpus_per_user,
                allow_host_choice=self.allow_host_choice,
                sharing=self.gpu_sharing,
            )
        except OptionsError as exc:
            raise spawn_error(str(exc), reason="invalid_options", status_code=400) from exc

        if cluster.allocator.holding(self.holder) or self.holder in cluster.ports:
            # Left from an earlier run of this server that the hub no longer
            # tracks: its service may still run on those GPUs, so it goes first.
            if not await self._remove_and_release():
                raise spawn_error(
                    "Your previous server is still being removed; please try again in a minute.",
                    reason="stale_service",
                    status_code=503,
                )
        host, uuids, model, shares = request.host or "", (), "", None
        if not request.cpu_only:
            try:
                with metrics.ALLOCATION_SECONDS.time():
                    alloc = cluster.allocator.allocate(
                        self.holder,
                        Request(model=request.model, count=request.count, host=request.host,
                                owner=self.user.name, share=request.share),
                        max_per_owner=self.max_gpus_per_user,
                        policy=self.allocation_policy,
                    )
            except AllocationRefused as exc:
                metrics.REFUSED.labels("capacity" if exc.retry else "request").inc()
                reason = "gpu_unavailable" if exc.retry else "gpu_request"
                raise spawn_error(exc.message, reason=reason, status_code=exc.status) from exc
            metrics.GRANTED.labels(alloc.model).inc()
            host, uuids, model = alloc.host, alloc.uuids, alloc.model
            shares = alloc.shares if alloc.shared else None
            cluster.servers[self.holder] = (self.user.name, self.name)
            what = f"{fmt_list((to_milli(x) for x in shares), ' + ')} of" if shares else f"{len(alloc.devices)} ×"
            self._report(f"Reserved {what} {alloc.model} on {alloc.host}", 20)
        try:
            port = None
            if self.host_network:
                port = cluster.pick_port(self.holder, *self.host_network_ports)
                if port is None:
                    raise spawn_error(
                        "Too many servers are running for the ports configured; please try again later.",
                        reason="no_port",
                        log_message=f"all host_network_ports {self.host_network_ports} are in use",
                        status_code=503,
                    )
                self.port = port
            self.gpu_holding = Holding(
                user=self.user.name, server=self.name, host=host, uuids=uuids, model=model, port=port,
                shares=shares,
            )
            if uuids:
                await self._record_allocation(cluster)
            return await super().start()
        except BaseException:
            await self._remove_and_release()
            raise

    async def _record_allocation(self, cluster: GPUCluster) -> None:
        """Into the ledger before the service exists: a booking that cannot be
        recorded is not made (start's failure path gives the GPUs back)."""
        h = self.gpu_holding
        try:
            await cluster.ledger_call("open", self.holder, h.user, h.server, h.host, h.model, h.uuids,
                                      [to_milli(x) for x in h.shares] if h.shares else [1000] * len(h.uuids))
        except LedgerError as exc:
            self.log.error("%s", exc)
            raise spawn_error(
                "GPU bookings cannot be recorded right now (the hub's GPU ledger database is unreachable); "
                "please try again in a minute.",
                reason="ledger_unavailable",
                log_message=str(exc),
                status_code=503,
            ) from exc

    async def _remove_and_release(self) -> bool:
        """Remove this server's service, wait for its container to exit, then
        give its GPUs back.

        True when it is gone (or already was). False when the swarm could not
        be asked, or the container still runs after ``server_stop_timeout``:
        its GPUs then stay reserved."""
        name = self.object_id or self.service_name
        cluster = self._cluster_state()
        if not self.object_id and cluster.allocator.holding(self.holder) is None and self.holder not in cluster.ports:
            # Nothing was made or booked (e.g. the request was refused): nothing to undo.
            self.gpu_holding = None
            return True
        cluster.busy.add(self.holder)
        try:
            return await self._remove_and_wait(name)
        finally:
            cluster.busy.discard(self.holder)

    async def _remove_and_wait(self, name: str) -> bool:
        try:
            task_ids = [t["ID"] for t in await self.swarm.tasks(name)]
            await self.swarm.remove_service(name)
            # The swarm forgets the service at once, but its container gets
            # SIGTERM and a grace period: the GPUs are in use until it exits.
            ended = await self.swarm.wait_tasks_ended(task_ids, self.server_stop_timeout)
        except SwarmError as exc:
            if not exc.not_found:
                self.log.error("Could not remove service %s (its GPUs stay reserved): %s", self.service_name, exc)
                return False
            ended = True  # the service and its tasks were already gone
        if not ended:
            self.log.warning(
                "Service %s still runs %d s after its removal; its GPUs stay reserved",
                self.service_name, self.server_stop_timeout,
            )
            return False
        self.object_id = ""
        if self._release():
            try:
                await self._cluster_state().ledger_call("close", self.holder, None, "server stopped")
            except LedgerError as exc:  # the next reconciliation closes it
                self.log.warning("%s", exc)
        return True

    def _release(self) -> bool:
        """Give this server's GPUs back; True when it held any."""
        released = self._cluster_state().release(self.holder)
        self.gpu_holding = None
        if released is None or not released.devices:
            return False
        self.log.info("Released %s from %s", ", ".join(released.uuids), self.holder)
        return True

    def get_env(self):
        env = super().get_env()
        # Set last, so the admin's `environment` cannot widen what a server sees.
        uuids = self.gpu_holding.uuids if self.gpu_holding else ()
        env["NVIDIA_VISIBLE_DEVICES"] = visible_devices(uuids)
        if uuids:
            env["NVIDIA_DRIVER_CAPABILITIES"] = self.nvidia_driver_capabilities
            env.update(self._share_enforcement()[0])
        return env

    def _share_enforcement(self) -> tuple[dict, list]:
        """Env and mounts that carry this server's shares (none for whole GPUs)."""
        h = self.gpu_holding
        if not h or not h.uuids or not h.shares:
            return {}, []
        allocator = self._cluster_state().allocator
        memory = [(allocator.device(u).memory_mib if allocator.device(u) else 0) for u in h.uuids]
        return share_enforcement(
            enforcement_mode(self.gpu_share_enforcement, h.host), h.shares, memory,
            hami_library=self.gpu_share_hami_library, mps_pipe_dir=self.gpu_share_mps_pipe_dir,
        )

    async def create_object(self):
        extra_create = self._eval_if_callable(self.extra_create_kwargs)
        if inspect.isawaitable(extra_create):
            extra_create = await extra_create
        publish = None if (self.use_internal_ip or self.host_network) else self.port
        kwargs = build_service(
            name=self.service_name,
            image=self.image,
            command=await self.get_command(),
            env=self.get_env(),
            holding=self.gpu_holding,
            network=self.network_name,
            publish_port=publish,
            mounts=self.mounts + self._share_enforcement()[1],
            resources=self._resources(),
            extra_container=self.extra_container_spec,
            extra_placement=self.extra_placement_spec,
            extra_task=self.extra_task_spec,
            extra_endpoint=self.extra_endpoint_spec,
            extra_create=self._render_templates(extra_create or {}),
        )
        try:
            service = await self.swarm.create_service(**kwargs)
        except SwarmError as exc:
            raise spawn_error(
                f"The server's service could not be created: {exc}", reason="service_create", status_code=500
            ) from exc
        self._report("Service created", 40)
        return service

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
        first rejected or failed task with the reason the swarm gives."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.task_start_timeout
        delay, last = 0.1, "no task yet"
        while True:
            try:
                tasks = await self.swarm.tasks(self.service_name)
            except SwarmError as exc:
                raise spawn_error(
                    "The server's service could not be followed while it started; please try again.",
                    reason="task_lookup", log_message=str(exc), status_code=503,
                ) from exc
            if tasks:
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
        return self._cluster_state().hostname_of(node_id) or node_id[:12]

    async def get_ip_and_port(self):
        if not self.host_network:
            return await super().get_ip_and_port()
        addr = self._cluster_state().node_addr(self.task_node)
        if not addr:
            await self._cluster()  # the node may have joined after the last refresh
            addr = self._cluster_state().node_addr(self.task_node)
        if not addr:
            raise spawn_error(
                f"The address of node {self.task_node} is unknown", reason="node_address", status_code=500
            )
        return addr, self.port

    # -- stop / poll / state --------------------------------------------------

    async def remove_object(self):
        if not await self._remove_and_release():
            raise spawn_error(
                f"Your server's service {self.service_name} could not be removed yet; please try again.",
                reason="service_remove",
                status_code=503,
            )
        self.log.info("Removed service %s", self.service_name)

    async def stop(self, now=False):
        await super().stop(now=now)  # remove_object() gives the GPUs back
        self.task_node = ""

    async def poll(self):
        """None while the task runs or is on its way; otherwise the server is
        over: its service is removed (JupyterHub does not call stop() for a
        server it found dead) and its GPUs are given back."""
        task = await self.get_task()
        if task is None:
            # Gone, or the manager could not tell (dockerspawner reads a 500 as
            # gone): only a confirmed removal gives the GPUs back.
            if not await self._remove_and_release():
                return None
            return 0
        status = task.get("Status", {})
        state = status.get("State", "")
        down = await self._node_down(task.get("NodeID", ""))
        if down:
            # The manager still says "running", but nobody can reach the server. Its
            # service is removed (the node stops the container when it is back);
            # its GPUs go back once the swarm confirms it, at the latest at the next
            # reconciliation, and that node is not offered while it is down.
            await self._remove_and_release()
            return f"node {down} is down"
        if state == "running" or state in TASK_WAITING:
            return None
        await self._remove_and_release()
        return f"task {state}: {status.get('Err') or status.get('Message', '')}"

    async def _node_down(self, node_id: str) -> str:
        """The task's node's hostname if the swarm says the node is down, else ''."""
        try:
            cluster = await self._cluster()
        except SpawnException:
            return ""  # the manager cannot be asked: that says nothing about the node
        hostname = cluster.hostname_of(node_id)
        node = cluster.nodes.get(hostname or "")
        return hostname if node is not None and not node.ready else ""

    def get_state(self):
        state = super().get_state()
        if self.gpu_holding is not None:
            h = self.gpu_holding
            state["gpu"] = {
                "host": h.host, "uuids": list(h.uuids), "model": h.model, "port": h.port, "node": self.task_node,
                "shares": None if h.shares is None else [str(x) for x in h.shares],
            }
        return state

    def load_state(self, state):
        super().load_state(state)
        gpu = state.get("gpu")
        if gpu:
            self.gpu_holding = Holding(
                user=self.user.name, server=self.name, host=gpu.get("host", ""), uuids=tuple(gpu.get("uuids", ())),
                model=gpu.get("model", ""), port=gpu.get("port"),
                shares=None if gpu.get("shares") is None else tuple(Fraction(x) for x in gpu["shares"]),
            )
            self.task_node = gpu.get("node", "")
            if gpu.get("port"):
                self.port = gpu["port"]

    def clear_state(self):
        super().clear_state()
        self.gpu_holding = None
        self.task_node = ""


def _check_aliases(aliases) -> None:
    """Aliases end up in service labels and the form: plain names only."""
    for name, alias in dict(aliases).items():
        if not isinstance(alias, str) or not MODEL_RE.fullmatch(alias):
            raise ValueError(f"gpu_model_aliases[{name!r}] = {alias!r} is not a plain model name")


def validate_config(config) -> None:
    """Check gpuspawner's settings in a JupyterHub config now, at hub start.

    Call it at the end of jupyterhub_config.py (``validate_config(c)``). A bad
    inventory or policy then stops the hub with one line naming the file and
    the problem, instead of failing each spawn later. Settings on
    ``c.GPUSwarmSpawner`` win over those on ``c.SwarmSpawner``/``c.Spawner``,
    as traitlets resolves them.
    """
    try:
        spawner_config = {}
        for section in ("Spawner", "DockerSpawner", "SwarmSpawner", "GPUSwarmSpawner"):
            if section in config:
                spawner_config.update(config[section])
        policy = spawner_config.get("allocation_policy", "pack")
        if policy not in POLICIES:
            raise ValueError(f"Unknown allocation_policy {policy!r}; choose one of: {', '.join(POLICIES)}")
        db_url = spawner_config.get("gpu_db_url")
        if db_url:
            Ledger(db_url)  # checks the URL and its driver; connects only on first use
        inventory = spawner_config.get("gpu_inventory")
        if inventory:
            load_inventory(inventory)
        sources = spawner_config.get("gpu_inventory_source", ["static"])
        unknown = [s for s in sources if s not in SOURCES] if isinstance(sources, (list, tuple)) else [sources]
        if unknown or not sources:
            raise ValueError(f"gpu_inventory_source must be a list of: {', '.join(SOURCES)}; got {sources!r}")
        _check_aliases(spawner_config.get("gpu_model_aliases", {}))
        SharingPolicy.parse(spawner_config.get("gpu_sharing") or None)
        enforcement_mode(spawner_config.get("gpu_share_enforcement", "none"), "*")
        limit = spawner_config.get("max_gpus_per_user", 1)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"max_gpus_per_user must be a whole number ≥ 0, got {limit!r}")
    except (InventoryError, LedgerError, ValueError) as exc:
        raise SystemExit(f"gpuspawner configuration error: {exc}") from None
