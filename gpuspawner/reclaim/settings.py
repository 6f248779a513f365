"""The idle-reclaim and held-time settings of ``c.GPUSwarmSpawner`` (docs/idle.md).

A mixin of :class:`~gpuspawner.spawn.spawner.GPUSwarmSpawner`, like
:class:`~gpuspawner.hub.settings.GPUSettings`; :meth:`ReclaimSettings.reclaim_limits`
turns them into the :class:`~gpuspawner.core.idle.Limits` one server is held to.
"""

from __future__ import annotations

import math

from traitlets import Bool, Dict, Float, TraitError, validate
from traitlets.config import LoggingConfigurable

from ..core.access import Access
from ..core.idle import BUDGET, MAX_HOURS, Limits
from ..core.numbers import finite

__all__ = ["ReclaimSettings", "check_config"]

THRESHOLD_KEYS = {"utilization": (0, 100), "memory_mib": (0, 2**40)}


class FiniteFloat(Float):
    """A Float that refuses an integer beyond a float's range with a TraitError (the
    one-line configuration error), not an OverflowError from float(); NaN and the
    infinities are for each trait's own validator to refuse, with its sentence."""

    def validate(self, obj, value):
        if isinstance(value, int) and not isinstance(value, bool) and finite(value) is None:
            digits = len(str(abs(value)))
            raise TraitError(
                f"c.GPUSwarmSpawner.{self.name} must be a finite number, not an integer of {digits} digits"
            )
        return super().validate(obj, value)


def _seconds(proposal, what: str) -> float:
    value = proposal["value"]
    if not math.isfinite(value) or value < 0:
        raise TraitError(f"{what} must be a number of seconds from 0 up, not {value!r}")
    return value


class ReclaimSettings(LoggingConfigurable):
    """When a server's GPUs are taken back: idle for too long, or held for too long."""

    gpu_idle_timeout = FiniteFloat(
        0.0,
        help="""Seconds a server's GPUs may stay idle (see ``gpu_idle_threshold``)
        before the server is stopped, after a warning of ``gpu_idle_warning``
        seconds. 0 (the default): idle servers are never stopped.""",
    ).tag(config=True)

    gpu_idle_threshold = Dict(
        {"utilization": 5, "memory_mib": None},
        help="""What counts as idle: the GPU's utilization at or below
        ``utilization`` percent and, when ``memory_mib`` is set, none of the
        server's GPU processes using more than ``memory_mib`` MiB of GPU memory.
        On a shared GPU only the server's own processes count.""",
    ).tag(config=True)

    gpu_idle_warning = FiniteFloat(
        900.0,
        help="Seconds before an idle server is stopped that its user is warned (home page, REST).",
    ).tag(config=True)

    gpu_max_hours = FiniteFloat(
        0.0,
        help="""Hours a server may hold GPUs; it is then stopped, after a warning of
        ``gpu_max_hours_warning`` seconds, whatever its activity. 0 (the default): no limit.""",
    ).tag(config=True)

    gpu_max_hours_warning = FiniteFloat(
        900.0, help="Seconds before a server reaches ``gpu_max_hours`` that its user is warned."
    ).tag(config=True)

    gpu_activity_updates_last_activity = Bool(
        False,
        help="""While a server's GPUs are busy, update its ``last_activity``, so that
        JupyterHub's idle culler keeps a server that computes with no browser open.""",
    ).tag(config=True)

    gpu_reclaim_interval = FiniteFloat(10.0, help="Seconds between the hub's checks of idle and held-time limits.").tag(
        config=True
    )

    @validate("gpu_idle_timeout", "gpu_idle_warning", "gpu_max_hours_warning", "gpu_reclaim_interval")
    def _check_seconds(self, proposal):
        return _seconds(proposal, f"c.GPUSwarmSpawner.{proposal['trait'].name}")

    @validate("gpu_max_hours")
    def _check_hours(self, proposal):
        value = proposal["value"]
        if not math.isfinite(value) or value < 0:
            raise TraitError(f"c.GPUSwarmSpawner.gpu_max_hours must be a number of hours from 0 up, not {value!r}")
        return value

    @validate("gpu_idle_threshold")
    def _check_threshold(self, proposal):
        value = {"utilization": 5, "memory_mib": None, **proposal["value"]}
        unknown = set(value) - set(THRESHOLD_KEYS)
        if unknown:
            raise TraitError(
                f"c.GPUSwarmSpawner.gpu_idle_threshold: unknown key {sorted(unknown)[0]!r}; "
                f"it takes {', '.join(sorted(THRESHOLD_KEYS))}"
            )
        for key, (low, high) in THRESHOLD_KEYS.items():
            v = value.get(key)
            if v is None and key == "memory_mib":
                continue
            number = finite(v)
            if number is None or not low <= number <= high:
                raise TraitError(f"c.GPUSwarmSpawner.gpu_idle_threshold[{key!r}] must be a number from {low} to {high}")
        return value

    def reclaim_limits(self) -> Limits:
        """The limits this server is held to: its user's access rules where they set
        ``idle_timeout``, ``idle_threshold`` or ``max_hours`` (docs/access.md), else these settings."""
        access = self._access() if hasattr(self, "_access") else Access(max_gpus=0)
        threshold = self.gpu_idle_threshold
        memory = threshold.get("memory_mib")
        max_held = access.resolved("max_hours", self.gpu_max_hours) * 3600 or None
        # The server's time within a weekly budget (set at its start), where shorter.
        budget = getattr(self, "gpu_budget_hours", None)
        by_budget = budget is not None and (max_held is None or budget * 3600 < max_held)
        return Limits(
            idle_timeout=access.resolved("idle_timeout", self.gpu_idle_timeout) or None,
            idle_warning=self.gpu_idle_warning,
            idle_utilization=access.resolved("idle_threshold", float(threshold.get("utilization", 5))),
            idle_memory_mib=None if memory is None else int(memory),
            max_held=budget * 3600 if by_budget else max_held,
            max_held_warning=self.gpu_max_hours_warning,
            max_held_reason=BUDGET if by_budget else MAX_HOURS,
        )


def check_config(spawner_config) -> None:
    """Raise ValueError, naming the setting, for a bad reclaim setting in the hub's config."""
    settings = ReclaimSettings()
    for name in settings.trait_names(config=True):
        if name in spawner_config and name in ReclaimSettings.class_trait_names():
            try:
                setattr(settings, name, spawner_config[name])
            except TraitError as exc:
                text = str(exc)
                if not text.startswith("c.GPUSwarmSpawner."):
                    text = f"c.GPUSwarmSpawner.{name} must be a number, not {spawner_config[name]!r}"
                raise ValueError(text) from None
