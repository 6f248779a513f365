"""How well linked the admin requires a multi-GPU server's GPUs to be
(``c.GPUSwarmSpawner.gpu_link_required``), as the admin writes it, checked (pure).

A link class says how every pair of a set must be joined, best first: ``nvlink`` (by at
least one NVLink), ``switch`` (behind one PCIe switch or on one board, or by NVLink),
``cpu`` (on one CPU socket, any PCIe path short of crossing to the other socket, or by
NVLink). A pair whose path or NVLinks are not known meets only what its known part
meets: "could not find out" is never taken for a link.

The setting maps a model (or ``"*"``: every model) to a count (2 or more, or ``"*"``:
every count of 2 or more) to a class::

    c.GPUSwarmSpawner.gpu_link_required = {
        "NVIDIA A100 80GB PCIe": {4: "nvlink", 8: "nvlink"},
        "*": {2: "cpu"},
    }

For a request, the model's own entry goes first (its count, then its ``"*"``), then
``"*"``'s (its count, then its ``"*"``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .inventory import MODEL_RE
from .sharing import shown
from .topology import Link, Path

__all__ = ["ANY", "LinkClass", "LinkRequired", "parse_link_required"]

ANY = "*"  # every model, or every count of 2 or more


class LinkClass(enum.Enum):
    """What every pair of a set must be joined by, best first."""

    NVLINK = "nvlink"
    SWITCH = "switch"
    CPU = "cpu"

    def met_by(self, link: Link) -> bool:
        """Whether a pair so linked meets the class (an unknown part meets nothing)."""
        if link.nvlinks:
            return True
        farthest = _FARTHEST[self]
        return farthest is not None and link.path is not None and link.path <= farthest

    @property
    def words(self) -> str:
        """What a user reads: "GPUs joined by NVLink", ..."""
        return _WORDS[self]


# The farthest PCIe path that meets each class without NVLink (None: none does).
_FARTHEST: dict[LinkClass, Path | None] = {
    LinkClass.NVLINK: None,
    LinkClass.SWITCH: Path.SWITCH,
    LinkClass.CPU: Path.CPU,
}
_WORDS = {
    LinkClass.NVLINK: "GPUs joined by NVLink",
    LinkClass.SWITCH: "GPUs behind one PCIe switch or joined by NVLink",
    LinkClass.CPU: "GPUs on one CPU or joined by NVLink",
}


@dataclass(frozen=True)
class LinkRequired:
    """The admin's requirements: model (or ``"*"``) -> count (or ``"*"``) -> class,
    models named as users see them."""

    rules: Mapping[str, Mapping[int | str, LinkClass]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def of(self, model: str, count: int) -> LinkClass | None:
        """The class a request for ``count`` GPUs of ``model`` must get (None: any set)."""
        if count < 2 or not self.rules:
            return None
        for name in (model, ANY):
            entry = self.rules.get(name)
            if entry is not None:
                found = entry.get(count, entry.get(ANY))
                if found is not None:
                    return found
        return None


NONE = LinkRequired()
CLASSES = ", ".join(c.value for c in LinkClass)


def parse_link_required(setting: Any, aliases: Mapping[str, str] | None = None) -> LinkRequired:
    """The requirements of ``setting``, models named as users see them (``aliases``: NVML
    name -> the name shown). Raises ValueError naming the first bad entry."""
    if not setting:
        return NONE
    if not isinstance(setting, Mapping):
        raise ValueError(
            f"gpu_link_required must be a mapping of GPU model (or '*') to {{GPU count: link class}}, got {shown(setting)}"
        )
    aliases = aliases or {}
    rules: dict[str, dict[int | str, LinkClass]] = {}
    for model, counts in setting.items():
        if not isinstance(model, str) or not (model == ANY or MODEL_RE.fullmatch(model)):
            raise ValueError(f"gpu_link_required: {shown(model)} is not a GPU model's name (or '*')")
        where = f"gpu_link_required[{model!r}]"
        if not isinstance(counts, Mapping) or not counts:
            raise ValueError(f"{where} must map a GPU count (2 or more, or '*') to a link class, got {shown(counts)}")
        entry: dict[int | str, LinkClass] = {}
        for count, name in counts.items():
            if count != ANY and (isinstance(count, bool) or not isinstance(count, int) or count < 2):
                raise ValueError(f"{where}: {shown(count)} is not a GPU count of 2 or more (or '*')")
            try:
                entry[count] = LinkClass(name)
            except (ValueError, TypeError):
                raise ValueError(
                    f"{where}[{count!r}] = {shown(name)} is not a link class; choose one of: {CLASSES}"
                ) from None
        named = aliases.get(model, model)
        if named in rules:
            raise ValueError(f"gpu_link_required names {named} twice (once under its alias)")
        rules[named] = entry
    return LinkRequired(rules)
