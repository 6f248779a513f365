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
import json
import os
import socket
from types import SimpleNamespace
from typing import Callable

import jinja2
from dockerspawner import SwarmSpawner
from jupyterhub.spawner import SpawnException
from traitlets import Bool, Dict, Enum, Float, Integer, List, TraitError, Tuple, Unicode, Union, default, validate

from . import metrics
from .allocator import POLICIES, AllocationRefused, Request
from .cluster import SOURCES, GPUCluster, InventorySettings
from .holdings import Holding, HoldingBusy, Holdings
from .inventory import MODEL_RE, InventoryError, load_inventory
from .labels import ServerLabels
from .ledger import Ledger, LedgerError, default_db_url
from .options import OptionsError, options_from_form, parse_user_options
from .service_spec import (
    ENFORCEMENT_MODES,
    HAMI_LIBRARY,
    MPS_PIPE_DIR,
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

    task_node: str = ""  # the node the server's task runs on

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._events: list[dict] = []  # progress() passes these on to the spawn page
        self._new_event = asyncio.Event()

    @default("options_form")
    def _default_options_form(self):
        return GPUSwarmSpawner._render_options_form

    @default("options_from_form")
    def _default_options_from_form(self):
        return options_from_form

    # -- the hub's holdings ---------------------------------------------------

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

    def holdings(self) -> Holdings:
        """The hub's one owner of GPU holdings, built at first use from these
        settings (every spawner and endpoint of the hub gets the same one)."""
        key = json.dumps([self.gpu_inventory, self.gpu_inventory_source, self.gpu_model_aliases,
                          self.agent_stale_intervals, self.gpu_max_temperature, self.local_gpu_host,
                          self.gpu_sharing, self._ledger_url()], sort_keys=True, default=str)
        owner = _OWNERS.get(key)
        if owner is not None:
            return owner
        try:
            cluster = GPUCluster(self._inventory_settings())
            cluster.allocator.set_sharing(self.gpu_sharing)
            ledger = Ledger(self._ledger_url())
        except (InventoryError, LedgerError) as exc:
            self.log.error("%s", exc)
            raise spawn_error(
                "GPU servers are unavailable: the hub's GPU configuration is invalid. Please tell an admin.",
                reason="gpu_config", log_message=str(exc), status_code=500,
            ) from exc
        owner = _OWNERS[key] = Holdings(
            cluster, Swarm(self.client, self.executor), ledger=ledger,
            name_for=_service_names(type(self), self.config), stop_timeout=self.server_stop_timeout,
        )
        metrics.register_cluster(cluster)
        return owner

    async def _up_to_date(self) -> Holdings:
        """The holdings with fresh node status; at the hub's first use, rebuilt
        from what the swarm runs and what the ledger has open."""
        owner = self.holdings()
        try:
            await owner.cluster.refresh(owner.swarm, self.log)
            if not owner.rebuilt:
                await owner.reconcile()
        except SwarmError as exc:
            raise spawn_error(
                "The cluster cannot be reached right now; please try again in a minute.",
                reason="swarm_unreachable", log_message=str(exc), status_code=503,
            ) from exc
        return owner

    def _holding(self) -> Holding | None:
        return self.holdings().get(self.service_name)

    # -- the form --------------------------------------------------------

    async def _render_options_form(self) -> str:
        error = ""
        try:
            owner = await self._up_to_date()
        except SpawnException as exc:
            error, owner = exc.message, self.holdings()
        cluster, allocator = owner.cluster, owner.allocator
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

    def _request(self, owner: Holdings) -> Request | None:
        """The user's options as an allocator request (None: CPU-only); 400 when invalid."""
        try:
            options = parse_user_options(
                self.user_options,
                models=[m.model for m in owner.allocator.summary()],
                hosts=owner.allocator.hosts(),
                max_count=self.max_gpus_per_user,
                allow_host_choice=self.allow_host_choice,
                sharing=self.gpu_sharing,
            )
        except OptionsError as exc:
            raise spawn_error(str(exc), reason="invalid_options", status_code=400) from exc
        if options.cpu_only:
            return None
        return Request(model=options.model, count=options.count, host=options.host,
                       owner=self.user.name, share=options.share)

    async def start(self):
        self._events.clear()
        owner = await self._up_to_date()
        request = self._request(owner)
        name = self.service_name
        # A service left by an earlier run of this server (a killed hub, a
        # failed stop) may still run on its GPUs: it goes first.
        if not await self._remove(owner):
            raise spawn_error(
                "Your previous server is still being removed; please try again in a minute.",
                reason="stale_service", status_code=503,
            )
        holding = await self._reserve(owner, request)
        try:
            if holding.labels.port is not None:
                self.port = holding.labels.port
            try:
                service = await owner.create(name, await self._service_spec(holding))
            except SwarmError as exc:
                raise spawn_error(
                    f"The server's service could not be created: {exc}", reason="service_create", status_code=500
                ) from exc
            self.object_id = service.get("ID", "")
            self._report("Service created", 40)
            await self.start_object()
            return await self.get_ip_and_port()
        except BaseException:
            # Shielded: a cancelled spawn (JupyterHub's DELETE on a pending
            # server) still gives its GPUs back once its task has ended.
            await asyncio.shield(self._remove(owner))
            raise

    async def _reserve(self, owner: Holdings, request: Request | None) -> Holding:
        try:
            holding = await owner.reserve(
                self.service_name, self.user.name, self.name, request,
                max_per_owner=self.max_gpus_per_user, policy=self.allocation_policy,
                port_range=self.host_network_ports if self.host_network else None,
            )
        except AllocationRefused as exc:
            metrics.REFUSED.labels("capacity" if exc.retry else "request").inc()
            reason = "gpu_unavailable" if exc.retry else "gpu_request"
            raise spawn_error(exc.message, reason=reason, status_code=exc.status) from exc
        except HoldingBusy as exc:
            raise spawn_error(
                "Your previous server is still being removed; please try again in a minute.",
                reason="stale_service", status_code=503,
            ) from exc
        except ValueError as exc:  # no port left in host_network_ports
            raise spawn_error(
                "Too many servers are running for the ports configured; please try again later.",
                reason="no_port", log_message=str(exc), status_code=503,
            ) from exc
        except LedgerError as exc:
            self.log.error("%s", exc)
            raise spawn_error(
                "GPU bookings cannot be recorded right now (the hub's GPU ledger database is unreachable); "
                "please try again in a minute.",
                reason="ledger_unavailable", log_message=str(exc), status_code=503,
            ) from exc
        c = holding.labels
        if c.uuids:
            metrics.GRANTED.labels(c.model).inc()
            what = f"{fmt_list(c.milli, ' + ')} of" if c.milli else f"{len(c.uuids)} ×"
            self._report(f"Reserved {what} {c.model} on {c.host}", 20)
        return holding

    async def _remove(self, owner: Holdings) -> bool:
        """Remove this server's service; True once no task of it can run
        (its GPUs are then back). False: it stays reserved, and says why."""
        try:
            return await owner.remove(self.service_name)
        except SwarmError as exc:
            self.log.error("Could not remove service %s: %s", self.service_name, exc)
            return False

    def get_env(self):
        env = super().get_env()
        # Set last, so the admin's `environment` cannot widen what a server sees.
        h = self._holding()
        uuids = h.labels.uuids if h else ()
        env["NVIDIA_VISIBLE_DEVICES"] = visible_devices(uuids)
        if uuids:
            env["NVIDIA_DRIVER_CAPABILITIES"] = self.nvidia_driver_capabilities
        return env

    def _share_enforcement(self, c: ServerLabels) -> tuple[dict, list]:
        """Env and mounts that carry this server's shares (none for whole GPUs)."""
        if not c.uuids or not c.milli:
            return {}, []
        allocator = self.holdings().allocator
        memory = [(allocator.device(u).memory_mib if allocator.device(u) else 0) for u in c.uuids]
        return share_enforcement(
            enforcement_mode(self.gpu_share_enforcement, c.host), c.milli, memory,
            hami_library=self.gpu_share_hami_library, mps_pipe_dir=self.gpu_share_mps_pipe_dir,
        )

    async def _service_spec(self, holding: Holding) -> dict:
        extra_create = self._eval_if_callable(self.extra_create_kwargs)
        if inspect.isawaitable(extra_create):
            extra_create = await extra_create
        env, mounts = self._share_enforcement(holding.labels)
        publish = None if (self.use_internal_ip or self.host_network) else self.port
        return build_service(
            name=self.service_name,
            image=self.image,
            command=await self.get_command(),
            env={**self.get_env(), **env},
            holding=holding.labels,
            network=self.network_name,
            publish_port=publish,
            mounts=self.mounts + mounts,
            resources=self._resources(),
            extra_container=self.extra_container_spec,
            extra_placement=self.extra_placement_spec,
            extra_task=self.extra_task_spec,
            extra_endpoint=self.extra_endpoint_spec,
            extra_create=self._render_templates(extra_create or {}),
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
        owner = self.holdings()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.task_start_timeout
        delay, last = 0.1, "no task yet"
        while True:
            try:
                tasks = await owner.swarm.tasks(self.service_name)
            except SwarmError as exc:
                raise spawn_error(
                    "The server's service could not be followed while it started; please try again.",
                    reason="task_lookup", log_message=str(exc), status_code=503,
                ) from exc
            if tasks:
                await owner.note_tasks(self.service_name, [t["ID"] for t in tasks])
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
                        reason="task_failed", status_code=500,
                    )
                last = f"{state}: {why}"
            if loop.time() >= deadline:
                raise spawn_error(
                    f"The server did not start within {self.task_start_timeout} s (last task state: {last})",
                    reason="task_timeout", status_code=504,
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

    async def get_ip_and_port(self):
        if not self.host_network:
            return await super().get_ip_and_port()
        return await self._node_addr(self.task_node), self.port

    async def get_url(self):
        """Where the server really listens. With host networking that is its
        node's address and the port in its labels, which a hub killed
        mid-spawn never recorded: a restarted hub checks this URL."""
        if not self.host_network or self.server is None:
            return await super().get_url()
        owner = await self._up_to_date()
        h = owner.get(self.service_name)
        if h is None or h.labels.port is None:
            return await super().get_url()
        if not self.task_node:
            tasks = await owner.swarm.tasks(self.service_name)
            self.task_node = self._hostname_of(tasks[0].get("NodeID", "")) if tasks else h.labels.host
        self.port = h.labels.port
        addr = await self._node_addr(self.task_node)
        return f"{self.server.proto}://{addr}:{h.labels.port}{self.server.base_url}"

    # -- stop / poll / state --------------------------------------------------

    async def stop(self, now=False):
        if not await self._remove(await self._up_to_date()):
            raise spawn_error(
                f"Your server's service {self.service_name} could not be removed yet; please try again.",
                reason="service_remove", status_code=503,
            )
        self.log.info("Removed service %s", self.service_name)
        self.object_id = ""
        self.clear_state()

    async def poll(self):
        """None while the task runs or is on its way; otherwise the server is
        over: its service is removed (JupyterHub does not call stop() for a
        server it found dead) and its GPUs come back once its task has ended."""
        try:
            owner = await self._up_to_date()  # a restarted hub polls before anything else
            tasks = await owner.swarm.tasks(self.service_name)
        except SpawnException:
            return None  # the manager cannot be asked: that says nothing about the server
        except SwarmError as exc:
            if not exc.not_found:
                return None  # the manager cannot tell: that says nothing about the server
            await self._remove(owner)
            return 0
        if not tasks:
            return None  # created, no task yet
        await owner.note_tasks(self.service_name, [t["ID"] for t in tasks])
        status = tasks[0].get("Status", {})
        state = status.get("State", "")
        down = await self._node_down(tasks[0].get("NodeID", ""))
        if down:
            # The manager may still say "running", but nobody can reach the
            # server. Its service is removed (the node stops the container
            # when it is back); its GPUs stay reserved until the swarm
            # confirms the task ended, and that node is not offered meanwhile.
            await self._remove(owner)
            return f"node {down} is down"
        if state == "running" or state in TASK_WAITING:
            return None
        await self._remove(owner)
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
        return state

    def load_state(self, state):
        super().load_state(state)
        self.task_node = state.get("gpu_node", "")

    def clear_state(self):
        super().clear_state()
        self.task_node = ""


#: The hub's owners of holdings, by the settings they were built from.
_OWNERS: dict[str, Holdings] = {}


def _service_names(cls: type, config) -> Callable[[str, str], str]:
    """The service name the hub gives a user's server, as its spawners
    render dockerspawner's ``name_template``."""

    @functools.lru_cache(maxsize=4096)
    def name_for(user: str, server: str) -> str:
        named = SimpleNamespace(name=server, display_name=server, server=None, state=None)
        return cls(config=config, user=SimpleNamespace(name=user, id=0), orm_spawner=named).service_name

    return name_for


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
