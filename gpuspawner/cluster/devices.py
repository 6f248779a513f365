"""A host's devices as the inventory sources describe them, and how healthy
each is: the static inventory's entries, what the host's agent (or the hub's
own NVML probe) reports of them (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core.inventory import GPU
from ..core.reports import NodeReport, device_problems, gpus_of

__all__ = ["SOURCES", "DeviceState", "InventorySettings", "host_states"]

#: Where GPUs can come from. ``static``: the admin's file; ``agent``: reports
#: posted by gpuspawner-agent on each node; ``local``: NVML in the hub's own
#: process (a single-host setup).
SOURCES = ("static", "agent", "local")


@dataclass(frozen=True)
class InventorySettings:
    static: tuple[GPU, ...] = ()
    sources: tuple[str, ...] = ("static",)
    aliases: tuple[tuple[str, str], ...] = ()  # NVML name -> what users see
    stale_intervals: float = 3.0  # a node's agent is late after this many of its intervals
    max_temperature_c: float = 90.0
    local_host: str = ""  # the node the hub's own NVML probe speaks for
    local_interval: float = 15.0


@dataclass
class DeviceState:
    """One device as the sources describe it, healthy or not."""

    gpu: GPU
    source: str  # "static" | "agent" | "local"
    problems: list[str] = field(default_factory=list)
    temperature_c: float | None = None
    utilization_gpu: int | None = None

    @property
    def healthy(self) -> bool:
        return not self.problems


def host_states(
    host: str,
    settings: InventorySettings,
    aliases: Mapping[str, str],
    listed: bool,
    report: NodeReport | None,
    owner: Mapping[str, str],
    last_uuid: dict[tuple[str, int], str],
    before: Mapping[str, Mapping[str, DeviceState]],
) -> dict[str, DeviceState]:
    """The host's devices by UUID. ``listed``: the static inventory decides
    which devices it has (its report then only says how healthy they are);
    ``owner``: uuid -> the host that has it (a device another host has is left
    out); ``last_uuid``: (host, index) -> the UUID last reported there, kept up
    to date here (a lost GPU may no longer say its UUID); ``before``: every
    host's states from its last reading."""
    states: dict[str, DeviceState] = {}
    if listed:
        for gpu in settings.static:
            if gpu.host == host:
                model = aliases.get(gpu.model)
                named = gpu if model is None else GPU(gpu.host, gpu.index, gpu.uuid, model, gpu.memory_mib)
                states[gpu.uuid] = DeviceState(named, "static")
    if report is None:
        return states
    source = "local" if host == settings.local_host and "local" in settings.sources else "agent"
    max_temp = settings.max_temperature_c
    for gpu, dev in gpus_of(report, aliases):
        if owner.get(gpu.uuid, host) != host or owner.get(dev.uuid or "", host) != host:
            continue  # another host has it (or the GPU a MIG device is on): left out
        state = states.get(gpu.uuid)
        if state is None:
            if listed:
                continue
            state = states[gpu.uuid] = DeviceState(gpu, source)
        state.problems.extend(device_problems(dev.lost, dev.ecc_uncorrected, dev.temperature_c, max_temp))
        state.temperature_c, state.utilization_gpu = dev.temperature_c, dev.utilization_gpu
    earlier = before.get(host, {})
    for dev in report.devices:
        if dev.uuid is not None:
            last_uuid[(host, dev.index)] = dev.uuid
            continue
        # Lost before NVML named it: the GPU last seen at that index stays known, marked.
        uuid = last_uuid.get((host, dev.index), "")
        if owner.get(uuid, host) != host:
            continue
        state = states.get(uuid)
        if state is None and not listed and uuid in earlier:
            state = states[uuid] = DeviceState(earlier[uuid].gpu, source)
        if state is not None:
            state.problems.extend(device_problems(dev.lost, None, None, max_temp) or ["NVML cannot read it"])
    return states
