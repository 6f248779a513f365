"""Shares of a GPU: exact arithmetic and the admin's sharing policy (pure).

A share is a part of one device (0.25) or more than one (1.2, split over
several devices of one host). Inside gpuspawner every share is an integer
number of thousandths of a GPU ("milli-shares", :data:`UNIT` per device), so
sums never drift: 0.2 + 0.6 is exactly 0.8, and a device is full at exactly
1000. Numbers become thousandths where they come in (:func:`to_milli`, for the
REST options and the admin's policy) and text ("0.6", never "0.6000000001",
:func:`fmt`) where they go out: labels, env, pages and messages.

The policy says, per GPU model, whether users may ask for shares of it and
which: multiples of a quantum, or a list of allowed shares, and whether a
request may be split over several devices. It is plain data, e.g.::

    {"NVIDIA A100 80GB PCIe": {"quantum": 0.05, "split": True},
     "*": {"shares": [0.25, 0.5]},             # every other model
     "NVIDIA GeForce GTX 1070": None}          # never shared

No entry (the default) means whole GPUs only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from .memory import KEYS as MEMORY_KEYS
from .memory import MemoryPolicy, parse_policy

__all__ = [
    "entitled_mib",
    "ANY_MODEL",
    "OFF",
    "UNIT",
    "ModelSharing",
    "SharingPolicy",
    "fmt",
    "fmt_list",
    "shown",
    "split_evenly",
    "to_milli",
]

UNIT = 1000  # milli-shares in one whole GPU
MAX_SHARE = 10**6  # GPUs: far above any per-user limit, far below costly arithmetic
ANY_MODEL = "*"  # policy key for every model without an entry of its own


def to_milli(value: Any, what: str = "share") -> int:
    """A share as an exact integer of thousandths, or ValueError with a message
    a user can act on. Accepts int, Fraction, Decimal and float (read as the
    shortest decimal that prints as it: 0.1 is 0.1, not 0.1000000000000000055);
    refuses bools, strings, NaN, infinities, and anything finer than 0.001."""
    kind = type(value)
    if kind is int and -MAX_SHARE <= value <= MAX_SHARE:
        return value * UNIT
    if kind is float and -MAX_SHARE <= value <= MAX_SHARE:
        # Exact without Fraction: a decimal of at most 3 places is the float's
        # shortest form exactly when it divides back to the same float.
        milli = round(value * UNIT)
        if milli / UNIT == value:
            return milli
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, Decimal)):
        raise ValueError(f"{what} must be a number such as 0.5, got {shown(value)}")
    if isinstance(value, float) and not math.isfinite(value) or isinstance(value, Decimal) and not value.is_finite():
        raise ValueError(f"{what} must be a finite number, got {shown(value)}")
    if not -MAX_SHARE <= value <= MAX_SHARE:  # also keeps 10**5000 or Decimal("1e999999") from costly arithmetic
        raise ValueError(f"{what} must be at most {MAX_SHARE}, got {shown(value)}")
    milli = Fraction(Decimal(repr(value)) if isinstance(value, float) else value) * UNIT
    if milli.denominator != 1:
        raise ValueError(f"{what} must be a multiple of 0.001, got {shown(value)}")
    return int(milli)


@functools.lru_cache(maxsize=4096)  # refusals and labels write the same few values again and again
def fmt(milli: int) -> str:
    """Thousandths as the shortest decimal text: 600 -> '0.6', 1000 -> '1', 1650 -> '1.65'."""
    if milli < 0:
        return "-" + fmt(-milli)
    whole, part = divmod(milli, UNIT)
    if not part:
        return str(whole)
    return f"{whole}.{part:03d}".rstrip("0")


def fmt_list(milli: Iterable[int], sep: str = ",") -> str:
    """'0.6,0.6' for labels and env; ``sep=", "`` for messages."""
    return sep.join(fmt(m) for m in milli)


def entitled_mib(memory_mib: int, milli: int) -> int:
    """The memory a share of ``milli`` thousandths of a ``memory_mib`` device comes with."""
    return memory_mib * milli // UNIT


def split_evenly(total: int, n: int, quantum: int) -> tuple[int, ...] | None:
    """``total`` split over ``n`` devices as evenly as the quantum allows, the
    larger pieces first: each piece a multiple of the quantum, pieces differing
    by at most one quantum, summing to exactly ``total``. None when a piece
    would be empty or larger than a device (``total`` must be a multiple of
    the quantum). 1200 over 2 -> (600, 600); 1300 q50 -> (650, 650);
    1300 q100 -> (700, 600)."""
    units = total // quantum
    base, extra = divmod(units, n)
    if base == 0 or (base + (extra > 0)) * quantum > UNIT:
        return None
    return ((base + 1) * quantum,) * extra + (base * quantum,) * (n - extra)


@dataclass(frozen=True)
class ModelSharing:
    """How one model may be shared. Shares are milli-shares."""

    quantum: int  # every share, and every piece of a split, is a multiple of this
    allowed: tuple[int, ...] | None = None  # the only shares offered; None: any multiple of the quantum
    split: bool = False  # may a request span several devices of one host
    uneven: bool = False  # when no even split fits, may the pieces differ (the freest devices first)
    split_small: bool = False  # may a share of at most 1 GPU span devices (when no one device has room)
    memory: MemoryPolicy = MemoryPolicy()  # what happens to a holder above its share's memory

    def spans(self, share: int) -> bool:
        """Whether ``share`` may be spread over several devices: above one GPU
        where the model splits; at most one only where ``split_small`` says so."""
        return self.split and (share > UNIT or self.split_small)

    def refusal(self, share: int, model: str) -> str | None:
        """Why ``share`` is never granted for this model, or None when it may be."""
        if share <= 0:
            return "gpu_share must be more than 0"
        if self.allowed is not None and share not in self.allowed:
            return f"{fmt(share)} of a GPU is not offered for {model}; choose one of: {fmt_list(self.allowed, ', ')}"
        if share % self.quantum:
            return f"{fmt(share)} of a GPU is not offered for {model}; choose a multiple of {fmt(self.quantum)}"
        if share > UNIT and not self.split:
            return (
                f"{fmt(share)} of a GPU requested, but shares of {model} are at most 1 GPU "
                "(splitting over several devices is not enabled)"
            )
        return None

    def describe(self) -> str:
        what = f"one of {fmt_list(self.allowed, ', ')}" if self.allowed else f"multiples of {fmt(self.quantum)}"
        what += ", split over devices of one host" if self.split else ""
        what += " (also shares of at most 1 GPU)" if self.split_small else ""
        return what + (" (unevenly where no even split fits)" if self.uneven else "")


class SharingPolicy:
    """Which models may be shared, and how. Built from the admin's plain data
    by :meth:`parse`, which raises ValueError naming the bad entry."""

    def __init__(self, models: Mapping[str, ModelSharing | None] | None = None):
        self._models = dict(models or {})
        self._default = self._models.pop(ANY_MODEL, None)

    @classmethod
    def parse(cls, config: SharingPolicy | Mapping[str, Any] | None, source: str = "gpu_sharing") -> SharingPolicy:
        if config is None:
            return cls()
        if isinstance(config, SharingPolicy):
            return config
        if not isinstance(config, Mapping):
            raise ValueError(f"{source} must be a mapping of GPU model (or '*') to its sharing settings")
        models: dict[str, ModelSharing | None] = {}
        for model, entry in config.items():
            if not isinstance(model, str) or not model.strip():
                raise ValueError(f"{source}: {model!r} is not a GPU model name (or '*')")
            models[model.strip()] = _parse_entry(entry, f"{source}[{model!r}]")
        return cls(models)

    def for_model(self, model: str) -> ModelSharing | None:
        """The model's settings; None when it is never shared."""
        if model in self._models:
            return self._models[model]
        return self._default

    def shareable(self, models: Iterable[str]) -> list[str]:
        return [m for m in models if self.for_model(m) is not None]

    def accepting(self, share: int, model: str | None, models: Iterable[str]) -> list[str]:
        """The models that may take ``share`` (milli): ``model``, or any of
        ``models`` when it is None. ValueError, with what is offered, if none."""
        names = [model] if model is not None else list(models)
        ok = [m for m in names if (s := self.for_model(m)) is not None and s.refusal(share, m) is None]
        if ok:
            return ok
        if model is not None:
            sharing = self.for_model(model)
            if sharing is None:
                raise ValueError(f"{model} is not shared on this hub; ask for whole GPUs (gpu_count) instead")
            raise ValueError(sharing.refusal(share, model))
        offered = [f"{m}: {s.describe()}" for m in names if (s := self.for_model(m)) is not None]
        if not offered:
            raise ValueError("GPU sharing is not enabled on this hub; ask for whole GPUs (gpu_count) instead")
        if share <= 0:
            raise ValueError("gpu_share must be more than 0")
        raise ValueError(f"{fmt(share)} of a GPU is not offered by any model; offered: {'; '.join(offered)}")

    @property
    def uneven(self) -> bool:
        """Whether some model may be split unevenly."""
        return any(s is not None and s.uneven for s in [*self._models.values(), self._default])

    @property
    def enabled(self) -> bool:
        return self._default is not None or any(s is not None for s in self._models.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SharingPolicy) and (self._models, self._default) == (other._models, other._default)

    def __repr__(self) -> str:
        entries = dict(self._models)
        if self._default is not None:
            entries[ANY_MODEL] = self._default
        return f"SharingPolicy({entries!r})"


OFF = SharingPolicy()  # whole GPUs only: the default

_ENTRY_KEYS = ("quantum", "shares", "split", "split_small", "uneven", *MEMORY_KEYS)


def _flag(entry: Mapping, key: str, where: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _parse_entry(entry: Any, where: str) -> ModelSharing | None:
    if entry is None or entry is False:
        return None
    if entry is True:
        entry = {}
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected a mapping with {', '.join(_ENTRY_KEYS)} (or None for no sharing)")
    unknown = sorted(str(k) for k in entry if k not in _ENTRY_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(_ENTRY_KEYS)}")
    split, split_small, uneven = (_flag(entry, key, where) for key in ("split", "split_small", "uneven"))
    if uneven and not split:
        raise ValueError(f"{where}: uneven splits need split: True")
    if split_small and not split:
        raise ValueError(f"{where}: split_small needs split: True")
    allowed = None
    if "shares" in entry:
        shares = entry["shares"]
        if isinstance(shares, (str, bytes)) or not isinstance(shares, Iterable):
            raise ValueError(f"{where}: shares must be a list of numbers such as [0.25, 0.5]")
        allowed = tuple(sorted({to_milli(v, f"{where}: each of shares") for v in shares}))
        if not allowed:
            raise ValueError(f"{where}: shares is empty; leave the model out (or None) for no sharing")
        for s in allowed:
            if s <= 0:
                raise ValueError(f"{where}: shares must be more than 0, got {fmt(s)}")
            if s > UNIT and not split:
                raise ValueError(f"{where}: share {fmt(s)} is more than one GPU; it needs split: True")
    if "quantum" in entry:
        quantum = to_milli(entry["quantum"], f"{where}: quantum")
        if quantum <= 0 or UNIT % quantum:
            raise ValueError(
                f"{where}: quantum must divide 1 GPU evenly (e.g. 0.05, 0.1, 0.25, 0.5), got {fmt(quantum)}"
            )
        for s in allowed or ():
            if s % quantum:
                raise ValueError(f"{where}: share {fmt(s)} is not a multiple of the quantum {fmt(quantum)}")
    elif allowed is not None:
        # The coarsest quantum that still divides every allowed share and one GPU.
        quantum = math.gcd(UNIT, *allowed)
    else:
        raise ValueError(f"{where}: give a quantum (e.g. 0.25) or a list of shares")
    memory = parse_policy(entry, where)
    return ModelSharing(quantum, allowed, split, uneven, split_small, memory)


def shown(value: Any) -> str:
    """A user's value, quoted and cut short for an error message."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 192:
        return f"a number of about {int(value.bit_length() * 0.30103)} digits"  # repr() refuses 4,300
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a value that cannot even be shown
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."
