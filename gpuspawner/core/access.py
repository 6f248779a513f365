"""Access rules per JupyterHub group (``c.GPUSwarmSpawner.gpu_access``).

Pure: the rules as the admin wrote them, checked (:meth:`AccessRules.parse`),
and :meth:`AccessRules.effective`, what one user may have given the groups
they are in: the most generous of each setting across those groups. ``"*"``
holds the rules of users in none of the listed groups. Without rules (an
empty ``gpu_access``) everybody gets every model and the hub's
``max_gpus_per_user``, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .numbers import finite
from .requests import ALL
from .sharing import shown

__all__ = ["EVERYONE_ELSE", "KEYS", "MAX_GPUS", "Access", "AccessRules"]

EVERYONE_ELSE = "*"
KEYS = ("models", "max_gpus", "priority", "max_hours", "weekly_gpu_hours", "idle_timeout", "idle_threshold")
_HOURS = ("max_hours", "weekly_gpu_hours")  # numbers > 0
MAX_GPUS = 100_000  # the most GPUs a limit may name (here and max_gpus_per_user): more than any swarm holds
# Each number's range, as the hub-wide settings have theirs: a value beyond it (10**400,
# NaN) would overflow the line's database column, a page's text or a clock.
_RANGES = {
    "max_gpus": (0, MAX_GPUS),
    "priority": (-1_000_000, 1_000_000),
    "max_hours": (0, 87_600),  # above 0; ten years, as gpu_max_hours
    "weekly_gpu_hours": (0, 168 * MAX_GPUS),  # above 0; every GPU a user may hold, all week
    "idle_timeout": (0, 365 * 24 * 3600),  # a year, as gpu_idle_timeout
    "idle_threshold": (0, 100),  # a utilization, in percent
}
# Absent from a group: the hub's own setting (gpu_max_hours, gpu_idle_timeout,
# gpu_idle_threshold), which then counts as that group's value in a merge.
HUB_SETTINGS = ("max_hours", "idle_timeout", "idle_threshold")


@dataclass(frozen=True)
class Access:
    """What one user may have."""

    max_gpus: int  # across all their servers; shares count as their fraction
    models: frozenset[str] | None = None  # None: every model
    priority: int = 0  # in the line for a model: higher first
    weekly_gpu_hours: float | None = None  # GPU-hours over the last 7 days (None: no limit)
    # HUB_SETTINGS: the most generous among the user's groups that set them (None:
    # none does), and the keys some of those groups leave to the hub (see resolved()).
    max_hours: float | None = None  # a server may hold GPUs this long
    idle_timeout: float | None = None  # seconds idle before a stop (0: never)
    idle_threshold: float | None = None  # utilization (%) at or below which a GPU is idle
    hub_defaults: frozenset[str] = frozenset()
    groups: tuple[str, ...] = field(default=())  # the rules' groups this comes from

    def resolved(self, key: str, hub: float) -> float:
        """One of HUB_SETTINGS for this user, the hub's own setting ``hub``
        standing in for each of their groups that leaves it unset: the most
        generous value (the longest time, 0 for none; the lowest threshold)."""
        own = getattr(self, key)
        values = [own] if own is not None else []
        if own is None or key in self.hub_defaults:
            values.append(hub)
        return _most_generous(key, values)

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    @property
    def cpu_only(self) -> bool:
        return self.max_gpus == 0 or self.models == frozenset()

    def offered(self, models: Iterable[str]) -> list[str]:
        """Those of ``models`` this user may have, in the order given."""
        return [m for m in models if self.allows(m)]

    def describe(self, models: Iterable[str]) -> str:
        """One sentence: what this user may have of ``models`` (the hub's now)."""
        several = len(self.groups) > 1
        whose = f"Your group{'s' * several} ({', '.join(self.groups)}) allow{'' if several else 's'}"
        if self.groups == (EVERYONE_ELSE,):
            whose = "Users in none of the hub's GPU groups may have"
        offered = self.offered(models)
        if self.cpu_only or not offered:
            return f"{whose} CPU-only servers only."
        n = self.max_gpus
        return f"{whose} {', '.join(offered)}, up to {n} GPU{'s' if n != 1 else ''} at a time."

    def refusal(self, options: Any, models: Iterable[str]) -> str | None:
        """Why the user's raw ``options`` ask for more than this allows (None:
        they do not). Only what the rules decide is checked here; the rest
        (types, names) is parse_user_options's, with the offered models."""
        if not isinstance(options, Mapping) or not self.groups:
            return None  # under no rule (no gpu_access, or in no listed group): as without rules
        model, count, share = (options.get(k) for k in ("gpu_model", "gpu_count", "gpu_share"))
        asks = share is not None or model is not None or (_number(count) and count != 0) or count == ALL
        if not asks:
            return None
        models = list(models)
        if self.cpu_only:
            return self.describe(models)
        if model is None and self.models is not None:
            return f"Choose a GPU model (gpu_model). {self.describe(models)}"
        if isinstance(model, str) and model in models and not self.allows(model):
            return f"{model} is not available to you. {self.describe(models)}"
        asked = share if _number(share) else count if _number(count) else None
        if asked is not None and asked > self.max_gpus:
            return f"{shown(asked)} GPUs requested. {self.describe(models)}"
        return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class AccessRules:
    """``gpu_access``, checked: {group: its settings}, and the hub's default limit."""

    groups: Mapping[str, Mapping[str, Any]]
    default_max_gpus: int

    @property
    def active(self) -> bool:
        return bool(self.groups)

    @classmethod
    def parse(cls, config: Any, *, default_max_gpus: int, aliases: Mapping[str, str] | None = None) -> AccessRules:
        """Check ``config``; raise ValueError naming the group and key at fault.
        Model names are the hub's names for them: an NVML name with an alias
        in ``aliases`` becomes its alias."""
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise ValueError(f"gpu_access must be a mapping of group name to its rules, got {shown(config)}")
        groups = {}
        for group, rules in config.items():
            if not isinstance(group, str) or not group:
                raise ValueError(f"gpu_access: group names must be non-empty strings, got {shown(group)}")
            groups[group] = _parse_group(group, rules, aliases or {})
        return cls(groups, default_max_gpus)

    def effective(self, groups: Iterable[str]) -> Access:
        """What a user in ``groups`` may have: the most generous of each
        setting across the listed ones among them (``"*"``'s if none is listed)."""
        if not self.groups:
            return Access(max_gpus=self.default_max_gpus)
        names = sorted({g for g in groups if g in self.groups and g != EVERYONE_ELSE})
        if not names:
            if EVERYONE_ELSE not in self.groups:
                return Access(max_gpus=self.default_max_gpus)
            names = [EVERYONE_ELSE]
        rules = [self.groups[g] for g in names]
        return Access(
            max_gpus=max(r.get("max_gpus", self.default_max_gpus) for r in rules),
            models=_union(r.get("models") for r in rules),
            priority=max(r.get("priority", 0) for r in rules),
            groups=tuple(names),
            weekly_gpu_hours=_unlimited_max(r.get("weekly_gpu_hours") for r in rules),
            **{k: _most_generous(k, [r[k] for r in rules if k in r]) for k in HUB_SETTINGS},
            hub_defaults=frozenset(k for k in HUB_SETTINGS if any(k not in r for r in rules)),
        )

    def unknown_models(self, known: Iterable[str]) -> list[str]:
        """'group: model' for each model a rule names that is not in ``known``."""
        known = set(known)
        return [f"{g}: {m}" for g, r in self.groups.items() for m in sorted(r.get("models") or ()) if m not in known]


def _union(models: Iterable[frozenset[str] | None]) -> frozenset[str] | None:
    out: set[str] = set()
    for m in models:
        if m is None:
            return None
        out |= m
    return frozenset(out)


def _most_generous(key: str, values: list[float]) -> float | None:
    """None for no values; a lower threshold counts fewer servers as idle; a time of 0 is no limit."""
    if not values:
        return None
    if key == "idle_threshold":
        return min(values)
    return 0.0 if 0 in values else max(values)


def _unlimited_max(values: Iterable[float | None]) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else max(values)  # type: ignore[type-var]


def _parse_group(group: str, rules: Any, aliases: Mapping[str, str]) -> dict[str, Any]:
    where = f"gpu_access[{group!r}]"
    if not isinstance(rules, Mapping):
        raise ValueError(f"{where} must be a mapping with keys {', '.join(KEYS)}, got {shown(rules)}")
    unknown = sorted(str(k) for k in rules if k not in KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; valid keys: {', '.join(KEYS)}")
    out: dict[str, Any] = {}
    for key, value in rules.items():
        if key == "models" and value != "*":
            if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
                raise ValueError(f"{where}['models'] must be \"*\" or a list of model names, got {shown(value)}")
            if not all(isinstance(m, str) and m for m in value):
                raise ValueError(f"{where}['models'] must list model names (strings), got {shown(value)}")
            out[key] = frozenset(aliases.get(m, m) for m in value)
        elif key in ("max_gpus", "priority"):
            low, high = _RANGES[key]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{where}['{key}'] must be a whole number from {low} to {high}, got {shown(value)}")
            out[key] = value
        elif key != "models":
            out[key] = _number_in(where, key, value)
    return out


def _number_in(where: str, key: str, value: Any) -> float:
    low, high = _RANGES[key]
    positive = key in _HOURS
    number = finite(value)
    if number is None or not (low < number if positive else low <= number) or number > high:
        bounds = f"> {low} and at most {high}" if positive else f"from {low} to {high}"
        raise ValueError(f"{where}['{key}'] must be a number {bounds}, got {shown(value)}")
    return number
