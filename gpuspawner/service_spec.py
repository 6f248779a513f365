"""The swarm service for one server, as a pure function of validated values.

No I/O here: :func:`build_service` returns the keyword arguments for
``docker.APIClient.create_service`` and is tested as data. The labels written
here (:func:`gpuspawner.labels.to_labels`) are what
:func:`gpuspawner.labels.parse_labels` reads back when the hub rebuilds who
holds what from the services the swarm runs.

A server that holds shares of GPUs carries them in a label and in
``GPUSPAWNER_GPU_SHARES``; :func:`share_enforcement` adds what makes a share
more than bookkeeping on the node (CUDA MPS or HAMi-core limits), or framework
hints where nothing enforces it (docs/sharing.md says what each mode does).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from docker.types import ContainerSpec, EndpointSpec, Mount, Placement, Resources, RestartPolicy, TaskTemplate

from .labels import LABEL, ServerLabels, to_labels
from .sharing import UNIT, fmt, fmt_list

__all__ = [
    "ENFORCEMENT_MODES",
    "SHARES_ENV",
    "build_service",
    "enforcement_mode",
    "share_enforcement",
    "visible_devices",
]

SHARES_ENV = "GPUSPAWNER_GPU_SHARES"  # per device, in NVIDIA_VISIBLE_DEVICES order: "0.6,0.6"
ISOLATION_ENV = "GPUSPAWNER_GPU_ISOLATION"  # what enforces the shares: none, mps or hami
ENFORCEMENT_MODES = ("none", "mps", "hami")
HAMI_LIBRARY = "/usr/local/vgpu/libvgpu.so"  # where HAMi's device plugin puts it in containers
HAMI_LOCK_DIR = "/tmp/vgpulock"  # HAMi-core's lock files, shared by the node's containers
MPS_PIPE_DIR = "/tmp/nvidia-mps"  # the MPS control daemon's default


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
    devices get only ``GPUSPAWNER_GPU_SHARES``; shared ones get, by ``mode``:

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
    mib = [m * memory // UNIT for m, memory in zip(milli, memory_mib)]
    env.update({ISOLATION_ENV: mode, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "TF_FORCE_GPU_ALLOW_GROWTH": "true"})
    mounts: list[Mount] = []
    if mode != "hami":
        # HAMi shows the container its limit as the device's memory, so a
        # fraction would shrink it twice; elsewhere JAX would preallocate 75 %
        # of the whole device.
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fmt(least)
    if mode == "mps":
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(_percent(least))
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={m}MB" for i, m in enumerate(mib))
        env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_dir
        mounts.append(_bind(mps_pipe_dir, mps_pipe_dir))
        if mps_shm_dir:
            mounts.append(_bind(mps_shm_dir, "/dev/shm"))
    elif mode == "hami":
        env["LD_PRELOAD"] = HAMI_LIBRARY
        env["CUDA_DEVICE_SM_LIMIT"] = str(_percent(least))
        for i, (m, limit) in enumerate(zip(milli, mib)):
            env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{limit}m"
            env[f"CUDA_DEVICE_SM_LIMIT_{i}"] = str(_percent(m))
        mounts.append(_bind(hami_library, HAMI_LIBRARY, read_only=True))
        mounts.append(_bind(hami_lock_dir, HAMI_LOCK_DIR))
    return env, mounts


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


def build_service(
    *,
    name: str,
    image: str,
    command: list[str] | None,
    env: Mapping[str, str],
    holding: ServerLabels,
    network: str = "",
    publish_port: int | None = None,
    mounts: list | None = None,
    resources: Mapping[str, Any] | None = None,
    extra_container: Mapping[str, Any] | None = None,
    extra_placement: Mapping[str, Any] | None = None,
    extra_task: Mapping[str, Any] | None = None,
    extra_endpoint: Mapping[str, Any] | None = None,
    extra_create: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``create_service``.

    The admin's ``extra_*`` dicts are applied as in dockerspawner's
    SwarmSpawner, except that the host constraint is *added* to the admin's
    own constraints, and our env and labels win over theirs (labels under
    ``gpuspawner.`` are ours alone), so a GPU server can never be placed or
    labelled other than the allocator decided.
    """
    container = dict(image=image, env=dict(env), args=command, mounts=mounts or [])
    container.update(extra_container or {})
    container["env"] = {**_env_dict(container.get("env")), **env}

    placement = dict(extra_placement or {})
    constraints = list(placement.get("constraints") or [])
    if holding.host:
        constraints.append(f"node.hostname=={holding.host}")
    placement["constraints"] = constraints or None

    task = dict(
        container_spec=ContainerSpec(**container),
        resources=Resources(**(resources or {})),
        networks=[network] if network else [],
        placement=Placement(**placement),
        # The hub decides about restarts: a task that swarm restarted on its own
        # would run on GPUs the hub released when it saw the server die.
        restart_policy=RestartPolicy(condition="none"),
    )
    task.update(extra_task or {})

    endpoint: dict[str, Any] = {}
    if publish_port is not None:
        endpoint["ports"] = {None: (publish_port, "tcp")}
    endpoint.update(extra_endpoint or {})

    create: dict[str, Any] = dict(
        task_template=TaskTemplate(**task), endpoint_spec=EndpointSpec(**endpoint), name=name
    )
    create.update(extra_create or {})
    # The whole label namespace is ours: an admin's (or a template's) stray
    # gpuspawner.shares on a whole-GPU server would be read back as a share.
    theirs = {k: v for k, v in (create.get("labels") or {}).items() if not k.startswith(f"{LABEL}.")}
    create["labels"] = {**theirs, **to_labels(holding)}
    return create
