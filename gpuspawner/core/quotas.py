"""GPU quotas per JupyterHub group (``c.GPUSwarmSpawner.gpu_quotas``), as the admin
writes them, checked (pure). The rules that use them are in
:mod:`gpuspawner.plan.quotas`.

The setting maps a group to its quotas, one per GPU model: a number (GPUs guaranteed;
a fraction makes it a share total of a shared model), or a mapping with ``gpus`` and,
optionally, ``borrow`` (how far beyond its quota the group may go while others' quota
is idle; absent: no limit), ``lend`` (how much of its quota others may borrow while it
is idle; absent: all of it) and ``notice_minutes`` (how long a borrower is told before
the GPUs are taken back; 10 by default)::

    c.GPUSwarmSpawner.gpu_quotas = {
        "lab-a": {"NVIDIA A100 80GB PCIe": 4},
        "lab-b": {"NVIDIA A100 80GB PCIe": {"gpus": 2, "borrow": 2, "lend": 1, "notice_minutes": 10}},
    }
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .inventory import MODEL_RE
from .numbers import finite
from .sharing import UNIT, fmt, shown

__all__ = [
    "EVERYONE_ELSE",
    "KEYS",
    "NOTICE",
    "PriorityClass",
    "Quota",
    "QuotaError",
    "class_of",
    "parse_classes",
    "parse_quotas",
    "unmet",
]

NOTICE = timedelta(minutes=10)  # a borrowed holding is taken back this long after its user is told
KEYS = ("gpus", "borrow", "lend", "notice_minutes")
MAX_GPUS = 100_000  # as gpu_access's max_gpus: more than any swarm holds
MAX_NOTICE_MINUTES = 7 * 24 * 60


class QuotaError(ValueError):
    """A quota setting that cannot work; the message names it."""


@dataclass(frozen=True)
class Quota:
    """``group``'s guarantee of ``model``: ``milli`` thousandths (whole GPUs: a
    multiple of 1000), at most ``borrow`` thousandths beyond it (None: no limit) and
    at most ``lend`` of it lent to others (None: all of it); a borrower is told
    ``notice`` before the GPUs are taken back."""

    group: str
    model: str
    milli: int
    borrow: int | None = None
    lend: int | None = None
    notice: timedelta = NOTICE

    @property
    def whole(self) -> bool:
        """A quota of whole GPUs (it keeps untouched devices); else a share total (room)."""
        return self.milli % UNIT == 0

    @property
    def amount(self) -> str:
        """E.g. "4 NVIDIA A100 80GB PCIe" or "2.5 of NVIDIA A100 80GB PCIe"."""
        return f"{fmt(self.milli)} {self.model}" if self.whole else f"{fmt(self.milli)} of {self.model}"


def _gpus(where: str, value: Any, *, zero: bool = True) -> int:
    """A number of GPUs (to the thousandth), as thousandths."""
    number = finite(value) if not isinstance(value, bool) else None
    if number is None or not (0 <= number <= MAX_GPUS) or (not zero and number == 0):
        least = "from 0" if zero else "above 0,"
        raise QuotaError(f"{where} must be a number of GPUs {least} up to {MAX_GPUS}, got {shown(value)}")
    milli = round(number * UNIT)
    if abs(milli - number * UNIT) > 1e-6:
        raise QuotaError(f"{where} must be a whole number of thousandths of a GPU, got {shown(value)}")
    return milli


def parse_quotas(setting: Any, aliases: Mapping[str, str] | None = None) -> list[Quota]:
    """The quotas of ``setting`` (group -> {model: GPUs or {gpus, borrow, lend,
    notice_minutes}}), models named as users see them (``aliases``: NVML name -> the
    name shown). Raises QuotaError naming the first bad entry."""
    if setting is None:
        return []
    if not isinstance(setting, Mapping):
        raise QuotaError(f"gpu_quotas must be a mapping of JupyterHub group to its quotas, got {shown(setting)}")
    aliases = aliases or {}
    out = []
    for group, per_model in setting.items():
        if not isinstance(group, str) or not group.strip() or len(group) > 255:
            raise QuotaError(f"gpu_quotas: a group must be a JupyterHub group's name, got {shown(group)}")
        if not isinstance(per_model, Mapping) or not per_model:
            raise QuotaError(f"gpu_quotas[{group!r}] must map a GPU model to its quota, got {shown(per_model)}")
        for model, spec in per_model.items():
            if not isinstance(model, str) or not MODEL_RE.fullmatch(model):
                raise QuotaError(f"gpu_quotas[{group!r}]: {shown(model)} is not a GPU model's name")
            where = f"gpu_quotas[{group!r}][{model!r}]"
            if not isinstance(spec, Mapping):
                spec = {"gpus": spec}
            unknown = sorted(str(k) for k in spec if k not in KEYS)
            if unknown:
                raise QuotaError(f"{where}: unknown keys {', '.join(unknown)} (known: {', '.join(KEYS)})")
            if "gpus" not in spec:
                raise QuotaError(f"{where} needs gpus, the number of GPUs guaranteed")
            milli = _gpus(f"{where}['gpus']", spec["gpus"], zero=False)
            borrow = None if spec.get("borrow") is None else _gpus(f"{where}['borrow']", spec["borrow"])
            lend = None if spec.get("lend") is None else _gpus(f"{where}['lend']", spec["lend"])
            if lend is not None and lend > milli:
                raise QuotaError(f"{where}: lend ({fmt(lend)}) is more than the quota itself ({fmt(milli)})")
            minutes = spec.get("notice_minutes", NOTICE.total_seconds() / 60)
            number = finite(minutes) if not isinstance(minutes, bool) else None
            if number is None or not 0 <= number <= MAX_NOTICE_MINUTES:
                raise QuotaError(
                    f"{where}['notice_minutes'] must be a number from 0 up to {MAX_NOTICE_MINUTES}, got {shown(minutes)}"
                )
            out.append(Quota(group, aliases.get(model, model), milli, borrow, lend, timedelta(minutes=number)))
    seen: dict[tuple[str, str], int] = {}
    for q in out:
        key = (q.group, q.model)
        if key in seen:
            raise QuotaError(f"gpu_quotas[{q.group!r}] names {q.model} twice (once under its alias)")
        seen[key] = 1
    return out


def unmet(quotas: Iterable[Quota], capacity: Mapping[str, int]) -> list[str]:
    """What cannot all be met on the GPUs there are now (``capacity``: model -> GPUs, in
    thousandths): a line per model whose quotas add up to more, or that no node has."""
    total: dict[str, list[Quota]] = {}
    for q in quotas:
        total.setdefault(q.model, []).append(q)
    out = []
    for model, qs in sorted(total.items()):
        have = capacity.get(model, 0)
        want = sum(q.milli for q in qs)
        groups = ", ".join(f"{q.group} {fmt(q.milli)}" for q in qs)
        if have == 0:
            out.append(f"quotas of {model} ({groups}): no node has that model now")
        elif want > have:
            out.append(f"quotas of {model} add up to {fmt(want)} ({groups}), more than the {fmt(have)} there are")
    return out


EVERYONE_ELSE = "*"  # in a class's groups: users in none of the other classes' groups
CLASS_KEYS = ("groups", "rank", "preemptible")


@dataclass(frozen=True)
class PriorityClass:
    """An admin's class of users (``c.GPUSwarmSpawner.gpu_priority_classes``): its
    ``groups`` (``"*"``: everyone in no other class), its ``rank`` (borrowed servers of
    lower ranks are taken back first) and whether its servers may be taken back at all
    (``preemptible``; a class that may not be is never stopped for a quota, and borrows
    only GPUs no quota keeps idle)."""

    name: str
    groups: frozenset[str]
    rank: int = 0
    preemptible: bool = True


def parse_classes(setting: Any) -> list[PriorityClass]:
    """The classes of ``setting`` (name -> {groups, rank, preemptible}), highest rank
    first. Raises QuotaError naming the first bad entry."""
    if not setting:
        return []
    if not isinstance(setting, Mapping):
        raise QuotaError(f"gpu_priority_classes must be a mapping of class name to its settings, got {shown(setting)}")
    out = []
    for name, spec in setting.items():
        where = f"gpu_priority_classes[{name!r}]"
        if not isinstance(name, str) or not name.strip() or len(name) > 100:
            raise QuotaError(f"gpu_priority_classes: a class needs a name of 1 to 100 characters, got {shown(name)}")
        if not isinstance(spec, Mapping):
            raise QuotaError(f"{where} must be a mapping with groups, rank and preemptible, got {shown(spec)}")
        unknown = sorted(str(k) for k in spec if k not in CLASS_KEYS)
        if unknown:
            raise QuotaError(f"{where}: unknown keys {', '.join(unknown)} (known: {', '.join(CLASS_KEYS)})")
        groups = spec.get("groups")
        if (
            not isinstance(groups, (list, tuple))
            or not groups
            or not all(isinstance(g, str) and g.strip() and len(g) <= 255 for g in groups)
        ):
            raise QuotaError(
                f"{where}['groups'] must be a list of JupyterHub group names (or '*'), got {shown(groups)}"
            )
        rank = spec.get("rank", 0)
        if isinstance(rank, bool) or not isinstance(rank, int) or not -1000 <= rank <= 1000:
            raise QuotaError(f"{where}['rank'] must be a whole number from -1000 up to 1000, got {shown(rank)}")
        preemptible = spec.get("preemptible", True)
        if not isinstance(preemptible, bool):
            raise QuotaError(f"{where}['preemptible'] must be true or false, got {shown(preemptible)}")
        out.append(PriorityClass(name, frozenset(groups), rank, preemptible))
    claimed: dict[str, str] = {}
    for c in out:
        for g in c.groups:
            if g in claimed:
                raise QuotaError(f"gpu_priority_classes: the group {g!r} is in both {claimed[g]!r} and {c.name!r}")
            claimed[g] = c.name
    return sorted(out, key=lambda c: (-c.rank, c.name))


def class_of(classes: Iterable[PriorityClass], groups: Iterable[str]) -> PriorityClass | None:
    """The class of a user in ``groups``: the highest-ranked whose groups include one of
    theirs, else the one of ``"*"`` (None: no class applies, as without classes)."""
    mine = set(groups)
    classes = list(classes)
    for c in classes:  # highest rank first
        if not c.groups.isdisjoint(mine):
            return c
    return next((c for c in classes if EVERYONE_ELSE in c.groups), None)
