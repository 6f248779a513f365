"""What a user asks the allocator for: a Request (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ALL", "Request"]

#: ``Request.count`` value asking for every device of a host (of the model, if given).
ALL = "all"


@dataclass(frozen=True)
class Request:
    model: str | None = None  # None: any model
    count: int | str = 1  # 1..N, or ALL; ignored when share is given
    host: str | None = None  # pin to this host
    owner: str = ""  # the user; per-owner limits count across their servers
    share: Any = None  # a share of a GPU (Fraction, Decimal, int or float: 0.25, 1.2); None: whole GPUs
