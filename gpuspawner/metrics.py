"""Prometheus metrics, in the hub's own registry (they show at the hub's /metrics).

Device counts and allocated shares are read from the cluster when Prometheus
scrapes (a collector), so they are never out of date and cost nothing between
scrapes. Decisions are counted as they happen.

================================================  =====================================
``gpuspawner_devices{model}``                     devices known (healthy or not)
``gpuspawner_devices_free{model}``                healthy devices nobody holds, on an available node
``gpuspawner_devices_unhealthy{model}``           lost, ECC errors, too hot, or a late node
``gpuspawner_allocated_share{model}``             sum of the shares held (a whole GPU is 1)
``gpuspawner_allocations_granted_total{model}``   requests that got devices
``gpuspawner_allocations_refused_total{reason}``  ``capacity`` (409: not now), ``request`` (400: never as asked)
``gpuspawner_allocation_seconds``                 time the allocator took to decide
``gpuspawner_event_loop_lag_seconds``             how late the hub's event loop woke a 50 ms timer
``gpuspawner_double_bookings_total``              devices reconciliation found booked by two services
``gpuspawner_line_length{model}``                 requests waiting in line (docs/line.md)
``gpuspawner_wait_seconds{model}``                how long served requests waited in line
================================================  =====================================

The four device gauges carry a ``host`` label too with ``gpu_metrics_per_host``. With
``gpu_metrics_per_holder``, each holder's GPU memory too, per device it holds
(``{user,server,model,host,uuid}``): ``gpuspawner_holder_memory_used_bytes`` (its own
processes', at the node's last report) and ``gpuspawner_holder_memory_entitled_bytes``
(what its share there comes with). Off by default: a series per server and device, and a
new one at each server's start, is more than most Prometheus setups want; the number over
their share is ``gpuspawner_holders_over_memory{model}`` (reclaim/reclaimer.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

__all__ = [
    "ALLOCATION_SECONDS",
    "GRANTED",
    "REFUSED",
    "WAIT_SECONDS",
    "DeviceGauges",
    "HolderMemoryGauges",
    "hide",
    "line_lengths",
    "show",
]

GRANTED = Counter("gpuspawner_allocations_granted", "GPU requests that got devices", ["model"])
DOUBLE_BOOKINGS = Counter(
    "gpuspawner_double_bookings", "Devices that reconciliation found booked by two services (or above 1 in shares)"
)
# reason: capacity (none free now), request (never as asked), access (gpu_access forbids it), budget (weekly GPU-hours used up)
REFUSED = Counter("gpuspawner_allocations_refused", "GPU requests refused, by reason", ["reason"])
ALLOCATION_SECONDS = Histogram(
    "gpuspawner_allocation_seconds",
    "Time the allocator took to decide a request",
    buckets=(1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1),
)

LINE_LENGTH = Gauge("gpuspawner_line_length", "Requests waiting in line for a GPU model", ["model"])
WAIT_SECONDS = Histogram(
    "gpuspawner_wait_seconds",
    "How long requests that got their GPUs had waited in line",
    ["model"],
    buckets=(10, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 28800),
)


def line_lengths(lengths: dict[str, int], shown: set[str]) -> None:
    """Each model's line length; a model in ``shown`` (the line's models shown so far,
    updated here) whose line emptied shows 0."""
    for model in shown - set(lengths):
        LINE_LENGTH.labels(model).set(0)
    for model, n in lengths.items():
        LINE_LENGTH.labels(model).set(n)
    shown.update(lengths)


EVENT_LOOP_LAG = Histogram(
    "gpuspawner_event_loop_lag_seconds",
    "How much later than asked the hub's event loop woke a 50 ms timer: the longest it was blocked",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
)
LAG_PROBE_SECONDS = 0.05


async def watch_event_loop() -> None:
    """Runs in the hub for its life: anything that blocks the loop (a slow
    synchronous call in a handler or spawner) shows as lag here."""
    import asyncio

    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(LAG_PROBE_SECONDS)
        EVENT_LOOP_LAG.observe(max(0.0, loop.time() - start - LAG_PROBE_SECONDS))


_GAUGES = (
    ("gpuspawner_devices", "GPU devices known, healthy or not"),
    ("gpuspawner_devices_free", "Healthy GPU devices nobody holds, on available nodes"),
    ("gpuspawner_devices_unhealthy", "GPU devices not offered: lost, ECC errors, too hot, or a late node"),
    ("gpuspawner_allocated_share", "Sum of the GPU shares held (a whole GPU counts 1)"),
)


class DeviceGauges:
    """The gauges above, read from one hub's cluster at each scrape
    (``cluster()`` returns it; nothing is shown while it cannot be made).

    By default one series per model (``{model}``): what an admin needs per host
    and device is in the allocation map. With ``per_host()`` true
    (``gpu_metrics_per_host``), one per host and model (``{host,model}``). Each
    host's counts are kept by the cluster until that host changes (see
    ClusterViews.device_counts), and their samples here, so a scrape makes new
    samples only for the hosts that changed and joins the others; but
    prometheus_client then writes each of the 4 samples per host and model as text
    in JupyterHub's /hub/metrics handler, on the event loop, about 4 µs each
    (~16 ms at 1,000 hosts: see docs/benchmarks.md)."""

    def __init__(self, cluster: Callable[[], Any], per_host: Callable[[], bool] = lambda: False):
        self.cluster = cluster
        self.per_host = per_host
        self._samples: dict[str, tuple[list, list[list]]] = {}  # host -> (its counts, its samples per gauge)

    def describe(self, labels=("model",)):  # the names, for the registry: no cluster is made for them
        return [GaugeMetricFamily(name, doc, labels=list(labels)) for name, doc in _GAUGES]

    def collect(self):
        try:
            cluster, per_host = self.cluster(), self.per_host()
        except Exception:  # noqa: BLE001 - a hub whose GPU settings cannot work shows no devices
            yield from self.describe()
            return
        if per_host:
            families = self.describe(("host", "model"))
            self._add_kept(cluster, families)
        else:
            families = self.describe()
            self._add_per_model(cluster, families)
        yield from families

    @staticmethod
    def _add_per_model(cluster, families: list[GaugeMetricFamily]) -> None:
        totals: dict[str, list[float]] = {}
        for _host, rows in cluster.views.device_counts():
            for model, values in rows:
                total = totals.setdefault(model, [0.0] * len(values))
                for i, value in enumerate(values):
                    total[i] += value
        for model, values in sorted(totals.items()):
            for family, value in zip(families, values):
                family.add_metric([model], value)

    def _add_kept(self, cluster, families: list[GaugeMetricFamily]) -> None:
        kept = self._samples
        for host, rows in cluster.views.device_counts():
            entry = kept.get(host)
            if entry is None or entry[0] is not rows:  # the cluster made this host's counts anew
                made = self.describe(("host", "model"))
                for model, values in rows:
                    for family, value in zip(made, values):
                        family.add_metric([host, model], value)
                entry = kept[host] = (rows, [family.samples for family in made])
            for family, samples in zip(families, entry[1]):
                family.samples.extend(samples)


_HOLDER_GAUGES = (
    ("gpuspawner_holder_memory_used_bytes", "GPU memory a server's own processes use on a device it holds"),
    ("gpuspawner_holder_memory_entitled_bytes", "GPU memory a server's share of a device comes with"),
)
HOLDER_LABELS = ("user", "server", "model", "host", "uuid")
MIB = 1024 * 1024

# One holder on one device: its labels (HOLDER_LABELS' order), the MiB its processes
# use there (None: not known) and the MiB its share there comes with.
HolderMemory = tuple[tuple[str, str, str, str, str], "int | None", int]


class HolderMemoryGauges:
    """Each holder's GPU memory per device (``gpu_metrics_per_holder``), read at each
    scrape from ``readings()`` while ``enabled()``; otherwise the names only, with no
    series (nothing to show, nothing for Prometheus to keep)."""

    def __init__(self, readings: Callable[[], Iterable[HolderMemory]], enabled: Callable[[], bool]):
        self.readings = readings
        self.enabled = enabled

    def describe(self):
        return [GaugeMetricFamily(name, doc, labels=list(HOLDER_LABELS)) for name, doc in _HOLDER_GAUGES]

    def collect(self):
        used, entitled = families = self.describe()
        try:
            rows = list(self.readings()) if self.enabled() else []
        except Exception:  # noqa: BLE001 - a hub whose GPU settings cannot work shows no holders
            rows = []
        for labels, used_mib, entitled_mib in rows:
            if used_mib is not None:
                used.add_metric(list(labels), used_mib * MIB)
            entitled.add_metric(list(labels), entitled_mib * MIB)
        yield from families


def show(gauges: DeviceGauges | HolderMemoryGauges) -> bool:
    """Show a hub's device gauges at /metrics; False when another hub's are
    shown already (one process, one hub)."""
    try:
        REGISTRY.register(gauges)
    except ValueError:  # its names are taken
        return False
    return True


def hide(gauges: DeviceGauges | HolderMemoryGauges) -> None:
    try:
        REGISTRY.unregister(gauges)
    except KeyError:  # never shown
        pass
