"""gpuspawner-agent: what the GPUs on this node look like right now, via NVML.

Runs on each GPU node. This first slice only probes and prints; reporting to the hub
comes later. It talks to the driver through the official bindings (nvidia-ml-py,
module ``pynvml``), which dlopen ``libnvidia-ml.so.1`` on first init.

Deliberately imports neither docker nor jupyterhub: nodes run only this.
"""

from __future__ import annotations

import argparse
import json
import sys

PROG = "gpuspawner-agent"
DEFAULT_MAX_TEMPERATURE_C = 90
MIB = 1024 * 1024

NO_LIBRARY = f"{PROG}: no NVIDIA driver library (libnvidia-ml.so.1) found on this node"
NO_DRIVER = (f"{PROG}: the NVIDIA driver library is installed but the NVIDIA kernel driver "
             "is not loaded on this node")


class AgentError(Exception):
    """A node-level failure; str() is the one sentence shown to the operator."""


def _cuda_version_string(v: int) -> str:
    # NVML encodes CUDA versions as 1000*major + 10*minor (12040 -> "12.4").
    return f"{v // 1000}.{(v % 1000) // 10}"


class _Device:
    """Collects one device's fields; turns per-call NVML errors into state, not exceptions."""

    def __init__(self, nvml, position: int):
        self.nvml = nvml
        self.lost = False
        self.problems: list[str] = []
        self.info = {
            "index": position, "uuid": None, "name": None,
            "memory_total_mib": None, "memory_used_mib": None,
            "utilization_gpu": None, "temperature_c": None,
            "ecc_uncorrected": None, "lost": False, "processes": [],
            "mig_mode": None,
        }

    def call(self, what: str, fn, *args):
        """fn(*args), or None when the GPU is lost / the call is not supported / it failed."""
        if self.lost:
            return None  # a lost GPU answers nothing; don't ask again for every field
        nvml = self.nvml
        try:
            return fn(*args)
        except nvml.NVMLError_GpuIsLost:
            self.lost = True
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            pass  # e.g. no ECC on GeForce cards, no MIG before Ampere, old drivers
        except nvml.NVMLError as e:
            self.problems.append(f"{what} failed: {e}")
        return None


def _probe_device(nvml, position: int, max_temperature_c: float) -> dict:
    d = _Device(nvml, position)
    info = d.info
    handle = d.call("get handle", nvml.nvmlDeviceGetHandleByIndex, position)
    if handle is not None:
        index = d.call("get index", nvml.nvmlDeviceGetIndex, handle)
        if index is not None:
            info["index"] = index
        info["uuid"] = d.call("get UUID", nvml.nvmlDeviceGetUUID, handle)
        info["name"] = d.call("get name", nvml.nvmlDeviceGetName, handle)
        mem = d.call("get memory info", nvml.nvmlDeviceGetMemoryInfo, handle)
        if mem is not None:
            info["memory_total_mib"] = mem.total // MIB
            info["memory_used_mib"] = mem.used // MIB
        util = d.call("get utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        if util is not None:
            info["utilization_gpu"] = util.gpu
        info["temperature_c"] = d.call("get temperature", nvml.nvmlDeviceGetTemperature,
                                       handle, nvml.NVML_TEMPERATURE_GPU)
        # Volatile = since the driver was loaded: errors that a reset already dealt
        # with (aggregate, lifetime count) should not keep a GPU marked unhealthy.
        info["ecc_uncorrected"] = d.call(
            "get ECC errors", nvml.nvmlDeviceGetTotalEccErrors, handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        procs = d.call("get processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        info["processes"] = [
            {"pid": p.pid, "used_mib": None if p.usedGpuMemory is None else p.usedGpuMemory // MIB}
            for p in (procs or [])
        ]
        mig = d.call("get MIG mode", nvml.nvmlDeviceGetMigMode, handle)
        if mig is not None:
            info["mig_mode"] = mig[0] == nvml.NVML_DEVICE_MIG_ENABLE

    # Health: lost first (nothing else is known then), then ECC, then heat.
    problems = []
    if d.lost:
        info["lost"] = True
        problems.append("GPU is lost (NVML_ERROR_GPU_IS_LOST)")
    if info["ecc_uncorrected"]:
        problems.append(f"{info['ecc_uncorrected']} uncorrected ECC errors")
    temp = info["temperature_c"]
    if temp is not None and temp > max_temperature_c:
        problems.append(f"temperature {temp} C is above {max_temperature_c:g} C")
    problems.extend(d.problems)
    info["healthy"] = not problems
    info["problems"] = problems
    return info


def _import_pynvml():
    try:
        import pynvml
    except ImportError as e:  # the Python bindings themselves are missing
        raise AgentError(f"{PROG}: the Python package nvidia-ml-py (module pynvml) is not installed") from e
    return pynvml


def probe(max_temperature_c: float = DEFAULT_MAX_TEMPERATURE_C) -> dict:
    """Return driver/CUDA versions and one record per GPU.

    Raises AgentError (with an operator-facing sentence) when NVML cannot be used at
    all; per-device failures end up in that device's ``problems`` instead.
    """
    nvml = _import_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound as e:
        raise AgentError(NO_LIBRARY) from e
    except nvml.NVMLError_DriverNotLoaded as e:
        raise AgentError(NO_DRIVER) from e
    except nvml.NVMLError as e:
        raise AgentError(f"{PROG}: NVML could not be initialised: {e}") from e
    try:
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            cuda = _cuda_version_string(nvml.nvmlSystemGetCudaDriverVersion_v2())
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            raise AgentError(f"{PROG}: NVML failed to list the GPUs on this node: {e}") from e
        devices = [_probe_device(nvml, i, max_temperature_c) for i in range(count)]
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # nothing useful to do; the probe result is still good
    return {
        "driver_version": driver,
        "cuda_version": cuda,
        "device_count": count,
        "healthy": all(dev["healthy"] for dev in devices),
        "devices": devices,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="GPU node agent for gpuspawner.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_probe = sub.add_parser("probe", help="print this node's GPUs as JSON")
    p_probe.add_argument("--max-temperature", type=float, default=DEFAULT_MAX_TEMPERATURE_C,
                         metavar="C", help="GPUs hotter than this are unhealthy (default: %(default)g)")
    args = parser.parse_args(argv)

    if args.command == "probe":
        try:
            report = probe(max_temperature_c=args.max_temperature)
        except AgentError as e:
            print(e, file=sys.stderr)  # one sentence, no traceback
            return 2
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    return 2  # unreachable: argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
