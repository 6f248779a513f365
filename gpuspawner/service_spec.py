"""The swarm service for one server, as a pure function of validated values.

No I/O here: :func:`build_service` returns the keyword arguments for
``docker.APIClient.create_service`` and is tested as data. The labels written
here are what :func:`holding_from_labels` reads back when the hub rebuilds who
holds what from the services the swarm runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from docker.types import ContainerSpec, EndpointSpec, Placement, Resources, RestartPolicy, TaskTemplate

__all__ = ["LABEL", "Holding", "build_service", "holding_from_labels", "holding_labels", "visible_devices"]

LABEL = "gpuspawner"  # label prefix; a service with f"{LABEL}.devices" is one of ours


@dataclass(frozen=True)
class Holding:
    """What a service holds, as its labels say."""

    user: str
    server: str
    host: str  # "" when not pinned (CPU-only)
    uuids: tuple[str, ...]
    model: str
    port: int | None


def visible_devices(uuids: tuple[str, ...] | list[str]) -> str:
    """NVIDIA_VISIBLE_DEVICES: the UUIDs, or 'void' so that a CPU-only server
    sees no GPU even when its image (e.g. a CUDA base image) says 'all'."""
    return ",".join(uuids) if uuids else "void"


def holding_labels(h: Holding) -> dict[str, str]:
    labels = {
        f"{LABEL}.user": h.user,
        f"{LABEL}.server": h.server,
        f"{LABEL}.host": h.host,
        f"{LABEL}.devices": ",".join(h.uuids),
        f"{LABEL}.model": h.model,
    }
    if h.port is not None:
        labels[f"{LABEL}.port"] = str(h.port)
    return labels


def holding_from_labels(labels: Mapping[str, str]) -> Holding | None:
    """The holding a service's labels record, or None if it is not ours."""
    if f"{LABEL}.devices" not in labels:
        return None
    port = labels.get(f"{LABEL}.port", "")
    return Holding(
        user=labels.get(f"{LABEL}.user", ""),
        server=labels.get(f"{LABEL}.server", ""),
        host=labels.get(f"{LABEL}.host", ""),
        uuids=tuple(u for u in labels[f"{LABEL}.devices"].split(",") if u),
        model=labels.get(f"{LABEL}.model", ""),
        port=int(port) if port.isdigit() else None,
    )


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
    holding: Holding,
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
    own constraints, and our env and labels win over theirs, so a GPU
    server can never be placed or labelled other than the allocator decided.
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
    create["labels"] = {**(create.get("labels") or {}), **holding_labels(holding)}
    return create
