"""Node reports from ``gpuspawner-agent``: validated on arrival, turned into GPUs.

An agent on each GPU node posts what NVML says about its devices (see
``agent/nvml.py`` and ``agent/report.py`` for the producer). The hub trusts nothing in a report: every
field is type- and range-checked here, names that end up in constraints,
labels or env must match the same strict patterns as the static inventory,
and a report that fails gets a :class:`ReportError` whose message says which
field is wrong. Pure: no JupyterHub, no Docker.

Health is decided here, by the hub's own limits, from the raw fields (lost,
uncorrected ECC errors, temperature), so one setting on the hub applies to
every node whatever its agent was started with.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

from .enforcement import Seen
from .inventory import GPU, HOSTNAME_RE, MODEL_RE, UUID_RE
from .json_shape import JSONShapeError, check_shape
from .numbers import finite
from .topology import Topology, TopologyError, parse_topology

__all__ = [
    "MAX_INTERVAL_S",
    "MAX_REPORT_BYTES",
    "MAX_TEMPERATURE_C",
    "Conflict",
    "NodeReport",
    "ReportError",
    "ReportedDevice",
    "ReportedProcess",
    "device_problems",
    "gpus_of",
    "mig_model",
    "parse_report",
    "report_uuids",
]

MAX_INTERVAL_S = 3600  # the longest interval between reports an agent may say it keeps
# A node with 64 MIG-split GPUs reports ~100 KiB; one with 64 whole GPUs and the links of
# every pair of them (2,016 pairs) ~300 KiB.
MAX_REPORT_BYTES = 1024 * 1024
MAX_DEVICES = 64
MAX_MIG_DEVICES = 8  # NVIDIA's MIG allows 7 GPU instances per GPU
MAX_PROBLEMS = 16
MAX_PROCESSES = 4096  # per device
MAX_PID = 2**22  # Linux's pid_max limit
MAX_TEMPERATURE_C = 500  # a hotter reading is refused; the hub's gpu_max_temperature is at most this
# A swarm service's name (what the agent traced a GPU process to).
SERVICE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# A report nests six deep (report > devices > device > processes > process > holder);
# json.loads recurses once per level, so deeper bodies are refused before decoding.
MAX_DEPTH = 8
# Objects and lists in one report: 64 devices with their MIG devices and thousands
# of processes stay far below; a body of 100,000 empty lists does not.
MAX_CONTAINERS = 16384
PROFILE_CHARS = set("0123456789abcdefghijklmnopqrstuvwxyz.+")
MIG_SEPARATOR = " · MIG "


class ReportError(ValueError):
    """The report is malformed; the message names the field."""


@dataclass(frozen=True)
class Conflict:
    """A UUID a host's report names that another host has: left out of that report."""

    host: str  # the host whose report named it
    uuid: str
    owner: str  # the host that has it
    listed: bool  # the owner has it in the static inventory (else: by its agent's report)
    since: float  # wall-clock time of the first report that named it
    last: float  # wall-clock time of the latest one

    def sentence(self) -> str:
        where = "in the static inventory" if self.listed else "by its agent's report"
        return f"{self.uuid} is on {self.owner} ({where}), not on {self.host}"


@dataclass(frozen=True)
class ReportedMig:
    index: int
    uuid: str
    profile: str  # e.g. "1g.10gb"
    memory_total_mib: int
    memory_used_mib: int | None


@dataclass(frozen=True)
class ReportedProcess:
    """A compute process on a GPU, as the node's agent traced it."""

    pid: int
    used_mib: int | None
    service: str | None  # the swarm service its container belongs to; None: unattributed


@dataclass(frozen=True)
class ReportedDevice:
    index: int
    uuid: str | None  # None when the GPU was lost before NVML gave its UUID
    name: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    utilization_gpu: int | None
    temperature_c: float | None
    ecc_uncorrected: int | None
    lost: bool
    processes: int
    mig_mode: bool | None
    mig_devices: tuple[ReportedMig, ...]
    agent_problems: tuple[str, ...]  # what the agent could not read
    compute: tuple[ReportedProcess, ...] = ()  # the processes themselves


@dataclass(frozen=True)
class NodeReport:
    hostname: str
    interval: float  # seconds until the agent's next report
    driver_version: str
    cuda_version: str
    agent_version: str
    devices: tuple[ReportedDevice, ...]
    docker_default_runtime: str | None = None  # from the node's daemon.json; None: not known
    enforcement: Seen | None = None  # what enforces shares there, as the agent saw it; None: it did not look
    topology: Topology | None = None  # how its GPUs are linked; None: its agent did not say


def device_problems(
    lost: bool, ecc_uncorrected: int | None, temperature_c: float | None, max_temperature_c: float
) -> list[str]:
    """Why a GPU must not be offered; empty when it is healthy."""
    problems = []
    if lost:
        problems.append("GPU is lost (NVML_ERROR_GPU_IS_LOST)")
    if ecc_uncorrected:
        problems.append(f"{ecc_uncorrected} uncorrected ECC errors")
    if temperature_c is not None and temperature_c > max_temperature_c:
        problems.append(f"temperature {temperature_c:g} C is above {max_temperature_c:g} C")
    return problems


# -- parsing -------------------------------------------------------------------


def parse_report(body: bytes | str) -> NodeReport:
    """Validate a report body (JSON) or raise :class:`ReportError`."""
    if len(body) > MAX_REPORT_BYTES:
        raise ReportError(f"report is {len(body)} bytes; the limit is {MAX_REPORT_BYTES}")
    try:
        text = body.decode(json.detect_encoding(body)) if isinstance(body, (bytes, bytearray)) else body
    except (UnicodeDecodeError, LookupError):
        raise ReportError("report is not valid JSON: it is not UTF-8 text") from None
    _check_shape(text)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: also integers of more than 4300 digits
        raise ReportError(f"report is not valid JSON: {_one_line(exc)}") from None
    r = _Fields(data, "report")
    hostname = r.text("hostname", pattern=HOSTNAME_RE)
    devices = r.list("devices", MAX_DEVICES)
    parsed = tuple(_device(d, f"devices[{i}]") for i, d in enumerate(devices))
    uuids = [u for d in parsed for u in (d.uuid, *(m.uuid for m in d.mig_devices)) if u]
    if len(set(uuids)) != len(uuids):
        raise ReportError("report: a device UUID is listed twice")
    indices = [d.index for d in parsed]
    if len(set(indices)) != len(indices):
        raise ReportError("report: a device index is listed twice")
    whole = [d.uuid for d in parsed if d.uuid and not d.mig_mode]
    try:
        topology = None if data.get("topology") is None else parse_topology(data["topology"], whole)
    except TopologyError as exc:
        raise ReportError(f"report: {exc}") from None
    return NodeReport(
        hostname=hostname,
        interval=r.number("interval", low=1, high=MAX_INTERVAL_S),
        driver_version=r.text("driver_version", limit=64, optional=True) or "",
        cuda_version=r.text("cuda_version", limit=16, optional=True) or "",
        agent_version=r.text("agent_version", limit=32, optional=True) or "",
        devices=parsed,
        docker_default_runtime=r.text("docker_default_runtime", limit=64, optional=True),
        enforcement=_enforcement(data.get("share_enforcement")),
        topology=topology,
    )


def _enforcement(data: Any) -> Seen | None:
    if data is None:
        return None
    f = _Fields(data, "share_enforcement")
    size = f.number("hami_library_bytes", low=0, high=2**40, optional=True)
    return Seen(
        mps_control=f.flag("mps_control", optional=True),
        hami_library_bytes=None if size is None else int(size),
        mps_pipe_dir=f.text("mps_pipe_dir", limit=256, optional=True) or "",
        hami_library=f.text("hami_library", limit=256, optional=True) or "",
    )


def _check_shape(text: str) -> None:
    """Refuse a body nested deeper than a report can be, or with more objects
    and lists than one can hold (:func:`~gpuspawner.core.json_shape.check_shape`)."""
    try:
        check_shape(text, "report", MAX_DEPTH, MAX_CONTAINERS)
    except JSONShapeError as exc:
        raise ReportError(str(exc)) from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _device(data: Any, where: str) -> ReportedDevice:
    f = _Fields(data, where)
    lost = f.flag("lost")
    mig = tuple(_mig(m, f"{where}.mig_devices[{i}]") for i, m in enumerate(f.list("mig_devices", MAX_MIG_DEVICES)))
    problems = f.list("problems", MAX_PROBLEMS)
    for i, p in enumerate(problems):
        if not isinstance(p, str) or len(p) > 200 or not p.isprintable():
            raise ReportError(f"{where}.problems[{i}]: expected a line of at most 200 printable characters")
    compute = tuple(_process(p, f"{where}.processes[{i}]") for i, p in enumerate(f.list("processes", MAX_PROCESSES)))
    return ReportedDevice(
        index=f.integer("index", high=1023),
        uuid=f.text("uuid", pattern=UUID_RE, optional=lost),
        name=f.text("name", pattern=MODEL_RE, optional=lost),
        memory_total_mib=f.integer("memory_total_mib", low=1, optional=lost),
        memory_used_mib=f.integer("memory_used_mib", optional=True),
        utilization_gpu=f.integer("utilization_gpu", high=100, optional=True),
        temperature_c=f.number("temperature_c", low=-100, high=MAX_TEMPERATURE_C, optional=True),
        ecc_uncorrected=f.integer("ecc_uncorrected", optional=True),
        lost=lost,
        processes=len(compute),
        mig_mode=f.flag("mig_mode", optional=True),
        mig_devices=mig,
        agent_problems=tuple(problems),
        compute=compute,
    )


def _process(data: Any, where: str) -> ReportedProcess:
    f = _Fields(data, where)
    holder = f.data.get("holder")
    service = None
    if holder is not None:
        service = _Fields(holder, f"{where}.holder").text("service", pattern=SERVICE_RE)
    return ReportedProcess(
        pid=f.integer("pid", low=1, high=MAX_PID),
        used_mib=f.integer("used_mib", optional=True),
        service=service,
    )


def _mig(data: Any, where: str) -> ReportedMig:
    f = _Fields(data, where)
    profile = f.text("profile", limit=32)
    if not set(profile) <= PROFILE_CHARS:
        raise ReportError(f"{where}.profile: {profile!r} is not a MIG profile such as 1g.10gb")
    uuid = f.text("uuid", pattern=UUID_RE)
    if not uuid.startswith("MIG-"):
        raise ReportError(f"{where}.uuid: a MIG device's UUID starts with MIG-")
    return ReportedMig(
        index=f.integer("index", high=63),
        uuid=uuid,
        profile=profile,
        memory_total_mib=f.integer("memory_total_mib", low=1),
        memory_used_mib=f.integer("memory_used_mib", optional=True),
    )


class _Fields:
    """Typed reads from one JSON object, with messages that name the field."""

    _MISSING = object()

    def __init__(self, data: Any, where: str):
        if not isinstance(data, Mapping):
            raise ReportError(f"{where}: expected a JSON object")
        self.data, self.where = data, where

    def _get(self, key: str, optional: bool) -> Any:
        value = self.data.get(key, self._MISSING)
        if value is self._MISSING or value is None:
            if optional:
                return None
            raise ReportError(f"{self.where}: missing {key!r}")
        return value

    def _bad(self, key: str, what: str, value: Any) -> ReportError:
        shown = repr(value)
        return ReportError(f"{self.where}.{key}: expected {what}, got {shown[:60]}")

    # The overloads tell the type checker what the code guarantees: a read that
    # is not optional returns a value or raises, it never returns None.
    @overload
    def text(
        self, key: str, *, pattern: re.Pattern[str] | None = ..., limit: int = ..., optional: Literal[False] = ...
    ) -> str: ...
    @overload
    def text(
        self, key: str, *, pattern: re.Pattern[str] | None = ..., limit: int = ..., optional: bool
    ) -> str | None: ...
    def text(
        self, key: str, *, pattern: re.Pattern[str] | None = None, limit: int = 120, optional: bool = False
    ) -> str | None:
        value = self._get(key, optional)
        if value is None:
            return None
        # Printable: the text reaches pages and logs (a lone surrogate cannot even be encoded).
        if (
            not isinstance(value, str)
            or len(value) > limit
            or not value.isprintable()
            or (pattern is not None and not pattern.fullmatch(value))
        ):
            raise self._bad(
                key, "a plain name" if pattern else f"a string of at most {limit} printable characters", value
            )
        return value

    @overload
    def integer(self, key: str, *, low: int = ..., high: int = ..., optional: Literal[False] = ...) -> int: ...
    @overload
    def integer(self, key: str, *, low: int = ..., high: int = ..., optional: bool) -> int | None: ...
    def integer(self, key: str, *, low: int = 0, high: int = 2**53, optional: bool = False) -> int | None:
        value = self._get(key, optional)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self._bad(key, f"a whole number from {low} to {high}", value)
        return value

    @overload
    def number(self, key: str, *, low: float, high: float, optional: Literal[False] = ...) -> float: ...
    @overload
    def number(self, key: str, *, low: float, high: float, optional: bool) -> float | None: ...
    def number(self, key: str, *, low: float, high: float, optional: bool = False) -> float | None:
        value = self._get(key, optional)
        if value is None:
            return None
        number = finite(value)
        if number is None or not low <= number <= high:
            raise self._bad(key, f"a number from {low} to {high}", value)
        return number

    @overload
    def flag(self, key: str, *, optional: Literal[False] = ...) -> bool: ...
    @overload
    def flag(self, key: str, *, optional: bool) -> bool | None: ...
    def flag(self, key: str, *, optional: bool = False) -> bool | None:
        value = self.data.get(key, False if not optional else None)
        if value is None and optional:
            return None
        if not isinstance(value, bool):
            raise self._bad(key, "true or false", value)
        return value

    def list(self, key: str, limit: int) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > limit:
            raise self._bad(key, f"a list of at most {limit} items", value)
        return value


# -- from reports to GPUs ------------------------------------------------------------


def mig_model(parent_model: str, profile: str) -> str:
    """The model name users see for a MIG slice, e.g. 'NVIDIA A100 80GB PCIe · MIG 1g.10gb'."""
    return f"{parent_model}{MIG_SEPARATOR}{profile}"


def report_uuids(report: NodeReport) -> frozenset[str]:
    """Every UUID the report names: its GPUs' and their MIG devices'."""
    return frozenset(u for d in report.devices for u in (d.uuid, *(m.uuid for m in d.mig_devices)) if u)


def gpus_of(report: NodeReport, aliases: Mapping[str, str] | None = None) -> Iterable[tuple[GPU, ReportedDevice]]:
    """The allocatable devices of a report, each with the physical GPU it is on.

    A GPU in MIG mode is not allocatable itself; each of its MIG devices is, as
    a model of its own. ``aliases`` renames NVML names (and MIG model names)."""
    aliases = aliases or {}
    for dev in report.devices:
        if dev.uuid is None or dev.name is None or dev.memory_total_mib is None:
            continue  # lost before NVML named it: nothing to offer
        model = aliases.get(dev.name, dev.name)
        if dev.mig_mode:
            for mig in dev.mig_devices:
                name = aliases.get(mig_model(dev.name, mig.profile)) or mig_model(model, mig.profile)
                yield GPU(report.hostname, dev.index, mig.uuid, name, mig.memory_total_mib), dev
        else:
            yield GPU(report.hostname, dev.index, dev.uuid, model, dev.memory_total_mib), dev
