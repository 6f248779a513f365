"""gpuspawner's settings: the GPU traits of ``c.GPUSwarmSpawner`` and their
checks (the hub's state built from them is :class:`gpuspawner.hub.app.GPUHub`'s).

:class:`GPUSettings` is a mixin of :class:`~gpuspawner.spawn.spawner.GPUSwarmSpawner`
(so the traits are configured as ``c.GPUSwarmSpawner.…``, and dockerspawner's
own settings still apply); :func:`validate_config` checks a JupyterHub config
at hub start.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from datetime import timedelta

from traitlets import Bool, Dict, Enum, Float, Int, Integer, List, TraitError, Tuple, Unicode, Union, default, validate
from traitlets.config import LoggingConfigurable

from ..allocator.allocator import POLICIES
from ..allocator.fragment import Mix
from ..cluster.cluster import SOURCES
from ..cluster.service_spec import (
    ENFORCEMENT_MODES,
    HAMI_LIBRARY,
    MPS_PIPE_DIR,
    admin_conflicts,
    enforcement_mode,
    share_enforcement,
)
from ..core.access import MAX_GPUS, AccessRules
from ..core.fairshare import FairShare
from ..core.inventory import MODEL_RE, InventoryError
from ..core.inventory_files import load_inventory
from ..core.labels import Held
from ..core.link_classes import parse_link_required
from ..core.quotas import QuotaError, parse_quotas, unmet
from ..core.reports import MAX_TEMPERATURE_C
from ..core.sharing import UNIT, SharingPolicy, shown
from ..ledger.ledger import Ledger, LedgerError
from ..reclaim.settings import DAY, YEAR, BoundedInteger, FiniteFloat
from ..reclaim.settings import check_config as check_reclaim

__all__ = ["GPUSettings", "validate_config"]


class PortRange(Tuple):
    """Two ports, the first not above the last, each from 1 to 65535; anything else is
    refused naming the setting, the value and the range."""

    def validate(self, obj, value):
        ports = tuple(value) if isinstance(value, (tuple, list)) else ()
        if not (len(ports) == 2 and all(type(p) is int for p in ports) and 1 <= ports[0] <= ports[1] <= 65535):
            raise TraitError(
                f"c.GPUSwarmSpawner.{self.name} must be two ports (first, last) from 1 up to 65535, "
                f"the first not above the last, got {shown(value)}"
            )
        return super().validate(obj, ports)


class GPUSettings(LoggingConfigurable):
    """The GPU settings of a GPUSwarmSpawner."""

    gpu_inventory = Union(
        [Dict(), Unicode()],
        default_value={},
        help="""The cluster's GPUs: a dict, or the path of a YAML or JSON file,
        shaped ``{hostname: [{uuid, model, memory_mib, index?}, ...]}``.
        ``model`` is the name NVML reports (e.g. ``NVIDIA A100 80GB PCIe``);
        it is what users see and choose. Empty: CPU-only servers only.

        Example::

            c.GPUSwarmSpawner.gpu_inventory = {
                "a100-box": [
                    {"index": 0, "uuid": "GPU-77aa1e02-6c1d-4a8e-b7e5-0f1e2d3c4b50",
                     "model": "NVIDIA A100 80GB PCIe", "memory_mib": 81920},
                    {"index": 1, "uuid": "GPU-77aa1e02-6c1d-4a8e-b7e5-0f1e2d3c4b51",
                     "model": "NVIDIA A100 80GB PCIe", "memory_mib": 81920},
                ],
            }
            # or the path of a YAML or JSON file of the same shape: "/etc/jupyterhub/gpus.yaml"
        """,
    ).tag(config=True)

    gpu_inventory_source = List(
        Enum(list(SOURCES)),
        default_value=["static"],
        help="""Where the GPUs come from, one or more of:
        ``static`` (the ``gpu_inventory`` file or dict), ``agent`` (reports
        that ``gpuspawner-agent`` posts from each node; see docs/nodes.md), and
        ``local`` (NVML in the hub's own process, for a hub on a single GPU
        host). With ``static`` and ``agent`` together, a host listed in the
        static inventory keeps the devices listed there, and its agent's
        reports only say whether they are healthy.

        Example::

            c.GPUSwarmSpawner.gpu_inventory_source = ["static", "agent"]
        """,
    ).tag(config=True)

    gpu_model_aliases = Dict(
        value_trait=Unicode(),
        help="""Friendlier names for GPU models, by the name NVML reports; users see
        and choose the alias. A MIG slice is named after its GPU
        (``"A100 (80 GB) · MIG 1g.10gb"``) unless its full name has an alias of its own.

        Example::

            c.GPUSwarmSpawner.gpu_model_aliases = {
                "NVIDIA A100 80GB PCIe": "A100 (80 GB)",
                "NVIDIA GeForce GTX 1070": "GTX 1070",
            }
        """,
    ).tag(config=True)

    @validate("gpu_model_aliases")
    def _valid_aliases(self, proposal):
        try:
            _check_aliases(proposal.value)
        except ValueError as exc:
            raise TraitError(str(exc)) from None
        return proposal.value

    gpu_max_temperature = FiniteFloat(
        90.0,
        min=0,
        max=MAX_TEMPERATURE_C,
        what="a temperature in °C",
        help="""GPUs reported hotter than this (°C) are not offered until they
        cool down. Lost GPUs and GPUs with uncorrected ECC errors are never offered.""",
    ).tag(config=True)

    agent_stale_intervals = FiniteFloat(
        3.0,
        min=1,
        max=1000,
        what="a number of intervals",
        help="""A node whose agent has not reported for this many of its
        reporting intervals is not offered (its running servers are left
        alone) until it reports again.""",
    ).tag(config=True)

    agent_shared_token = Bool(
        False,
        help="""Whether node agents may still report with one token shared by all of
        them (a JupyterHub token whose role has ``custom:gpuspawner:report``). Such a
        token can report for any node; a node's own token (``gpuspawner agent-token
        HOST``) only for that node. Off (default): the shared token gets 403.
        Turn it on only while moving nodes to their own tokens; ``gpuspawner
        doctor`` warns while it is on.""",
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

    gpu_metrics_per_host = Bool(
        False,
        help="""Give the device gauges at the hub's /metrics (``gpuspawner_devices``,
        ``…_free``, ``…_unhealthy``, ``gpuspawner_allocated_share``) a ``host`` label:
        one series per host and model instead of one per model. JupyterHub writes
        every series as text on its event loop at each scrape: about 16 ms at 1,000
        hosts (docs/benchmarks.md). Per host and device, the allocation map
        (``gpuspawner alloc-map``, /hub/gpus) has it all.""",
    ).tag(config=True)

    gpu_metrics_per_holder = Bool(
        False,
        help="""Show each holder's GPU memory at the hub's /metrics, per device it
        holds: ``gpuspawner_holder_memory_used_bytes`` (its own processes', at the
        node's last report) and ``gpuspawner_holder_memory_entitled_bytes`` (what its
        share there comes with), labelled ``user``, ``server``, ``model``, ``host`` and
        ``uuid``. Off by default: a series per running server and device, and new ones
        at each start, is more than most Prometheus setups should keep. Without it,
        ``gpuspawner_holders_over_memory{model}`` counts the holders over their share,
        and the allocation map (``gpuspawner alloc-map``, /hub/gpus) has each one's
        figures (docs/sharing.md).""",
    ).tag(config=True)

    reconcile_interval = BoundedInteger(
        60,
        min=0,
        max=DAY,
        what="a whole number of seconds",
        help="""Seconds between reconciliations of GPU holdings with the
        services the swarm runs: a labelled service the hub does not track is
        adopted, and the devices of a service that is gone are given back.
        Also done at hub start (with ``gpuspawner.hubconfig.configure``) and by
        the admin's rescan. 0: only at start and on rescan.""",
    ).tag(config=True)

    gpu_sharing = Dict(
        help="""Which GPU models users may ask a share of (``gpu_share``), by
        model name, ``"*"`` for the rest, each with how it is shared.
        ``quantum``: shares are multiples of it; ``shares``: the only ones
        offered; ``split``: a share above one GPU may span devices of one
        host; ``uneven``: where no even split fits, the pieces may differ;
        ``split_small``: a share of at most one GPU may span devices too
        (otherwise it stays on one device); ``memory``: what happens to a server
        using more GPU memory than its share comes with, ``"report"`` (default),
        ``"warn"`` or ``"stop"`` (after ``memory_grace`` seconds, 300; above by more
        than ``memory_tolerance``, 0.05). Empty (default): whole GPUs only. What a share
        means on the GPU depends on ``gpu_share_enforcement``.

        Example::

            c.GPUSwarmSpawner.gpu_sharing = {
                "NVIDIA A100 80GB PCIe": {"quantum": 0.05, "split": True, "memory": "warn"},
                "NVIDIA Tesla T4": {"shares": [0.25, 0.5]},
            }
        """,
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
        ``{hostname: mode, "*": mode}``. See docs/sharing.md.

        Example::

            c.GPUSwarmSpawner.gpu_share_enforcement = {"a100-box": "mps", "*": "hami"}
        """,
    ).tag(config=True)

    gpu_share_enforcement_missing = Enum(
        ["police", "refuse"],
        default_value="police",
        help="""When a node's agent finds missing what its ``gpu_share_enforcement`` mode
        needs (the MPS control daemon, HAMi-core's library): ``police`` (default) still
        places shares there, held to their memory only as ``gpu_sharing``'s ``memory``
        says; ``refuse`` places no share there while it is missing (whole GPUs still),
        and a share that only such a node has room for is refused with why. Either
        way ``gpuspawner doctor`` and /hub/gpus name the node.""",
    ).tag(config=True)

    gpu_share_mps_pipe_dir = Unicode(
        MPS_PIPE_DIR, help="With ``mps``: the MPS control daemon's pipe directory on the nodes."
    ).tag(config=True)

    gpu_share_hami_library = Unicode(
        HAMI_LIBRARY, help="With ``hami``: the path of HAMi-core's libvgpu.so on the nodes."
    ).tag(config=True)

    allocation_policy = Unicode(
        "frag",
        help=f"""How to pick a host for a request: {", ".join(POLICIES)}.
        ``frag`` (default) takes, among the hosts pack would try first, the one
        where the free GPU that the hub's requests could not use grows least: the
        requests it learns from the ledger (or ``gpu_placement_mix``); until the
        ledger has any, it places as pack (docs/benchmarks.md). ``pack`` takes the
        host with the least free room that still fits, keeping whole hosts free for
        large requests; ``spread`` takes the host with the most free room.""",
    ).tag(config=True)

    gpu_placement_mix = List(
        Dict(),
        help="""For ``allocation_policy = "frag"``: the requests this hub sees. Each entry:
        ``gpus`` (whole GPUs, 0 for none; default 1) or ``share`` (of one GPU),
        ``cpu`` (cores), ``memory_mib``, ``models`` (the models it takes; default
        any) and ``weight`` (how often it comes; default 1). With ``cpu`` or
        ``memory_mib``, frag also keeps a host's CPU and memory in step with its free
        GPUs, at the rate the mix asks for them. Empty (the default): frag learns the mix
        from what servers held over the last 14 days (the ledger), read every hour (and
        sooner while the ledger is young, once the servers granted since have doubled): each
        kind with the CPU and memory its servers reserved (none for servers the ledger
        recorded before it kept them), of any model; until the ledger has any, it places
        as pack.

        Example::

            c.GPUSwarmSpawner.gpu_placement_mix = [
                {"share": 0.5, "cpu": 4, "memory_mib": 16384, "weight": 6},
                {"gpus": 1, "cpu": 8, "weight": 3},
                {"gpus": 4, "weight": 1},
            ]
        """,
    ).tag(config=True)

    @validate("gpu_placement_mix")
    def _valid_mix(self, proposal):
        if proposal.value:
            try:
                Mix.parse(proposal.value)
            except ValueError as exc:
                raise TraitError(str(exc)) from None
        return proposal.value

    gpu_link_required = Dict(
        help="""Multi-GPU servers only on GPUs linked at least so well (docs/topology.md),
        by model (its name or alias; ``"*"``: every model) and count (2 or more; ``"*"``:
        every count of 2 or more): ``"nvlink"`` (every pair joined by NVLink),
        ``"switch"`` (every pair behind one PCIe switch, or NVLink), ``"cpu"`` (every pair
        on one CPU socket, or NVLink). A host whose links are not known gives no such set.
        For a request, the model's own entry goes first (its count, then its ``"*"``),
        then ``"*"``'s. Empty (the default): any set, the best linked free.

        Example::

            c.GPUSwarmSpawner.gpu_link_required = {
                "NVIDIA A100 80GB PCIe": {4: "nvlink", 8: "nvlink"},
                "*": {2: "cpu"},
            }
        """,
    ).tag(config=True)

    @validate("gpu_link_required")
    def _valid_link_required(self, proposal):
        try:
            parse_link_required(proposal.value)
        except ValueError as exc:
            raise TraitError(str(exc)) from None
        return proposal.value

    @validate("allocation_policy")
    def _valid_policy(self, proposal):
        if proposal.value not in POLICIES:
            raise TraitError(f"Unknown allocation_policy {proposal.value!r}; choose one of: {', '.join(POLICIES)}")
        return proposal.value

    max_gpus_per_user = BoundedInteger(
        1,
        min=0,
        max=MAX_GPUS,
        what="a whole number of GPUs",
        help="""The most GPUs one user may hold, counted across all their servers.
        0 allows CPU-only servers only.""",
    ).tag(config=True)

    gpu_access = Dict(
        help="""Access rules per JupyterHub group: ``{group: {"models": "*" or
        [names], "max_gpus": n, "priority": n, "max_hours": h,
        "weekly_gpu_hours": h, "idle_timeout": s, "idle_threshold": pct}}``,
        ``"*"`` for users in none of the listed groups. A user in several
        groups gets the most generous of each setting. Empty (default):
        every model for everyone, up to ``max_gpus_per_user``. See docs/access.md.

        Example::

            c.GPUSwarmSpawner.gpu_access = {
                "students": {"models": ["NVIDIA GeForce GTX 1070"], "max_gpus": 1,
                             "max_hours": 4, "weekly_gpu_hours": 20},
                "staff": {"models": "*", "max_gpus": 4, "priority": 10},
                "*": {"models": [], "max_gpus": 0},  # users in no listed group: CPU only
            }
        """,
    ).tag(config=True)

    @validate("gpu_access")
    def _valid_access(self, proposal):
        try:
            AccessRules.parse(proposal.value, default_max_gpus=0)
        except ValueError as exc:
            raise TraitError(str(exc)) from None
        return proposal.value

    allow_host_choice = Bool(
        False,
        help="""Let users pin their server to a host (``gpu_host``). Off by
        default: the allocator chooses.""",
    ).tag(config=True)

    gpu_model_classes = Dict(
        value_trait=List(Unicode()),
        key_trait=Unicode(),
        help="""Named groups of GPU models a user may ask for as one choice: the
        form offers each as a choice with the free counts of its models, and
        ``gpu_model`` takes its name (or, in the REST API, a list of models). The
        server gets any one of them that is free. Such a request does not wait in line.

        Example::

            c.GPUSwarmSpawner.gpu_model_classes = {
                "any 80 GB GPU": ["NVIDIA A100 80GB PCIe", "NVIDIA H100 80GB HBM3"],
            }
        """,
    ).tag(config=True)

    @validate("gpu_model_classes")
    def _check_classes(self, proposal):
        for name, members in proposal["value"].items():
            if not name.strip() or len(name) > 100:
                raise TraitError(f"gpu_model_classes: a class needs a name of 1 to 100 characters, got {name!r}")
            if not members:
                raise TraitError(f"gpu_model_classes[{name!r}] names no model")
        return proposal["value"]

    gpu_place_cpu_only = Bool(
        False,
        help="""Place servers without GPUs too: on the node where they take least from
        GPU requests (nodes without GPUs first, then those with the fewest free GPUs)
        that has their CPU and memory (``cpu_guarantee``, ``mem_guarantee``) free, pinned
        there by a node constraint. Off by default: the swarm places them.""",
    ).tag(config=True)

    nvidia_driver_capabilities = Unicode(
        "compute,utility",
        help="""``NVIDIA_DRIVER_CAPABILITIES`` for GPU servers: which driver
        libraries the NVIDIA container runtime mounts. It wins over an
        ``NVIDIA_DRIVER_CAPABILITIES`` in ``environment`` or the extra specs.""",
    ).tag(config=True)

    task_start_timeout = BoundedInteger(
        50,
        min=1,
        max=DAY,
        what="a whole number of seconds",
        help="""Seconds to wait for the service's task to run before giving up,
        removing the service and releasing its GPUs. Keep it below
        ``Spawner.start_timeout`` so that users see this clearer message.""",
    ).tag(config=True)

    gpu_wait_timeout = BoundedInteger(
        4 * 3600,
        min=1,
        max=30 * DAY,
        what="a whole number of seconds",
        help="""Seconds a request may wait in line for a GPU model
        (``gpu_wait``, docs/line.md) before it fails with a message saying so.
        While a spawn may wait, JupyterHub's ``start_timeout`` is extended by this much.""",
    ).tag(config=True)

    gpu_line_backfill = Bool(
        True,
        help="""Backfill in the line (docs/line.md): while a request waits for a model,
        the host where it would fit first is kept for it, and requests behind it (or
        new ones) that fit on other hosts are served at once, so no GPU they fit stays
        idle and no waiter ahead starts later for it. False: strict order, nobody is
        served ahead of a waiter of the same model (GPUs that free up stay free until
        the first waiter fits).""",
    ).tag(config=True)

    gpu_fairshare_half_life_days = FiniteFloat(
        0.0,
        off=0,
        min=0.01,  # about a quarter of an hour; anything shorter is no fair share
        max=3650,  # ten years
        what="a number of days",
        help="""Fair share in the line (docs/line.md): among waiters of equal
        priority, the user with less recent GPU use goes first, recent use being
        GPU-hours weighted by 2^(-age / half-life) with this half-life in days
        (e.g. 7). 0 (the default): first come, first served.""",
    ).tag(config=True)

    gpu_fairshare_max_wait_hours = FiniteFloat(
        2.0,
        min=0.01,
        max=10 * YEAR // 3600,  # ten years
        what="a number of hours",
        help="""With fair share: hours after which a waiter goes by arrival, ahead of
        everyone of its priority who came later, whatever their recent use. Nobody is
        passed by later arrivals for longer than this. Keep it well below
        gpu_wait_timeout (4 h): a wait that times out first never reaches it.""",
    ).tag(config=True)

    gpu_fairshare_by = Enum(
        ["user", "group"],
        "user",
        help="""With fair share: whose recent use orders the line. "user": each
        waiter's own. "group": that of the most-used of the waiter's JupyterHub groups,
        all its members' use together (a waiter in no group: its own).""",
    ).tag(config=True)

    def fairshare(self) -> FairShare | None:
        """The line's fair share, or None (first come, first served)."""
        if not self.gpu_fairshare_half_life_days:
            return None
        return FairShare(
            timedelta(days=self.gpu_fairshare_half_life_days),
            timedelta(hours=self.gpu_fairshare_max_wait_hours),
            by_group=self.gpu_fairshare_by == "group",
        )

    server_stop_timeout = BoundedInteger(
        30,
        min=0,
        max=DAY,
        what="a whole number of seconds",
        help="""Seconds to wait, after a server's service is removed, for its
        container to exit (it gets SIGTERM, then SIGKILL after the swarm's grace
        period). Its GPUs go to the next user only once it has exited.""",
    ).tag(config=True)

    host_network_ports = PortRange(
        Integer(min=1, max=65535),
        Integer(min=1, max=65535),
        default_value=(20000, 29999),
        help="""With ``network_name = "host"``, each server listens on its node's
        own network at a port picked from this range (inclusive), one per
        server, so that servers on one node don't collide. Two ports from 1 to
        65535, the first not above the last.

        Example::

            c.GPUSwarmSpawner.host_network_ports = (30000, 30999)
        """,
    ).tag(config=True)

    options_form_template = Unicode(
        "options_form.html",
        help="Name of the Jinja template of the spawn form, looked up in ``template_paths`` first.",
    ).tag(config=True)

    template_paths = List(
        Unicode(),
        help="""Folders with templates that override gpuspawner's own (e.g. options_form.html).

        Example::

            c.GPUSwarmSpawner.template_paths = ["/etc/jupyterhub/templates"]
        """,
    ).tag(config=True)

    def share_enforcement_for(self, c: Held, allocator) -> tuple[dict, list]:
        """Env and mounts that carry a server's shares (none for whole GPUs)."""
        if not c.shared:
            return {}, []
        memory = [(allocator.device(u).memory_mib if allocator.device(u) else 0) for u in c.uuids]
        return share_enforcement(
            enforcement_mode(self.gpu_share_enforcement, c.host),
            c.milli,
            memory,
            hami_library=self.gpu_share_hami_library,
            mps_pipe_dir=self.gpu_share_mps_pipe_dir,
        )


def _check_aliases(aliases) -> None:
    """Aliases end up in service labels and the form: plain names only."""
    if not isinstance(aliases, Mapping):
        raise ValueError(f"gpu_model_aliases must be a mapping of NVML model name to alias, got {shown(aliases)}")
    for name, alias in aliases.items():
        if not isinstance(alias, str) or not MODEL_RE.fullmatch(alias):
            raise ValueError(f"gpu_model_aliases[{name!r}] = {alias!r} is not a plain model name")


#: The config sections a GPUSwarmSpawner reads, least specific first (traitlets' order).
SPAWNER_SECTIONS = ("Spawner", "DockerSpawner", "SwarmSpawner", "GPUSwarmSpawner")


def spawner_values(config, sections=SPAWNER_SECTIONS) -> dict:
    """The spawners' settings in ``config``: its ``sections`` merged, the more
    specific (later) one winning, as traitlets resolves them."""
    values: dict = {}
    for section in sections:
        if section in config:
            values.update(config[section])
    return values


def placement_mix(policy: str, entries: list, aliases: Mapping[str, str] | None = None) -> Mix | None:
    """The mix the frag policy places by (None for the other policies, which need none,
    and for frag without entries: it learns the mix from the ledger), its models named as
    ``gpu_model_aliases`` names them; raises ValueError when an entry is bad (whatever
    the policy)."""
    aliases = aliases or {}
    named = [
        {**e, "models": [aliases.get(m, m) for m in e["models"]]}
        if isinstance(e, dict) and isinstance(e.get("models"), (list, tuple))
        else e
        for e in entries or ()
    ]
    mix = Mix.parse(named) if entries else None
    return mix if policy == "frag" else None


def validate_config(config) -> None:
    """Check gpuspawner's settings in a JupyterHub config now, at hub start.

    Call it at the end of jupyterhub_config.py (``validate_config(c)``). A bad
    inventory or policy then stops the hub with one line naming the file and
    the problem, instead of failing each spawn later; so does an
    ``extra_*`` setting, ``environment`` or ``volumes`` that could only conflict with what
    gpuspawner guarantees (README: "What admin settings cannot change"). Settings on
    ``c.GPUSwarmSpawner`` win over those on ``c.SwarmSpawner``/``c.Spawner``,
    as traitlets resolves them.
    """
    try:
        spawner_config = spawner_values(config)
        policy = spawner_config.get("allocation_policy", GPUSettings.allocation_policy.default_value)
        if not isinstance(policy, str) or policy not in POLICIES:
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
        placement_mix(policy, spawner_config.get("gpu_placement_mix") or [], spawner_config.get("gpu_model_aliases"))
        SharingPolicy.parse(spawner_config.get("gpu_sharing") or None)
        parse_link_required(spawner_config.get("gpu_link_required"), spawner_config.get("gpu_model_aliases"))
        enforcement_mode(spawner_config.get("gpu_share_enforcement", "none"), "*")
        _check_numbers(spawner_config)
        check_reclaim(spawner_config)  # docs/idle.md
        conflicts = admin_conflicts(spawner_config)
        if conflicts:
            raise ValueError(conflicts[0])
        _check_access(spawner_config, inventory)
        _check_quotas(spawner_config, inventory, sources)
    except (InventoryError, LedgerError, ValueError) as exc:
        raise SystemExit(f"gpuspawner configuration error: {' '.join(str(exc).split())}") from None


def numeric_settings(cls: type = GPUSettings) -> list[str]:
    """The names of ``cls``'s configurable numbers: its Integer and Float traits, and
    tuples of them, found by introspection (a new one is checked without a list to edit)."""

    def numeric(trait) -> bool:
        if isinstance(trait, Tuple):
            return bool(trait._traits) and all(numeric(t) for t in trait._traits)
        return isinstance(trait, (Int, Float))

    return sorted(name for name, trait in cls.class_traits(config=True).items() if numeric(trait))


def _check_numbers(spawner_config: Mapping) -> None:
    """The numeric settings, as their traits check them (ValueError naming the setting,
    the value and its range)."""
    settings = GPUSettings()
    for name in numeric_settings(GPUSettings):
        if name in spawner_config:
            try:
                setattr(settings, name, spawner_config[name])
            except TraitError as exc:
                raise ValueError(" ".join(str(exc).split())) from None


def _check_access(spawner_config: Mapping, inventory) -> None:
    """``gpu_access`` at hub start: bad rules stop the hub (ValueError); a model
    no static inventory has is only warned about (agents may report it later)."""
    aliases = spawner_config.get("gpu_model_aliases", {})
    rules = AccessRules.parse(spawner_config.get("gpu_access"), default_max_gpus=0, aliases=aliases)
    if rules.active and inventory:
        known = {aliases.get(d.model, d.model) for d in load_inventory(inventory)}
        for unknown in rules.unknown_models(known):
            logging.getLogger("JupyterHub").warning("gpuspawner: gpu_access names a model no GPU has: %s", unknown)


def _check_quotas(spawner_config: Mapping, inventory, sources) -> None:
    """``gpu_quotas`` at hub start, beyond its own shape (its trait checks that): a share
    total only of a shared model; with a static inventory alone, only its models. Quotas
    that add up to more than the GPUs there are now are warned about (and named by
    ``doctor`` and on /hub/gpus, since the nodes change while the hub runs)."""
    aliases = spawner_config.get("gpu_model_aliases", {})
    quotas = parse_quotas(spawner_config.get("gpu_quotas") or {}, aliases)
    if not quotas:
        return
    sharing = SharingPolicy.parse(spawner_config.get("gpu_sharing") or None)
    for q in quotas:
        if not q.whole and sharing.for_model(q.model) is None:
            raise QuotaError(
                f"gpu_quotas[{q.group!r}][{q.model!r}] is a share total ({q.amount}), but gpu_sharing does not share that model"
            )
    if inventory and list(sources) == ["static"]:
        capacity: dict[str, int] = {}
        for d in load_inventory(inventory):
            model = aliases.get(d.model, d.model)
            capacity[model] = capacity.get(model, 0) + UNIT
        for q in quotas:
            if q.model not in capacity:
                raise QuotaError(f"gpu_quotas[{q.group!r}] names {q.model!r}, a model the inventory does not have")
        for line in unmet(quotas, capacity):
            logging.getLogger("JupyterHub").warning("gpuspawner: %s", line)
