"""GPU records and the sources they come from.

A source turns something an admin (or, later, a node agent) provides into a
list of :class:`GPU` records. Every source goes through :func:`parse_inventory`,
so a malformed inventory fails with one message that names where it came from
and what is wrong, whatever its format.

Shape, as a dict or a YAML/JSON file::

    gpu-a:
      - {uuid: GPU-0b1c..., model: NVIDIA GeForce GTX 1070, memory_mib: 8192, index: 0}
    gpu-b:
      - {uuid: GPU-77aa..., model: NVIDIA A100 80GB PCIe, memory_mib: 81920}

``index`` is optional; it defaults to the device's position in its host's list.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = ["GPU", "InventoryError", "load_inventory", "parse_inventory"]

# Hostnames and UUIDs end up in swarm constraints, labels and container env:
# only accept plain names, never anything that could smuggle syntax in.
HOSTNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
UUID_RE = re.compile(r"(?:GPU|MIG)-[A-Za-z0-9/._-]{1,120}")
MODEL_RE = re.compile(r"[\w .()/+·-]{1,120}")


class InventoryError(ValueError):
    """The inventory is malformed; the message names the source and the problem."""


# A host listed twice would otherwise silently lose the first list's GPUs.
class _StrictYAMLLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        keys = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in keys:
                raise yaml.constructor.ConstructorError(None, None, f"{key!r} is listed twice", key_node.start_mark)
            keys.add(key)
        return super().construct_mapping(node, deep=deep)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    for key in keys:
        if keys.count(key) > 1:
            raise ValueError(f"{key!r} is listed twice")
    return dict(pairs)


@dataclass(frozen=True, order=True)
class GPU:
    """One allocatable device on one swarm node."""

    host: str
    index: int
    uuid: str
    model: str
    memory_mib: int


def load_inventory(spec: Mapping | str) -> list[GPU]:
    """Load a static inventory from a dict or from a YAML/JSON file path."""
    if isinstance(spec, Mapping):
        return parse_inventory(spec, source="gpu_inventory (dict)")
    if not isinstance(spec, (str, os.PathLike)):
        raise InventoryError(
            f"gpu_inventory must be a dict or the path of a YAML or JSON file, got {type(spec).__name__}"
        )
    path = os.fspath(spec)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise InventoryError(f"GPU inventory {path}: cannot read it ({exc.strerror})") from exc
    try:
        if path.endswith(".json"):
            data = json.loads(text, object_pairs_hook=_json_object)
        else:
            data = yaml.load(text, Loader=_StrictYAMLLoader)  # reads JSON too
    except Exception as exc:  # parser errors carry a line and column
        why = " ".join(str(exc).split())  # one line: YAML's errors span several
        raise InventoryError(f"GPU inventory {path}: not valid YAML/JSON: {why}") from exc
    return parse_inventory(data, source=f"GPU inventory {path}")


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


def models(gpus: Iterable[GPU]) -> dict[str, int]:
    """Model name -> memory (MiB) of its largest device, sorted by name."""
    out: dict[str, int] = {}
    for gpu in gpus:
        out[gpu.model] = max(out.get(gpu.model, 0), gpu.memory_mib)
    return dict(sorted(out.items()))
