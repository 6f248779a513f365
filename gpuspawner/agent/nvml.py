"""What the GPUs on this node look like right now, via NVML: one record per GPU.

Talks to the driver through the official bindings (nvidia-ml-py, module ``pynvml``),
which dlopen ``libnvidia-ml.so.1`` on first init. Used by gpuspawner-agent on each
node and by the hub's own ``local`` source; imports neither docker nor jupyterhub.
"""

from __future__ import annotations

import math
import re

from ..core.reports import device_problems
from .errors import PROG, AgentError
from .topology import read_topology

DEFAULT_MAX_TEMPERATURE_C = 90
MIB = 1024 * 1024

NO_LIBRARY = f"{PROG}: no NVIDIA driver library (libnvidia-ml.so.1) found on this node"
NO_DRIVER = f"{PROG}: the NVIDIA driver library is installed but the NVIDIA kernel driver is not loaded on this node"


def _cuda_version_string(v: int) -> str:
    # NVML encodes CUDA versions as 1000*major + 10*minor (12040 -> "12.4").
    return f"{v // 1000}.{(v % 1000) // 10}"


# ---- health ----


def reading_problems(info: dict, max_temperature_c: float) -> list[str]:
    """The health rule (reports.device_problems, the one the hub applies) applied to
    one device record of a report."""
    return device_problems(
        info.get("lost", False), info.get("ecc_uncorrected"), info.get("temperature_c"), max_temperature_c
    )


# ---- MIG profiles ----

# Drivers name a MIG device after its GPU and profile: "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
# "… MIG 1c.2g.20gb" (a compute instance smaller than its GPU instance), "… MIG 1g.10gb+me".
_MIG_NAME = re.compile(r"(?:^|\s)MIG\s+(\d+(?:c\.\d+)?g\.\d+gb\S*)\s*$")


def mig_profile_from_name(name: str | None) -> str | None:
    """The profile in a MIG device's NVML name, as nvidia-smi shows it; None if absent."""
    m = _MIG_NAME.search(name or "")
    return m.group(1) if m else None


def mig_profile_from_attributes(
    gi_slices: int, ci_slices: int, memory_size_mb: int, gpu_memory_mib: int | None
) -> str | None:
    """A profile name rebuilt from nvmlDeviceGetAttributes, for drivers whose MIG names lack it.

    Memory is rounded the way NVIDIA's own tools (go-nvlib) do: the share of the GPU's
    memory, up to the next eighth, times the GPU's memory in whole GB; rounding the
    slice's own size instead gives names like 7g.79gb for what the driver calls 7g.80gb.
    """
    if not gi_slices or not memory_size_mb or not gpu_memory_mib:
        return None
    share = math.ceil(memory_size_mb / gpu_memory_mib * 8) / 8
    gb = int(share * math.ceil(gpu_memory_mib / 1024) + 0.5)
    profile = f"{gi_slices}g.{gb}gb"
    if ci_slices and ci_slices != gi_slices:
        profile = f"{ci_slices}c.{profile}"
    return profile


# ---- NVML ----


class _Device:
    """Collects one device's fields; turns per-call NVML errors into state, not exceptions."""

    def __init__(self, nvml, position: int):
        self.nvml = nvml
        self.lost = False
        self.problems: list[str] = []
        self.info = {
            "index": position,
            "uuid": None,
            "name": None,
            "memory_total_mib": None,
            "memory_used_mib": None,
            "utilization_gpu": None,
            "temperature_c": None,
            "ecc_uncorrected": None,
            "lost": False,
            "processes": [],
            "mig_mode": None,
            "mig_devices": [],
        }

    def call(self, what: str, fn, *args, absent=()):
        """fn(*args), or None when the GPU is lost / the call is not supported / it failed.

        Errors in ``absent`` mean "nothing there" and are not problems either.
        """
        if self.lost:
            return None  # a lost GPU answers nothing; don't ask again for every field
        nvml = self.nvml
        try:
            return fn(*args)
        except nvml.NVMLError_GpuIsLost:
            self.lost = True
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, *absent):
            pass  # e.g. no ECC on GeForce cards, no MIG before Ampere, old drivers
        except nvml.NVMLError as e:
            self.problems.append(f"{what} failed: {e}")
        return None

    def memory(self, what: str, handle) -> tuple[int | None, int | None]:
        mem = self.call(what, self.nvml.nvmlDeviceGetMemoryInfo, handle)
        return (None, None) if mem is None else (mem.total // MIB, mem.used // MIB)


def _probe_mig_devices(d: _Device, handle, gpu_memory_mib: int | None) -> list[dict]:
    nvml = d.nvml
    slots = d.call("get MIG device count", nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    found = []
    for slot in range(slots):
        # Slots are sparse: destroyed MIG devices leave gaps (NVML_ERROR_NOT_FOUND).
        mig = d.call(
            f"get MIG device {slot}",
            nvml.nvmlDeviceGetMigDeviceHandleByIndex,
            handle,
            slot,
            absent=(nvml.NVMLError_NotFound,),
        )
        if mig is None:
            continue
        name = d.call(f"get MIG device {slot} name", nvml.nvmlDeviceGetName, mig)
        profile = mig_profile_from_name(name)
        if profile is None:
            attrs = d.call(f"get MIG device {slot} attributes", nvml.nvmlDeviceGetAttributes, mig)
            if attrs is not None:
                profile = mig_profile_from_attributes(
                    attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount, attrs.memorySizeMB, gpu_memory_mib
                )
        uuid = d.call(f"get MIG device {slot} UUID", nvml.nvmlDeviceGetUUID, mig)
        total, used = d.memory(f"get MIG device {slot} memory info", mig)
        if d.lost:
            return []  # the GPU went: nothing of it is known any more
        if uuid is None or profile is None or not total:
            # Nobody can be given a slice the hub cannot name or size: leave it out, say so.
            d.problems.append(f"MIG device {slot} left out: its UUID, profile or memory is unknown")
            continue
        found.append(
            {
                "index": slot,
                "uuid": uuid,
                "profile": profile,
                "name": name,
                "memory_total_mib": total,
                "memory_used_mib": used,
            }
        )
    return [] if d.lost else found


def _identify(d: _Device, position: int):
    """(handle, index, UUID, name) of the GPU at this position; None for what NVML did not give."""
    nvml = d.nvml
    handle = d.call("get handle", nvml.nvmlDeviceGetHandleByIndex, position)
    if handle is None:
        return None, position, None, None
    index = d.call("get index", nvml.nvmlDeviceGetIndex, handle)
    return (
        handle,
        position if index is None else index,
        d.call("get UUID", nvml.nvmlDeviceGetUUID, handle),
        d.call("get name", nvml.nvmlDeviceGetName, handle),
    )


def _probe_device(nvml, position: int, max_temperature_c: float, known: dict | None = None) -> dict:
    """One device's record. ``known`` keeps each position's handle, index, UUID and name
    for as long as NVML stays open: they cannot change meanwhile, and a GPU lost later is
    still reported under its UUID."""
    d = _Device(nvml, position)
    info = d.info
    identity = (known or {}).get(position)
    if identity is None:
        identity = _identify(d, position)
        if known is not None and not d.lost and not d.problems and None not in identity:
            known[position] = identity
    handle, info["index"], info["uuid"], info["name"] = identity
    if handle is not None:
        info["memory_total_mib"], info["memory_used_mib"] = d.memory("get memory info", handle)
        util = d.call("get utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        if util is not None:
            info["utilization_gpu"] = util.gpu
        info["temperature_c"] = d.call(
            "get temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        # Volatile = since the driver was loaded: errors that a reset already dealt
        # with (aggregate, lifetime count) should not keep a GPU marked unhealthy.
        info["ecc_uncorrected"] = d.call(
            "get ECC errors",
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        procs = d.call("get processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        info["processes"] = [
            {"pid": p.pid, "used_mib": None if p.usedGpuMemory is None else p.usedGpuMemory // MIB}
            for p in (procs or [])
        ]
        mig = d.call("get MIG mode", nvml.nvmlDeviceGetMigMode, handle)
        if mig is not None:
            info["mig_mode"] = mig[0] == nvml.NVML_DEVICE_MIG_ENABLE
        if info["mig_mode"]:
            info["mig_devices"] = _probe_mig_devices(d, handle, info["memory_total_mib"])

    info["lost"] = d.lost
    problems = reading_problems(info, max_temperature_c) + d.problems
    info["healthy"] = not problems
    info["problems"] = problems
    return info


def _import_pynvml():
    try:
        import pynvml
    except ImportError as e:  # the Python bindings themselves are missing
        raise AgentError(f"{PROG}: the Python package nvidia-ml-py (module pynvml) is not installed") from e
    return pynvml


class Nvml:
    """NVML through the official bindings, initialised once and kept open.

    Initialising NVML can take seconds on a real node (it may have to wake every GPU),
    so ``run`` keeps one session across cycles; a failure closes it and the next
    ``read`` initialises again.
    """

    def __init__(self):
        self.lib = _import_pynvml()
        self.is_open = False
        self.known: dict[int, tuple] = {}  # see _probe_device
        self.links: tuple[tuple[str, ...], dict] | None = None  # (the GPUs it is of, the topology)

    def open(self) -> None:
        if self.is_open:
            return
        nvml = self.lib
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as e:
            raise AgentError(NO_LIBRARY) from e
        except nvml.NVMLError_DriverNotLoaded as e:
            raise AgentError(NO_DRIVER) from e
        except nvml.NVMLError as e:
            raise AgentError(f"{PROG}: NVML could not be initialised: {e}") from e
        self.is_open = True

    def close(self) -> None:
        if not self.is_open:
            return
        self.is_open = False
        self.known.clear()  # handles die with the session
        self.links = None
        try:
            self.lib.nvmlShutdown()
        except self.lib.NVMLError:
            pass  # nothing useful to do; the next open starts afresh

    def __enter__(self) -> Nvml:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, max_temperature_c: float = DEFAULT_MAX_TEMPERATURE_C) -> dict:
        """Return driver/CUDA versions and one record per GPU (the report's fixed shape).

        Raises AgentError (with an operator-facing sentence) when NVML cannot be used at
        all; per-device failures end up in that device's ``problems`` instead.
        """
        self.open()
        nvml = self.lib
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            cuda = _cuda_version_string(nvml.nvmlSystemGetCudaDriverVersion_v2())
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            self.close()  # start NVML afresh next time: the driver may have been reloaded
            raise AgentError(f"{PROG}: NVML failed to list the GPUs on this node: {e}") from e
        devices = [_probe_device(nvml, i, max_temperature_c, self.known) for i in range(count)]
        return {
            "driver_version": driver,
            "cuda_version": cuda,
            "device_count": count,
            "healthy": all(dev["healthy"] for dev in devices),
            "devices": devices,
            "topology": self._topology(devices),
        }

    def _topology(self, devices: list[dict]) -> dict:
        """How the whole GPUs read well are linked: read once per NVML session (links do
        not change while the driver is loaded), again when the GPUs read are not the same."""
        gpus = [
            (self.known[i][2], self.known[i][0])
            for i, dev in enumerate(devices)
            if i in self.known and not dev["lost"] and dev.get("mig_mode") is not True
        ]
        key = tuple(uuid for uuid, _ in gpus)
        if self.links is None or self.links[0] != key:
            self.links = (key, read_topology(self.lib, gpus))
        return self.links[1]


def probe(max_temperature_c: float = DEFAULT_MAX_TEMPERATURE_C) -> dict:
    """One report, with NVML initialised for it and shut down after."""
    with Nvml() as nvml:
        return nvml.read(max_temperature_c)
