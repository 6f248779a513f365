"""The swarm service for one server, as a pure function of validated values.

No I/O here: :func:`build_service` returns the keyword arguments for
``docker.APIClient.create_service`` and is tested as data. The labels written
here (:func:`gpuspawner.core.labels.to_labels`) are what
:func:`gpuspawner.core.labels.parse_labels` reads back when the hub rebuilds who
holds what from the services the swarm runs.

A server that holds shares of GPUs carries them in a label and in
``GPUSPAWNER_GPU_SHARES``; :func:`share_enforcement` adds what makes a share
more than bookkeeping on the node (CUDA MPS or HAMi-core limits), or framework
hints where nothing enforces it (docs/sharing.md says what each mode does).
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from docker.errors import DockerException
from docker.types import ContainerSpec, EndpointSpec, Mount, Placement, Resources, RestartPolicy, TaskTemplate
from docker.utils import format_environment

from ..core.device_access import (
    GUARDED_ENV,
    device_mount,
    device_mounts,
    generic_resources,
    guarded_name,
    without_generic_resources,
)
from ..core.enforcement import HAMI_LIBRARY, MPS_PIPE_DIR
from ..core.labels import LABEL, Held, to_labels
from ..core.sharing import UNIT, entitled_mib, fmt, fmt_list, shown

__all__ = [
    "ENFORCEMENT_MODES",
    "GUARDED_ENV",
    "MEMORY_ENV",
    "SHARES_ENV",
    "STOP_NOTICE_ENV",
    "STOP_NOTICE_FILE",
    "admin_conflicts",
    "build_service",
    "enforcement_mode",
    "guarded_env",
    "share_enforcement",
    "visible_devices",
]

SHARES_ENV = "GPUSPAWNER_GPU_SHARES"  # per device, in NVIDIA_VISIBLE_DEVICES order: "0.6,0.6"
MEMORY_ENV = "GPUSPAWNER_GPU_MEMORY_MIB"  # the memory each share comes with, same order: "49152,49152"
ISOLATION_ENV = "GPUSPAWNER_GPU_ISOLATION"  # what enforces the shares: none, mps or hami
ENFORCEMENT_MODES = ("none", "mps", "hami")
HAMI_LOCK_DIR = "/tmp/vgpulock"  # HAMi-core's lock files, shared by the node's containers
# A file the server's JupyterLab extension writes when the hub announces a stop of the
# server (the stop time, its reason, the message), and removes when it is withdrawn: a
# training loop can watch it and checkpoint, as with a spot instance's notice.
STOP_NOTICE_ENV = "GPUSPAWNER_STOP_NOTICE"
STOP_NOTICE_FILE = "/tmp/gpuspawner-stop-notice"


def visible_devices(uuids: tuple[str, ...] | list[str]) -> str:
    """NVIDIA_VISIBLE_DEVICES: the UUIDs, or 'void' so that a CPU-only server
    sees no GPU even when its image (e.g. a CUDA base image) says 'all'."""
    return ",".join(uuids) if uuids else "void"


def enforcement_mode(setting: str | Mapping[str, str], host: str) -> str:
    """The enforcement mode for a host: ``setting`` is one mode for every node,
    or ``{hostname: mode, "*": mode for the rest}`` (no "*": "none").
    ValueError names a mode that is not one of ENFORCEMENT_MODES."""
    if isinstance(setting, str):
        mode = setting
    elif isinstance(setting, Mapping):
        mode = setting.get(host, setting.get("*", "none"))
        for key, value in setting.items():
            if value not in ENFORCEMENT_MODES:
                raise ValueError(
                    f"GPU share enforcement for {key!r} is {value!r}; choose one of: {', '.join(ENFORCEMENT_MODES)}"
                )
    else:
        raise ValueError("GPU share enforcement must be a mode or a mapping of hostname (or '*') to mode")
    if mode not in ENFORCEMENT_MODES:
        raise ValueError(f"Unknown GPU share enforcement {mode!r}; choose one of: {', '.join(ENFORCEMENT_MODES)}")
    return mode


def share_enforcement(
    mode: str,
    milli: Sequence[int],
    memory_mib: Sequence[int],
    *,
    hami_library: str = HAMI_LIBRARY,
    hami_lock_dir: str = HAMI_LOCK_DIR,
    mps_pipe_dir: str = MPS_PIPE_DIR,
    mps_shm_dir: str | None = None,
) -> tuple[dict[str, str], list[Mount]]:
    """Env and mounts that carry a server's shares into its container.

    ``milli`` (each device's share in thousandths, 1000: whole) and
    ``memory_mib``: per device, in the order of
    NVIDIA_VISIBLE_DEVICES (by index on the host, which with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is also CUDA's ordinal order). Whole
    devices get only ``GPUSPAWNER_GPU_SHARES``; shared ones also get
    ``GPUSPAWNER_GPU_MEMORY_MIB`` (each share × its device's memory, in MiB,
    rounded down: what the hub measures the holder against; left out when a
    device's memory is not known), and by ``mode``:

    * ``none``: framework hints only (JAX/XLA memory fraction, TensorFlow
      memory growth): nothing stops a process from using the whole device;
    * ``mps``: CUDA MPS client limits, per device memory
      (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=4096MB,1=4096MB"``) and the SM
      percentage (one value per client: its smallest share), and the pipe
      directory of the node's MPS control daemon;
    * ``hami``: HAMi-core (``libvgpu.so``, mounted read-only from the node and
      preloaded) with ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` and
      ``CUDA_DEVICE_SM_LIMIT_<i>``, and its lock directory.

    Paths come from the admin's configuration; every value here is computed
    from validated numbers, never from user input."""
    if mode not in ENFORCEMENT_MODES:
        raise ValueError(f"Unknown GPU share enforcement {mode!r}; choose one of: {', '.join(ENFORCEMENT_MODES)}")
    if len(milli) != len(memory_mib):
        raise ValueError(f"{len(milli)} shares for {len(memory_mib)} devices")
    if not milli:
        return {}, []
    env = {SHARES_ENV: fmt_list(milli)}
    if all(m == UNIT for m in milli):
        return env, []
    least = min(milli)
    mib = [entitled_mib(memory, m) for m, memory in zip(milli, memory_mib)]
    if all(memory > 0 for memory in memory_mib):
        env[MEMORY_ENV] = ",".join(map(str, mib))
    env.update({ISOLATION_ENV: mode, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "TF_FORCE_GPU_ALLOW_GROWTH": "true"})
    if mode != "hami":
        # HAMi shows the container its limit as the device's memory, so a
        # fraction would shrink it twice; elsewhere JAX would preallocate 75 %
        # of the whole device.
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fmt(least)
    if mode == "mps":
        return _mps_limits(env, least, mib, mps_pipe_dir, mps_shm_dir)
    if mode == "hami":
        return _hami_limits(env, milli, mib, hami_library, hami_lock_dir)
    return env, []


def _mps_limits(
    env: dict[str, str], least: int, mib: Sequence[int], pipe_dir: str, shm_dir: str | None
) -> tuple[dict[str, str], list[Mount]]:
    """``env`` plus CUDA MPS client limits (one SM percentage: the smallest share), and
    the mounts of the node's MPS control daemon."""
    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(_percent(least))
    env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={m}MB" for i, m in enumerate(mib))
    env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
    mounts = [_bind(pipe_dir, pipe_dir)]
    if shm_dir:
        mounts.append(_bind(shm_dir, "/dev/shm"))
    return env, mounts


def _hami_limits(
    env: dict[str, str], milli: Sequence[int], mib: Sequence[int], library: str, lock_dir: str
) -> tuple[dict[str, str], list[Mount]]:
    """``env`` plus HAMi-core's per-device limits, and the mounts of its library and locks."""
    env["LD_PRELOAD"] = HAMI_LIBRARY
    env["CUDA_DEVICE_SM_LIMIT"] = str(_percent(min(milli)))
    for i, (m, limit) in enumerate(zip(milli, mib)):
        env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{limit}m"
        env[f"CUDA_DEVICE_SM_LIMIT_{i}"] = str(_percent(m))
    return env, [_bind(library, HAMI_LIBRARY, read_only=True), _bind(lock_dir, HAMI_LOCK_DIR)]


def _percent(milli: int) -> int:
    """A share as a whole percentage, rounded down (never above the share), at least 1."""
    return max(1, milli // 10)


def _bind(source: str, target: str, read_only: bool = False) -> Mount:
    if not os.path.isabs(source):
        raise ValueError(f"GPU share enforcement: {source!r} must be an absolute path on the node")
    return Mount(target=target, source=source, type="bind", read_only=read_only)


def _env_dict(env: Any) -> dict[str, str]:
    """Env as a dict, whether given as a dict or as docker's ["K=V", ...]."""
    if not env:
        return {}
    if isinstance(env, Mapping):
        return dict(env)
    return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)


# --------------------------------------------------------------------------
# The admin's extra_* settings, in either spelling
# --------------------------------------------------------------------------


def _as_built(cls: type, spec: Any, **required: Any) -> dict[str, Any]:
    """``spec`` in docker-py's built form (``Env``, ``Constraints``: the keys
    the API takes), whether the admin wrote ``cls``'s keyword arguments
    (``env``, ``constraints``), the built form, or both. Only what ``spec``
    sets comes back (a built ``ContainerSpec`` has ``Args: None``: not set);
    ``required`` fills ``cls``'s mandatory arguments."""
    spec = dict(spec or {})
    kwargs = {key: spec.pop(key) for key in list(spec) if key in _parameters(cls)}
    unset = cls(**required)
    built = cls(**{**required, **kwargs})
    given = {**spec, **{k: v for k, v in built.items() if k not in unset or unset[k] != v}}
    return {k: v for k, v in given.items() if v is not None}


@functools.cache
def _parameters(cls: type) -> frozenset[str]:
    return frozenset(inspect.signature(cls).parameters)


def _container_spec(spec: Any) -> dict[str, Any]:
    return _as_built(ContainerSpec, spec, image=None)


def _placement(spec: Any) -> dict[str, Any]:
    """A placement; TaskTemplate also takes a bare list of constraints."""
    return {"Constraints": list(spec)} if isinstance(spec, (list, tuple)) else _as_built(Placement, spec)


def _task_template(spec: Any) -> dict[str, Any]:
    """A task template with its container spec and placement in the built form too."""
    task = _as_built(TaskTemplate, spec, container_spec=None)
    for key, normal in (("ContainerSpec", _container_spec), ("Placement", _placement)):
        if task.get(key) is not None:
            task[key] = normal(task[key])
    return task


def task_resources(resources: Mapping[str, Any] | None, extra_task: Any = None) -> dict:
    """The resources the service's task template will have, as :func:`build_service`
    makes it: ``resources`` (the spawner's limits and guarantees), unless the admin's
    ``extra_task_spec`` replaces them (a ``task_template`` in ``extra_create_kwargs``
    is refused: :func:`admin_conflicts`)."""
    task = _task_template(extra_task) if extra_task else {}
    found = [task[k] for k in task if k.lower() == "resources"]
    return dict(found[-1] or {}) if found else _as_built(Resources, resources)


def admin_constraints(extra_placement: Any, extra_task: Any, extra_create: Any = None) -> list[str]:
    """The placement constraints the admin's settings give a service (placement, task
    template, and the task template of the create kwargs), less any that pin a node
    (the allocator's choice)."""
    found = list(_placement(extra_placement).get("Constraints") or []) if extra_placement else []
    for spec in (extra_task, (extra_create or {}).get("task_template")):
        task = _task_template(spec) if spec else {}
        found += list((task.get("Placement") or {}).get("Constraints") or [])
    return [c for c in found if not PINS_A_NODE.match(c)]


# --------------------------------------------------------------------------
# What no admin setting changes
# --------------------------------------------------------------------------

#: A constraint that pins a node: the node is the allocator's choice.
PINS_A_NODE = re.compile(r"\s*node\.(hostname|id)\s*==", re.IGNORECASE)


def guarded_env(holding: Held, driver_capabilities: str, enforcement_env: Mapping[str, str]) -> dict[str, str]:
    """The env a server's container gets whatever the admin's settings say:
    its devices (``void``: none), the driver's capabilities for a GPU server,
    and what enforces its shares."""
    env = {"NVIDIA_VISIBLE_DEVICES": visible_devices(holding.uuids)}
    if holding.uuids:
        env["NVIDIA_DRIVER_CAPABILITIES"] = driver_capabilities
        env[STOP_NOTICE_ENV] = STOP_NOTICE_FILE
    return {**env, **enforcement_env}


def _guard_env(container: dict, env: Mapping[str, str]) -> None:
    theirs = {k: v for k, v in _env_dict(container.get("Env")).items() if not guarded_name(k)}
    container["Env"] = format_environment({**theirs, **env})


def _guard_mounts(container: dict, mounts: Sequence[Mount]) -> None:
    """Ours last; no mount of the admin's at one of their targets, nor of a GPU's
    device nodes (the NVIDIA runtime adds those of the server's own GPUs)."""
    targets = {m["Target"] for m in mounts}
    given = [m for key in [k for k in container if k.lower() == "mounts"] for m in container.pop(key) or []]
    theirs = [Mount.parse_mount_string(m) if isinstance(m, str) else m for m in given]
    kept = [m for m in theirs if m.get("Target") not in targets and not device_mount(m)]
    container["Mounts"] = kept + list(mounts)


def _guard_host(task: dict, host: str) -> None:
    """The admin's constraints, less any that pin a node, and ours."""
    placement = dict(task.get("Placement") or {})
    constraints = [c for c in placement.pop("Constraints", None) or [] if not PINS_A_NODE.match(c)]
    if host:
        constraints.append(f"node.hostname=={host}")
    if constraints:
        placement["Constraints"] = constraints
    task["Placement"] = placement


def _guard_labels(labels: Mapping[str, str] | None, holding: Held) -> dict[str, str]:
    """The whole label namespace is ours: an admin's (or a template's) stray
    gpuspawner.shares on a whole-GPU server would be read back as a share."""
    theirs = {k: v for k, v in (labels or {}).items() if not k.startswith(f"{LABEL}.")}
    return {**theirs, **to_labels(holding)}


def build_service(
    *,
    name: str,
    image: str,
    command: list[str] | None,
    env: Mapping[str, str],
    holding: Held,
    network: str = "",
    publish_port: int | None = None,
    mounts: list | None = None,
    enforcement: tuple[Mapping[str, str], Sequence[Mount]] = ({}, ()),
    driver_capabilities: str = "compute,utility",
    resources: Mapping[str, Any] | None = None,
    extra_container: Mapping[str, Any] | None = None,
    extra_placement: Mapping[str, Any] | None = None,
    extra_task: Mapping[str, Any] | None = None,
    extra_endpoint: Mapping[str, Any] | None = None,
    extra_create: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``create_service``.

    The admin's ``extra_*`` dicts are applied as in dockerspawner's
    SwarmSpawner, in either spelling (keyword arguments or docker's built
    form), except that a container spec or placement in ``extra_task`` (or in
    ``extra_create``'s ``task_template``) is merged into the others rather
    than replacing them. Then gpuspawner's guarantees are applied, last: the
    ``node.hostname`` constraint, the ``NVIDIA_*`` (but the harmless ones) and
    ``GPUSPAWNER_*`` env and the share ``enforcement`` (env and mounts), no
    mount of a GPU device node, no generic resources, no restarts by the swarm, one
    task, the service's name and its ``gpuspawner.*`` labels. So a server can
    never be placed, see devices or be labelled other than the allocator
    decided. (:func:`admin_conflicts` names the settings that could only
    conflict, to refuse them.)
    """
    tasks = [_task_template(t) for t in (extra_task, (extra_create or {}).get("task_template")) if t]
    container = _merged_container(image, command, mounts, env, extra_container, tasks)
    placement = _merged_placement(extra_placement, tasks)
    task = TaskTemplate(
        container_spec=container,
        resources=_as_built(Resources, resources),
        networks=[network] if network else [],
    )
    for layer in tasks:  # what is left of them once their container spec and placement are merged
        task.update(layer)
    task["Placement"] = placement

    endpoint: dict[str, Any] = {}
    if publish_port is not None:
        endpoint["ports"] = {None: (publish_port, "tcp")}
    endpoint.update(extra_endpoint or {})
    create = {"task_template": task, "endpoint_spec": EndpointSpec(**endpoint), "name": name, **(extra_create or {})}
    _guarantee(create, task, name, holding, driver_capabilities, enforcement)
    return create


def _merged_container(
    image: str,
    command: list[str] | None,
    mounts: list | None,
    env: Mapping[str, str],
    extra_container: Mapping[str, Any] | None,
    tasks: list[dict[str, Any]],
) -> dict[str, Any]:
    """The container spec: ours, then the admin's layers (taking them out of ``tasks``)."""
    container = dict(ContainerSpec(image=image, args=command, mounts=mounts or []))
    their_env: dict[str, str] = {}
    for layer in [_container_spec(extra_container), *(t.pop("ContainerSpec", None) or {} for t in tasks)]:
        their_env.update(_env_dict(layer.pop("Env", None)))
        container.update(layer)
    container["Env"] = {**their_env, **env}  # the spawner's env wins over extra env, as in dockerspawner
    return container


def _merged_placement(extra_placement: Mapping[str, Any] | None, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The admin's placements, constraints added up (taking them out of ``tasks``)."""
    placement: dict[str, Any] = {}
    for layer in [_placement(extra_placement), *(t.pop("Placement", None) or {} for t in tasks)]:
        constraints = placement.get("Constraints", []) + list(layer.pop("Constraints", None) or [])
        placement.update(layer, Constraints=constraints)
    return placement


def _guarantee(
    create: dict[str, Any],
    task: dict[str, Any],
    name: str,
    holding: Held,
    driver_capabilities: str,
    enforcement: tuple[Mapping[str, str], Sequence[Mount]],
) -> None:
    """gpuspawner's guarantees, applied last over whatever the admin's settings made."""
    enforcement_env, enforcement_mounts = enforcement
    _guard_env(task["ContainerSpec"], guarded_env(holding, driver_capabilities, enforcement_env))
    _guard_mounts(task["ContainerSpec"], enforcement_mounts)
    _guard_host(task, holding.host)
    for key in [k for k in task if k.lower() == "resources"]:  # GPUs are the allocator's to give
        task[key] = without_generic_resources(task[key])
    # The hub decides about restarts: a task that swarm restarted on its own
    # would run on GPUs the hub released when it saw the server die.
    task["RestartPolicy"] = RestartPolicy(condition="none")
    create.pop("mode", None)  # one task: replicated, one replica
    create.update(task_template=task, name=name, labels=_guard_labels(create.get("labels"), holding))


def admin_conflicts(settings: Mapping[str, Any]) -> list[str]:
    """The admin's settings (by trait name: ``environment``,
    ``extra_container_spec``, ``extra_placement_spec``, ``extra_task_spec``,
    ``extra_create_kwargs``, ``extra_resources_spec``, ``volumes``,
    ``read_only_volumes``) that could only conflict with what
    :func:`build_service` guarantees, one line each, naming the setting:
    among them, mounts of GPU device nodes and swarm generic resources
    (:mod:`gpuspawner.core.device_access`).
    Values that are not dicts (callables, not evaluated yet) are skipped; a
    spec that docker-py cannot build is one line too."""
    given = {k: v for k, v in settings.items() if isinstance(v, Mapping)}
    for setting, parse in (
        ("extra_task_spec", _task_template),
        ("extra_container_spec", _container_spec),
        ("extra_placement_spec", _placement),
    ):
        try:
            parse(given.get(setting))
        except (TypeError, ValueError, DockerException) as exc:
            return [f"{setting} is not a spec docker-py can build: {shown(str(exc))}"]
    task = _task_template(given.get("extra_task_spec"))
    create = dict(given.get("extra_create_kwargs") or {})
    problems = [
        *_env_conflicts("environment", given.get("environment")),
        *_env_conflicts("extra_container_spec", _container_spec(given.get("extra_container_spec")).get("Env")),
        *_env_conflicts("extra_task_spec container_spec", (task.get("ContainerSpec") or {}).get("Env")),
        *_pin_conflicts("extra_placement_spec", _placement(given.get("extra_placement_spec"))),
        *_pin_conflicts("extra_task_spec placement", task.get("Placement") or {}),
        *[
            f"extra_create_kwargs sets {key!r}: gpuspawner sets the service's {what}"
            for key, what in (
                ("name", "name (the hub finds its servers by it)"),
                ("task_template", "task (use the extra_*_spec settings)"),
                ("mode", "mode (one task per server)"),
            )
            if key in create
        ],
        *[
            f"extra_create_kwargs labels {key!r}: the {LABEL}.* labels are gpuspawner's own"
            for key in create.get("labels") or {}
            if key.startswith(f"{LABEL}.")
        ],
    ]
    policy = task.get("RestartPolicy") or {}
    condition = policy.get("Condition", policy.get("condition", "none"))
    if condition != "none":
        problems.append(
            f"extra_task_spec restart_policy condition {condition!r}: it must be 'none' "
            "(a task the swarm restarted on its own would run on GPUs the hub released)"
        )
    return problems + _device_conflicts(given, task)


def _device_conflicts(given: Mapping[str, Any], task: Mapping[str, Any]) -> list[str]:
    """Mounts of GPU device nodes and swarm generic resources, by the setting they come from."""
    mounts = {
        "extra_container_spec": _container_spec(given.get("extra_container_spec")),
        "extra_task_spec container_spec": task.get("ContainerSpec") or {},
    }
    found = {
        setting: [m for k, v in spec.items() if str(k).lower() == "mounts" and isinstance(v, (list, tuple)) for m in v]
        for setting, spec in mounts.items()
    }
    for setting in ("volumes", "read_only_volumes"):  # dockerspawner's {source: target or {"bind": target}}
        volumes = given.get(setting) or {}
        found[setting] = [
            {"Source": k, "Target": v.get("bind") if isinstance(v, Mapping) else v} for k, v in volumes.items()
        ]
    problems = [
        f"{setting} mounts {why}: a server gets the device nodes of its own GPUs from the NVIDIA runtime, and no others"
        for setting, listed in found.items()
        for why in device_mounts(listed)
    ]
    resources = {
        "extra_resources_spec": given.get("extra_resources_spec"),
        "extra_task_spec resources": task.get("Resources"),
    }
    problems += [
        f"{setting} asks for swarm generic resources ({value}): the NVIDIA runtime would pick devices by them"
        " (DOCKER_RESOURCE_*) instead of the GPUs gpuspawner reserved"
        for setting, spec in resources.items()
        for value in map(shown, generic_resources(spec))
    ]
    return problems


def _env_conflicts(setting: str, env: Any) -> list[str]:
    return [
        f"{setting} sets {key}: the {' and '.join(p + '*' for p in GUARDED_ENV)} env is gpuspawner's own"
        " (NVIDIA_REQUIRE_*, NVIDIA_DISABLE_REQUIRE and NVIDIA_DRIVER_CAPABILITIES may be set; see also"
        " nvidia_driver_capabilities)"
        for key in _env_dict(env)
        if guarded_name(key)
    ]


def _pin_conflicts(setting: str, placement: Mapping[str, Any]) -> list[str]:
    return [
        f"{setting} constraint {c!r}: gpuspawner places each server on the host its GPUs were allocated on"
        for c in placement.get("Constraints") or []
        if PINS_A_NODE.match(c)
    ]
