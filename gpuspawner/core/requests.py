"""What a user asks the allocator for: a Request (pure)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ALL", "Request"]

#: ``Request.count`` value asking for every device of a host (of the model, if given).
ALL = "all"


@dataclass(frozen=True)
class Request:
    model: str | None = None  # None: any model
    count: int | str = 1  # 1..N, or ALL; ignored when milli is given
    host: str | None = None  # pin to this host
    owner: str = ""  # the user; per-owner limits count across their servers
    # A share of a GPU in thousandths (250: a quarter; 1200: 1.2 GPUs, split over
    # devices where the sharing policy allows); None: ``count`` whole GPUs.
    milli: int | None = None
    # Any of these models (one of them for all devices); None: ``model`` decides.
    models: tuple[str, ...] | None = None
    # What the server reserves on its node besides GPUs (thousandths of a CPU, MiB):
    # a host is chosen only where they fit (hosts whose CPU and memory are known).
    # With ``count=0`` and no ``milli``, a server without GPUs placed by the allocator.
    cpu_milli: int = 0
    memory_mib: int = 0
    # Only these hosts (the admin's placement constraints allow them); None: any.
    hosts: frozenset[str] | None = None
    # Hosts kept for requests ahead of this one in line (backfill, gpuspawner.plan): not chosen.
    avoid: frozenset[str] = frozenset()
