"""The idle-reclaim and held-time settings of ``c.GPUSwarmSpawner`` (docs/idle.md).

A mixin of :class:`~gpuspawner.spawn.spawner.GPUSwarmSpawner`, like
:class:`~gpuspawner.hub.settings.GPUSettings`; :meth:`ReclaimSettings.reclaim_limits`
turns them into the :class:`~gpuspawner.core.idle.Limits` one server is held to.
"""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Dict, Float, Integer, TraitError, validate
from traitlets.config import LoggingConfigurable

from ..core.access import Access
from ..core.idle import BUDGET, MAX_HOURS, Limits
from ..core.numbers import finite
from ..core.quotas import QuotaError, parse_classes, parse_quotas
from ..core.sharing import shown

__all__ = ["ReclaimSettings", "check_config"]

THRESHOLD_KEYS = {"utilization": (0, 100), "memory_mib": (0, 2**40)}


#: Seconds in a day, and in a year (365 days): the longest timeouts and intervals.
DAY = 24 * 3600
YEAR = 365 * DAY


def _plain(bound: float) -> str:
    """A bound as written in a sentence: 86400, not 86400.0 or 8.64e+04."""
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


class _Ranged:
    """What a bounded number setting refuses, and how it says so: anything outside
    ``min`` to ``max`` (other than ``off``, the value that turns it off, where it has
    one), NaN, the infinities, integers beyond a float's range, bools and anything
    not a number, each with a TraitError (the one-line configuration error) naming
    the setting, the value and the range, never an OverflowError later where the hub
    sleeps or adds the value to a clock."""

    min: Any
    max: Any
    name: str | None
    what = "a number"  # "a number of seconds", "a whole number of seconds", ...
    off: float | None = None

    @property
    def span(self) -> str:
        """The range, for the configuration reference: ``0 to 86400``, ``0, or 0.01 to 3650``."""
        range_ = f"{_plain(self.min)} to {_plain(self.max)}"
        return range_ if self.off is None else f"{_plain(self.off)}, or {range_}"

    def refusal(self, value: Any) -> TraitError:
        range_ = f"from {_plain(self.min)} up to {_plain(self.max)}"
        rule = f"{self.what} {range_}" if self.off is None else f"{self.what}: {_plain(self.off)} (off), or {range_}"
        return TraitError(f"c.GPUSwarmSpawner.{self.name} must be {rule}, got {shown(value)}")

    def within(self, number: float) -> bool:
        return number == self.off or self.min <= number <= self.max


class FiniteFloat(_Ranged, Float):
    """A number setting from ``min`` to ``max``, or ``off`` (see :class:`_Ranged`)."""

    def __init__(
        self,
        default_value: float,
        *,
        min: float,
        max: float,
        what: str = "a number",
        off: float | None = None,
        **kwargs: Any,
    ):
        self.what, self.off = what, off
        super().__init__(default_value, min=float(min), max=float(max), **kwargs)

    def validate(self, obj, value):
        number = finite(value)  # None for NaN, the infinities, 10**400, bools and text
        if number is None or not self.within(number):
            raise self.refusal(value)
        return number


class BoundedInteger(_Ranged, Integer):
    """A whole-number setting from ``min`` to ``max`` (see :class:`_Ranged`); a float
    with no fraction (``1e3``) is taken as the integer it is, as traitlets takes it."""

    def __init__(self, default_value: int, *, min: int, max: int, what: str = "a whole number", **kwargs: Any):
        self.what = what
        super().__init__(default_value, min=min, max=max, **kwargs)

    def validate(self, obj, value):
        number = int(value) if isinstance(value, float) and value.is_integer() else value  # 1e3: 1000
        if isinstance(number, bool) or not isinstance(number, int) or not self.within(number):
            raise self.refusal(value)
        return number


class ReclaimSettings(LoggingConfigurable):
    """When a server's GPUs are taken back: idle for too long, or held for too long."""

    gpu_idle_timeout = FiniteFloat(
        0.0,
        min=0,
        max=YEAR,
        what="a number of seconds",
        help="""Seconds a server's GPUs may stay idle (see ``gpu_idle_threshold``)
        before the server is stopped, after a warning of ``gpu_idle_warning``
        seconds. 0 (the default): idle servers are never stopped.""",
    ).tag(config=True)

    gpu_idle_threshold = Dict(
        {"utilization": 5, "memory_mib": None},
        help="""What counts as idle: the GPU's utilization at or below
        ``utilization`` percent and, when ``memory_mib`` is set, none of the
        server's GPU processes using more than ``memory_mib`` MiB of GPU memory.
        On a shared GPU only the server's own processes count.

        Example::

            c.GPUSwarmSpawner.gpu_idle_threshold = {"utilization": 10, "memory_mib": 1024}
        """,
    ).tag(config=True)

    gpu_idle_warning = FiniteFloat(
        900.0,
        min=0,
        max=YEAR,
        what="a number of seconds",
        help="Seconds before an idle server is stopped that its user is warned (home page, REST).",
    ).tag(config=True)

    gpu_max_hours = FiniteFloat(
        0.0,
        min=0,
        max=10 * YEAR // 3600,  # ten years
        what="a number of hours",
        help="""Hours a server may hold GPUs; it is then stopped, after a warning of
        ``gpu_max_hours_warning`` seconds, whatever its activity. 0 (the default): no limit.""",
    ).tag(config=True)

    gpu_max_hours_warning = FiniteFloat(
        900.0,
        min=0,
        max=YEAR,
        what="a number of seconds",
        help="Seconds before a server reaches ``gpu_max_hours`` that its user is warned.",
    ).tag(config=True)

    gpu_activity_updates_last_activity = Bool(
        False,
        help="""While a server's GPUs are busy, update its ``last_activity``, so that
        JupyterHub's idle culler keeps a server that computes with no browser open.""",
    ).tag(config=True)

    gpu_reclaim_interval = FiniteFloat(
        10.0,
        min=0.1,  # 0 would check without a pause, keeping the hub's loop busy
        max=3600,
        what="a number of seconds",
        help="Seconds between the hub's checks of idle and held-time limits.",
    ).tag(config=True)

    gpu_quotas = Dict(
        {},
        help="""GPUs guaranteed to JupyterHub groups, borrowed by others while idle and
        taken back with notice (docs/quotas.md): ``{group: {model: gpus}}``, or
        ``{group: {model: {"gpus": N, "borrow": B, "lend": L, "notice_minutes": M}}}``
        where ``borrow`` is how far beyond its quota the group may go (no limit when
        absent), ``lend`` how much of its quota others may borrow (all when absent) and
        ``notice_minutes`` how long a borrower is told before the GPUs are taken back
        (10). A fraction of a GPU makes a share total of a shared model. Empty (the
        default): no quotas.

        Example::

            c.GPUSwarmSpawner.gpu_quotas = {
                "lab-a": {"NVIDIA A100 80GB PCIe": 4},
                "lab-b": {"NVIDIA A100 80GB PCIe": {"gpus": 2, "borrow": 2, "lend": 1, "notice_minutes": 10}},
            }
        """,
    ).tag(config=True)

    gpu_priority_classes = Dict(
        {},
        help="""Priority classes for quotas' take-backs (docs/quotas.md), opt in:
        ``{name: {"groups": [...], "rank": N, "preemptible": bool}}``. Borrowed servers of
        lower ranks are taken back first; a class with ``preemptible: False`` is never
        stopped to give a group its quota, and its members borrow only GPUs no quota keeps
        idle. ``"*"`` in ``groups``: everyone in no other class. Empty (the default): one
        class, every borrowed server may be taken back.

        Example::

            c.GPUSwarmSpawner.gpu_priority_classes = {
                "exam": {"groups": ["exam-takers"], "rank": 30, "preemptible": False},
                "research": {"groups": ["lab-a", "lab-b"], "rank": 10},
                "best-effort": {"groups": ["*"], "rank": 0},
            }
        """,
    ).tag(config=True)

    @validate("gpu_quotas", "gpu_priority_classes")
    def _check_quotas(self, proposal):
        parse = parse_quotas if proposal["trait"].name == "gpu_quotas" else parse_classes
        try:
            parse(proposal["value"])
        except QuotaError as exc:
            raise TraitError(f"c.GPUSwarmSpawner.{exc}") from None
        return proposal["value"]

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
            except (TraitError, ValueError) as exc:  # ValueError: traitlets' repr of 10**5000
                text = str(exc)
                if not text.startswith("c.GPUSwarmSpawner."):
                    text = f"c.GPUSwarmSpawner.{name} must be {settings.traits()[name].info()}, not {shown(spawner_config[name])}"
                raise ValueError(text) from None
