"""What admins see of the cluster, one host at a time: the allocation map's
entries, and what is made of them (the map's JSON, the /hub/gpus page's
sections, the metrics' counts).

Each host's part is kept with the key it was made from and made again only
when the key changes: a report from the host's agent, a holding booked or
given back there, the host turning late or unavailable (see
:class:`~gpuspawner.cluster.views.ClusterViews`). A request then costs work for the
hosts that changed plus a join of the kept parts.

Pure and free of the cluster itself: what is made here may be made in a
thread, from inputs that are never changed once handed over.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..core.topology import Topology

__all__ = [
    "HoldersOf",
    "HostCache",
    "Maker",
    "batches",
    "device_entry",
    "host_counts",
    "host_entries",
    "host_json",
    "join_json",
    "make_hosts",
]

GIL_PAUSE = 0.0001  # seconds a thread making hosts' parts pauses after each host, for the event loop to take the GIL

#: Who holds a device (by UUID): ``[{"user", "server", "share"}, ...]`` by holder name.
HoldersOf = Callable[[str], list[dict]]
#: ``make(host, entries, stale)``: one host's part from its alloc-map entries and
#: why its agent is late (None when it is not).
Maker = Callable[[str, dict[str, dict], "str | None"], Any]


def device_entry(state, holders: list[dict], stale: str | None, topology: Topology | None = None) -> dict:
    """One device in the allocation map (``state``: a cluster DeviceState); where its
    node says how its GPUs are linked, its ``links`` to each other GPU there (e.g.
    "2 NVLinks", "across CPUs", "unknown") and its ``numa_node`` (None: not known)."""
    gpu = state.gpu
    linked = {}
    if topology is not None:
        linked = {
            "links": {u: topology.link(gpu.uuid, u).words for u in topology.peers(gpu.uuid)},
            "numa_node": topology.numa.get(gpu.uuid),
        }
    return linked | {
        "model": gpu.model,
        "index": gpu.index,
        "memory_mib": gpu.memory_mib,
        "allocated": round(sum(h["share"] for h in holders), 6),
        "health": "unhealthy" if state.problems else ("stale" if stale is not None else "ok"),
        "problems": state.problems + ([stale] if stale is not None else []),
        "holders": holders,
        "source": state.source,
        "temperature_c": state.temperature_c,
        "utilization_gpu": state.utilization_gpu,
    }


def host_entries(
    states: Iterable, holders: Mapping[str, list[dict]], stale: str | None, topology: Topology | None = None
) -> dict[str, dict]:
    """A host's devices by UUID, in device order, as the allocation map lists them."""
    return {
        state.gpu.uuid: device_entry(state, holders.get(state.gpu.uuid, []), stale, topology)
        for state in sorted(states, key=lambda s: s.gpu)
    }


def host_json(host: str, entries: dict[str, dict], stale: str | None = None) -> bytes:
    """A host's part of the map's JSON object; ``"</"`` escaped as tornado's json_encode does."""
    return f"{json.dumps(host)}: {json.dumps(entries)}".replace("</", "<\\/").encode()


def join_json(parts: Sequence[bytes]) -> bytes:
    """The map's JSON from its hosts' parts: byte for byte ``json_encode(alloc_map)``,
    joined in one copy (a copy of megabytes costs about 1 ms each)."""
    chunks = [b"{"]
    for part in parts:
        chunks += (part, b", ")
    chunks[-1:] = [b"}"] if parts else [b"{}"]
    return b"".join(chunks)


def batches(chunks: Iterable[bytes], size: int = 256 * 1024) -> Iterator[bytes]:
    """The chunks joined into pieces of about ``size`` bytes, to write one at a time."""
    pending: list[bytes] = []
    held = 0
    for chunk in chunks:
        pending.append(chunk)
        held += len(chunk)
        if held >= size:
            yield b"".join(pending)
            pending, held = [], 0
    if pending:
        yield b"".join(pending)


def host_counts(entries: dict[str, dict], available: bool) -> list[tuple[str, tuple]]:
    """Per model, by name: (devices, free, unhealthy, allocated share), as the metrics count them."""
    counts: dict[str, list] = {}
    for d in entries.values():
        c = counts.setdefault(d["model"], [0, 0, 0, 0.0])
        c[0] += 1
        c[1] += d["health"] == "ok" and not d["holders"] and available
        c[2] += d["health"] != "ok"
        c[3] += d["allocated"]
    return [(model, tuple(c)) for model, c in sorted(counts.items())]


def make_hosts(
    make: Maker,
    jobs: Sequence[tuple[str, Iterable, Mapping[str, list[dict]], str | None, Topology | None]],
    yield_gil: bool = False,
) -> list:
    """``make`` for each (host, device states, holders, stale, topology). ``yield_gil``:
    let other threads (the event loop) run between hosts, when made in a thread."""
    out = []
    for host, states, holders, stale, topology in jobs:
        out.append(make(host, host_entries(states, holders, stale, topology), stale))
        if yield_gil:
            time.sleep(GIL_PAUSE)
    return out


class HostCache:
    """Values made per host, each kept with the key it was made from; ``made``
    counts how many were made (tests use it to see what was recomputed)."""

    def __init__(self, maker: Any = None):
        self.maker = maker  # what made the values: another one (``!=``) starts the cache afresh
        self.values: dict[str, tuple[Hashable, Any]] = {}
        self.made = 0

    def get(self, host: str, key: Hashable) -> tuple[bool, Any]:
        kept = self.values.get(host)
        if kept is not None and kept[0] == key:
            return True, kept[1]
        return False, None

    def put(self, host: str, key: Hashable, value: Any) -> None:
        self.values[host] = (key, value)
        self.made += 1
