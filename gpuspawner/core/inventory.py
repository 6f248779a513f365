"""GPU records and the static inventory's validation (pure: no file is read here).

A source turns something an admin (or a node agent) provides into a list of
:class:`GPU` records. Every source goes through :func:`parse_inventory`, so a
malformed inventory fails with one message that names where it came from and
what is wrong, whatever its format (files are read by
:mod:`gpuspawner.core.inventory_files`).

Shape, as a dict or a YAML/JSON file::

    gpu-a:
      - {uuid: GPU-0b1c..., model: NVIDIA GeForce GTX 1070, memory_mib: 8192, index: 0}
    gpu-b:
      - {uuid: GPU-77aa..., model: NVIDIA A100 80GB PCIe, memory_mib: 81920}

``index`` is optional; it defaults to the device's position in its host's list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GPU", "InventoryError", "parse_inventory"]

# Hostnames and UUIDs end up in swarm constraints, labels and container env:
# only accept plain names, never anything that could smuggle syntax in.
HOSTNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
UUID_RE = re.compile(r"(?:GPU|MIG)-[A-Za-z0-9/._-]{1,120}")
MODEL_RE = re.compile(r"[\w .()/+·-]{1,120}")


class InventoryError(ValueError):
    """The inventory is malformed; the message names the source and the problem."""


@dataclass(frozen=True, order=True)
class GPU:
    """One allocatable device on one swarm node."""

    host: str
    index: int
    uuid: str
    model: str
    memory_mib: int


def parse_inventory(data: Any, source: str = "GPU inventory") -> list[GPU]:
    """Validate ``{hostname: [{uuid, model, memory_mib, index?}, ...]}``."""
    if not isinstance(data, Mapping) or not data:
        raise InventoryError(
            f"{source}: expected a mapping of hostname to a list of GPUs, "
            f"got {type(data).__name__ if data else 'nothing'}"
        )
    gpus: list[GPU] = []
    seen_uuids: dict[str, str] = {}
    for host, devices in data.items():
        if not isinstance(host, str) or not HOSTNAME_RE.fullmatch(host):
            raise InventoryError(f"{source}: {host!r} is not a valid hostname")
        if not isinstance(devices, list):
            raise InventoryError(f"{source}: {host}: expected a list of GPUs")
        indices: set[int] = set()
        for pos, dev in enumerate(devices):
            where = f"{source}: {host}[{pos}]"
            gpu = _parse_device(dev, host, pos, where)
            if gpu.uuid in seen_uuids:
                raise InventoryError(f"{where}: uuid {gpu.uuid} is listed twice (also on {seen_uuids[gpu.uuid]})")
            if gpu.index in indices:
                raise InventoryError(f"{where}: index {gpu.index} is listed twice on {host}")
            seen_uuids[gpu.uuid] = host
            indices.add(gpu.index)
            gpus.append(gpu)
    return sorted(gpus)


def _parse_device(dev: Any, host: str, pos: int, where: str) -> GPU:
    if not isinstance(dev, Mapping):
        raise InventoryError(f"{where}: expected a mapping with uuid, model, memory_mib")
    unknown = set(dev) - {"uuid", "model", "memory_mib", "index"}
    if unknown:
        raise InventoryError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    for key in ("uuid", "model", "memory_mib"):
        if key not in dev:
            raise InventoryError(f"{where}: missing {key!r}")
    uuid, model, memory, index = dev["uuid"], dev["model"], dev["memory_mib"], dev.get("index", pos)
    if not isinstance(uuid, str) or not UUID_RE.fullmatch(uuid):
        raise InventoryError(f"{where}: uuid {uuid!r} is not a GPU-… or MIG-… UUID")
    if not isinstance(model, str) or not MODEL_RE.fullmatch(model.strip()):
        raise InventoryError(f"{where}: model {model!r} is not a plain model name")
    if not _is_int(memory) or memory <= 0:
        raise InventoryError(f"{where}: memory_mib must be a positive integer, got {memory!r}")
    if not _is_int(index) or index < 0:
        raise InventoryError(f"{where}: index must be a non-negative integer, got {index!r}")
    return GPU(host=host, index=index, uuid=uuid, model=model.strip(), memory_mib=memory)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
