"""The static inventory read from a dict or a YAML/JSON file: the hub's
settings use it; the records and their validation are :mod:`gpuspawner.core.inventory`'s."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import yaml

from .inventory import GPU, InventoryError, parse_inventory

__all__ = ["load_inventory"]


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
