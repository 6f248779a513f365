"""What in an admin's settings could hand a server devices the allocator did not
reserve: env the NVIDIA container runtime reads to pick devices, mounts of GPU
device nodes, and swarm generic resources.

Pure functions of the settings as data. :mod:`gpuspawner.cluster.service_spec` uses
them both to refuse such settings (one line each, naming the setting) and to
leave them out of every service it builds.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "GUARDED_ENV",
    "HARMLESS_NVIDIA_ENV",
    "device_mount",
    "device_mounts",
    "generic_resources",
    "guarded_name",
    "without_generic_resources",
]

#: Env names that are gpuspawner's alone: the NVIDIA container runtime's
#: (which devices, MIG access, IMEX channels, GDS/MOFED/NVSWITCH devices) and
#: gpuspawner's own, except those in HARMLESS_NVIDIA_ENV.
GUARDED_ENV = ("NVIDIA_", "GPUSPAWNER_")

#: NVIDIA_* names an admin may set. They can only narrow what a container gets,
#: never add a device: NVIDIA_REQUIRE_* are constraints the runtime checks
#: before it starts a container (CUDA, driver, arch, brand), NVIDIA_DISABLE_REQUIRE
#: skips those checks, and NVIDIA_DRIVER_CAPABILITIES picks driver libraries for
#: the devices NVIDIA_VISIBLE_DEVICES already names (gpuspawner's own value,
#: nvidia_driver_capabilities, still wins on a GPU server).
HARMLESS_NVIDIA_ENV = re.compile(r"NVIDIA_(REQUIRE_\w+|DISABLE_REQUIRE|DRIVER_CAPABILITIES)")

#: Device nodes of GPUs: the NVIDIA driver's (nvidia0, nvidiactl, nvidia-uvm,
#: nvidia-caps/…) and the kernel's DRM nodes (/dev/dri: render nodes of any GPU,
#: NVIDIA's included once nvidia-drm is loaded).
GPU_DEVICES = re.compile(r"/dev/(nvidia[^/]*|dri)(/.*)?")

#: Host paths whose bind mounts carry the GPU device nodes with them (docker
#: binds recursively).
ABOVE_GPU_DEVICES = ("/", "/dev")


def guarded_name(key: str) -> bool:
    """True for an env name that only gpuspawner may set."""
    return key.startswith(GUARDED_ENV) and not HARMLESS_NVIDIA_ENV.fullmatch(key)


def _path(path: Any) -> str | None:
    """An absolute path as the kernel resolves its dots and slashes; None for
    anything else (a named volume, a missing source)."""
    if not isinstance(path, str) or not path.startswith("/"):
        return None
    return posixpath.normpath("/" + path.lstrip("/"))


def _keys(spec: Any) -> dict[str, Any]:
    """A dict with lower-case keys: docker's API reads JSON field names in any case."""
    return {str(k).lower(): v for k, v in spec.items()} if isinstance(spec, Mapping) else {}


def device_mount(mount: Any) -> str | None:
    """Why a mount (docker's built form, or "source:target[:mode]") would hand
    a container GPU devices, or None. Looks at its source, its target and a
    local volume's ``device`` option, as written: a symlink on the node to one of
    these paths is not seen from the hub."""
    if isinstance(mount, str):
        source, _, rest = mount.partition(":")
        mount = {"source": source, "target": rest.partition(":")[0]}
    spec = _keys(mount)
    options = _keys(_keys(_keys(spec.get("volumeoptions")).get("driverconfig")).get("options"))
    for what, path in (("source", spec.get("source")), ("volume device", options.get("device"))):
        path = _path(path)
        if path and (GPU_DEVICES.fullmatch(path) or path in ABOVE_GPU_DEVICES):
            return f"{what} {path}"
    target = _path(spec.get("target"))
    if target and GPU_DEVICES.fullmatch(target):
        return f"target {target}"
    return None


def _generic_keys(spec: Mapping) -> list[str]:
    return [k for k in spec if str(k).lower().replace("_", "") == "genericresources"]


def generic_resources(resources: Any) -> list[Any]:
    """The generic resources a resources spec asks for (``generic_resources``,
    or docker's ``Reservations.GenericResources``, in any case)."""
    if not isinstance(resources, Mapping):
        return []
    found = [resources[k] for k in _generic_keys(resources) if resources[k]]
    return found + [g for v in resources.values() if isinstance(v, Mapping) for g in generic_resources(v)]


def without_generic_resources(resources: Any) -> Any:
    """A resources spec with its generic resources left out (a copy)."""
    if not isinstance(resources, Mapping):
        return resources
    dropped = set(_generic_keys(resources))
    return {k: without_generic_resources(v) for k, v in resources.items() if k not in dropped}


def device_mounts(mounts: Iterable[Any] | None) -> list[str]:
    """Why each mount in ``mounts`` would hand a container GPU devices."""
    return [why for why in map(device_mount, mounts or []) if why]
