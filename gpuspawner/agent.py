"""gpuspawner-agent: what the GPUs on this node look like right now, via NVML.

Runs on each GPU node. ``probe`` prints one report; ``run`` posts one to the hub
every few seconds. It talks to the driver through the official bindings
(nvidia-ml-py, module ``pynvml``), which dlopen ``libnvidia-ml.so.1`` on first init.

Deliberately imports neither docker nor jupyterhub: nodes run only this.
``device_problems`` is the health rule, pure, so the hub can apply the same one.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ._version import __version__
from .reports import device_problems as health_rule

PROG = "gpuspawner-agent"
DEFAULT_MAX_TEMPERATURE_C = 90
DEFAULT_INTERVAL_S = 15.0
DEFAULT_TIMEOUT_S = 10.0
# Retries after failures wait interval, 2 × interval, 4 × … up to this cap.
MAX_BACKOFF_S = 300.0
MAX_BACKOFF_INTERVALS = 20
MIB = 1024 * 1024
TOKEN_ENV = "GPUSPAWNER_AGENT_TOKEN"
HOSTNAME_ENV = "GPUSPAWNER_AGENT_HOSTNAME"
REPORT_PATH = "hub/api/gpuspawner/report"

NO_LIBRARY = f"{PROG}: no NVIDIA driver library (libnvidia-ml.so.1) found on this node"
NO_DRIVER = f"{PROG}: the NVIDIA driver library is installed but the NVIDIA kernel driver is not loaded on this node"
NO_TOKEN = (
    f"{PROG}: no hub token: pass --token-file FILE or set {TOKEN_ENV} "
    "(the token the hub's configuration gives the agents)"
)

log = logging.getLogger(PROG)


class AgentError(Exception):
    """A node-level failure; str() is the one sentence shown to the operator."""


class HubError(Exception):
    """A report did not get through; str() says why in one line."""


def _cuda_version_string(v: int) -> str:
    # NVML encodes CUDA versions as 1000*major + 10*minor (12040 -> "12.4").
    return f"{v // 1000}.{(v % 1000) // 10}"


# ---- health ----


def device_problems(info: dict, max_temperature_c: float) -> list[str]:
    """The health rule (reports.device_problems, the one the hub applies) for
    one device record of a report."""
    return health_rule(
        info.get("lost", False), info.get("ecc_uncorrected"), info.get("temperature_c"), max_temperature_c
    )


# ---- MIG profiles ----

# Drivers name a MIG device after its GPU and profile: "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
# "… MIG 1c.2g.20gb" (a compute instance smaller than its GPU instance), "… MIG 1g.10gb+me".
_MIG_NAME = re.compile(r"(?:^|\s)MIG\s+(\d+(?:c\.\d+)?g\.\d+gb\S*)\s*$")


def mig_profile_from_name(name: str | None) -> str | None:
    """The profile in a MIG device's NVML name, as nvidia-smi shows it; None if absent."""
    m = _MIG_NAME.search(name or "")
    return m.group(1) if m else None


def mig_profile_from_attributes(
    gi_slices: int, ci_slices: int, memory_size_mb: int, gpu_memory_mib: int | None
) -> str | None:
    """A profile name rebuilt from nvmlDeviceGetAttributes, for drivers whose MIG names lack it.

    Memory is rounded the way NVIDIA's own tools (go-nvlib) do: the share of the GPU's
    memory, up to the next eighth, times the GPU's memory in whole GB; rounding the
    slice's own size instead gives names like 7g.79gb for what the driver calls 7g.80gb.
    """
    if not gi_slices or not memory_size_mb or not gpu_memory_mib:
        return None
    share = math.ceil(memory_size_mb / gpu_memory_mib * 8) / 8
    gb = int(share * math.ceil(gpu_memory_mib / 1024) + 0.5)
    profile = f"{gi_slices}g.{gb}gb"
    if ci_slices and ci_slices != gi_slices:
        profile = f"{ci_slices}c.{profile}"
    return profile


# ---- NVML ----


class _Device:
    """Collects one device's fields; turns per-call NVML errors into state, not exceptions."""

    def __init__(self, nvml, position: int):
        self.nvml = nvml
        self.lost = False
        self.problems: list[str] = []
        self.info = {
            "index": position,
            "uuid": None,
            "name": None,
            "memory_total_mib": None,
            "memory_used_mib": None,
            "utilization_gpu": None,
            "temperature_c": None,
            "ecc_uncorrected": None,
            "lost": False,
            "processes": [],
            "mig_mode": None,
            "mig_devices": [],
        }

    def call(self, what: str, fn, *args, absent=()):
        """fn(*args), or None when the GPU is lost / the call is not supported / it failed.

        Errors in ``absent`` mean "nothing there" and are not problems either.
        """
        if self.lost:
            return None  # a lost GPU answers nothing; don't ask again for every field
        nvml = self.nvml
        try:
            return fn(*args)
        except nvml.NVMLError_GpuIsLost:
            self.lost = True
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, *absent):
            pass  # e.g. no ECC on GeForce cards, no MIG before Ampere, old drivers
        except nvml.NVMLError as e:
            self.problems.append(f"{what} failed: {e}")
        return None

    def memory(self, what: str, handle) -> tuple[int | None, int | None]:
        mem = self.call(what, self.nvml.nvmlDeviceGetMemoryInfo, handle)
        return (None, None) if mem is None else (mem.total // MIB, mem.used // MIB)


def _probe_mig_devices(d: _Device, handle, gpu_memory_mib: int | None) -> list[dict]:
    nvml = d.nvml
    slots = d.call("get MIG device count", nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    found = []
    for slot in range(slots):
        # Slots are sparse: destroyed MIG devices leave gaps (NVML_ERROR_NOT_FOUND).
        mig = d.call(
            f"get MIG device {slot}",
            nvml.nvmlDeviceGetMigDeviceHandleByIndex,
            handle,
            slot,
            absent=(nvml.NVMLError_NotFound,),
        )
        if mig is None:
            continue
        name = d.call(f"get MIG device {slot} name", nvml.nvmlDeviceGetName, mig)
        profile = mig_profile_from_name(name)
        if profile is None:
            attrs = d.call(f"get MIG device {slot} attributes", nvml.nvmlDeviceGetAttributes, mig)
            if attrs is not None:
                profile = mig_profile_from_attributes(
                    attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount, attrs.memorySizeMB, gpu_memory_mib
                )
        uuid = d.call(f"get MIG device {slot} UUID", nvml.nvmlDeviceGetUUID, mig)
        total, used = d.memory(f"get MIG device {slot} memory info", mig)
        if d.lost:
            return []  # the GPU went: nothing of it is known any more
        if uuid is None or profile is None or not total:
            # Nobody can be given a slice the hub cannot name or size: leave it out, say so.
            d.problems.append(f"MIG device {slot} left out: its UUID, profile or memory is unknown")
            continue
        found.append(
            {
                "index": slot,
                "uuid": uuid,
                "profile": profile,
                "name": name,
                "memory_total_mib": total,
                "memory_used_mib": used,
            }
        )
    return [] if d.lost else found


def _identify(d: _Device, position: int):
    """(handle, index, UUID, name) of the GPU at this position; None for what NVML did not give."""
    nvml = d.nvml
    handle = d.call("get handle", nvml.nvmlDeviceGetHandleByIndex, position)
    if handle is None:
        return None, position, None, None
    index = d.call("get index", nvml.nvmlDeviceGetIndex, handle)
    return (
        handle,
        position if index is None else index,
        d.call("get UUID", nvml.nvmlDeviceGetUUID, handle),
        d.call("get name", nvml.nvmlDeviceGetName, handle),
    )


def _probe_device(nvml, position: int, max_temperature_c: float, known: dict | None = None) -> dict:
    """One device's record. ``known`` keeps each position's handle, index, UUID and name
    for as long as NVML stays open: they cannot change meanwhile, and a GPU lost later is
    still reported under its UUID."""
    d = _Device(nvml, position)
    info = d.info
    identity = (known or {}).get(position)
    if identity is None:
        identity = _identify(d, position)
        if known is not None and not d.lost and not d.problems and None not in identity:
            known[position] = identity
    handle, info["index"], info["uuid"], info["name"] = identity
    if handle is not None:
        info["memory_total_mib"], info["memory_used_mib"] = d.memory("get memory info", handle)
        util = d.call("get utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        if util is not None:
            info["utilization_gpu"] = util.gpu
        info["temperature_c"] = d.call(
            "get temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        # Volatile = since the driver was loaded: errors that a reset already dealt
        # with (aggregate, lifetime count) should not keep a GPU marked unhealthy.
        info["ecc_uncorrected"] = d.call(
            "get ECC errors",
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        procs = d.call("get processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        info["processes"] = [
            {"pid": p.pid, "used_mib": None if p.usedGpuMemory is None else p.usedGpuMemory // MIB}
            for p in (procs or [])
        ]
        mig = d.call("get MIG mode", nvml.nvmlDeviceGetMigMode, handle)
        if mig is not None:
            info["mig_mode"] = mig[0] == nvml.NVML_DEVICE_MIG_ENABLE
        if info["mig_mode"]:
            info["mig_devices"] = _probe_mig_devices(d, handle, info["memory_total_mib"])

    info["lost"] = d.lost
    problems = device_problems(info, max_temperature_c) + d.problems
    info["healthy"] = not problems
    info["problems"] = problems
    return info


def _import_pynvml():
    try:
        import pynvml
    except ImportError as e:  # the Python bindings themselves are missing
        raise AgentError(f"{PROG}: the Python package nvidia-ml-py (module pynvml) is not installed") from e
    return pynvml


class Nvml:
    """NVML through the official bindings, initialised once and kept open.

    Initialising NVML can take seconds on a real node (it may have to wake every GPU),
    so ``run`` keeps one session across cycles; a failure closes it and the next
    ``read`` initialises again.
    """

    def __init__(self):
        self.lib = _import_pynvml()
        self.is_open = False
        self.known: dict[int, tuple] = {}  # see _probe_device

    def open(self) -> None:
        if self.is_open:
            return
        nvml = self.lib
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as e:
            raise AgentError(NO_LIBRARY) from e
        except nvml.NVMLError_DriverNotLoaded as e:
            raise AgentError(NO_DRIVER) from e
        except nvml.NVMLError as e:
            raise AgentError(f"{PROG}: NVML could not be initialised: {e}") from e
        self.is_open = True

    def close(self) -> None:
        if not self.is_open:
            return
        self.is_open = False
        self.known.clear()  # handles die with the session
        try:
            self.lib.nvmlShutdown()
        except self.lib.NVMLError:
            pass  # nothing useful to do; the next open starts afresh

    def __enter__(self) -> Nvml:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, max_temperature_c: float = DEFAULT_MAX_TEMPERATURE_C) -> dict:
        """Return driver/CUDA versions and one record per GPU (the report's fixed shape).

        Raises AgentError (with an operator-facing sentence) when NVML cannot be used at
        all; per-device failures end up in that device's ``problems`` instead.
        """
        self.open()
        nvml = self.lib
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            cuda = _cuda_version_string(nvml.nvmlSystemGetCudaDriverVersion_v2())
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            self.close()  # start NVML afresh next time: the driver may have been reloaded
            raise AgentError(f"{PROG}: NVML failed to list the GPUs on this node: {e}") from e
        devices = [_probe_device(nvml, i, max_temperature_c, self.known) for i in range(count)]
        return {
            "driver_version": driver,
            "cuda_version": cuda,
            "device_count": count,
            "healthy": all(dev["healthy"] for dev in devices),
            "devices": devices,
        }


def probe(max_temperature_c: float = DEFAULT_MAX_TEMPERATURE_C) -> dict:
    """One report, with NVML initialised for it and shut down after."""
    with Nvml() as nvml:
        return nvml.read(max_temperature_c)


# ---- the hub ----


def report_url(hub_url: str) -> str:
    """The report endpoint under the hub's public URL, which may carry a base path.

    ``http://h:8000`` and ``http://h:8000/jhub/`` give ``…/hub/api/gpuspawner/report``
    and ``…/jhub/hub/api/gpuspawner/report``.
    """
    parts = urllib.parse.urlsplit(hub_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AgentError(
            f"{PROG}: --hub-url must be the hub's address, like http://hub.example.org:8000/ (got {hub_url!r})"
        )
    if parts.query or parts.fragment:
        raise AgentError(f"{PROG}: --hub-url must not carry a query or a fragment (got {hub_url!r})")
    path = parts.path.rstrip("/") + "/" + REPORT_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def read_token(token_file: str | None) -> str:
    """The agent's hub token: from --token-file if given, else from $GPUSPAWNER_AGENT_TOKEN."""
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = getattr(e, "strerror", None) or str(e)
            raise AgentError(f"{PROG}: cannot read the token file {token_file}: {reason}") from None
        where = f"the token file {token_file}"
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        if not token:
            raise AgentError(NO_TOKEN)
        where = f"${TOKEN_ENV}"
    if not token:
        raise AgentError(f"{PROG}: {where} is empty")
    if any(c.isspace() or not c.isprintable() for c in token):
        raise AgentError(f"{PROG}: {where} holds more than one token (it has spaces or line breaks)")
    return token


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib would turn a redirected POST into a GET without the report; say so instead.
    def redirect_request(self, *args, **kwargs):
        return None


def _one_line(text, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _hub_message(e: urllib.error.HTTPError) -> str:
    """The hub's own message from its JSON error body, else the HTTP reason."""
    if 300 <= e.code < 400:
        return f"it redirects to {e.headers.get('Location')}; give that address as --hub-url"
    try:
        body = json.loads(e.read(4096))
        message = body.get("message") if isinstance(body, dict) else None
    except (OSError, ValueError, http.client.HTTPException):
        message = None
    return _one_line(message or e.reason or "no reason given")


class HubClient:
    """Posts reports to the hub: one seam, every failure turned into a one-line HubError."""

    def __init__(self, url: str, token: str, timeout: float = DEFAULT_TIMEOUT_S):
        self.url = url
        self.timeout = timeout
        self.headers = {
            "Authorization": f"token {token}",
            "Content-Type": "application/json",
            "User-Agent": f"{PROG}/{__version__}",
        }
        self.opener = urllib.request.build_opener(_NoRedirect)

    def post(self, body: bytes) -> None:
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with self.opener.open(request, timeout=self.timeout) as response:
                response.read()
        except urllib.error.HTTPError as e:
            raise HubError(f"the hub answered {e.code}: {_hub_message(e)}") from None
        except urllib.error.URLError as e:
            raise HubError(self._unreachable(e.reason)) from None
        except (OSError, http.client.HTTPException) as e:
            raise HubError(self._unreachable(e)) from None

    def _unreachable(self, reason) -> str:
        if isinstance(reason, TimeoutError):
            return f"no answer from the hub within {self.timeout:g} s"
        if isinstance(reason, ConnectionRefusedError):
            return "cannot reach the hub: connection refused"
        text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        return f"cannot reach the hub: {_one_line(text)}"


def docker_default_runtime(path: str | None) -> str | None:
    """dockerd's default runtime as the node's daemon.json sets it ("runc" when
    it sets none), for ``gpuspawner doctor``; None when the file cannot be read
    (e.g. not mounted into the agent's container): then nothing is judged."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    runtime = data.get("default-runtime") if isinstance(data, dict) else None
    return runtime[:64] if isinstance(runtime, str) and runtime else "runc"


def encode_report(report: dict, hostname: str, interval: float, docker_config: str | None = None) -> bytes:
    """The request body: the probe's report plus who sends it, how often, and
    what the node's dockerd runs containers with."""
    body = dict(
        report,
        hostname=hostname,
        interval=interval,
        agent_version=__version__,
        docker_default_runtime=docker_default_runtime(docker_config),
    )
    return json.dumps(body, separators=(",", ":")).encode()


# ---- the loop ----


class _Stop(Exception):
    """SIGTERM / SIGINT: leave at once, whatever the loop is doing."""


def _stop(signum, frame):
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # a second signal must not interrupt the exit
    raise _Stop(signal.Signals(signum).name)


def _plain(e: Exception) -> str:
    return str(e).removeprefix(f"{PROG}: ")


def backoff_delay(failures: int, interval: float) -> float:
    """Seconds to wait after the n-th failure in a row: interval, 2×, 4×, … capped."""
    cap = min(MAX_BACKOFF_S, MAX_BACKOFF_INTERVALS * interval)
    return min(cap, interval * 2 ** min(failures - 1, 30))


def report_loop(
    nvml: Nvml,
    hub: HubClient,
    hostname: str,
    interval: float,
    max_temperature_c: float,
    cycles: int | None = None,
    docker_config: str | None = None,
) -> None:
    """Report every ``interval`` seconds; through failures, back off and keep going.

    One log line per failure and one when reports get through again. Returns after
    ``cycles`` successful reports (None: never).
    """
    failures = sent = 0
    while True:
        started = time.monotonic()
        try:
            report = nvml.read(max_temperature_c)
            hub.post(encode_report(report, hostname, interval, docker_config))
        except (AgentError, HubError) as e:
            failures += 1
            delay = backoff_delay(failures, interval)
            log.warning("report failed: %s; retrying in %g s", _plain(e), delay)
            time.sleep(delay)
            continue
        if failures:
            log.info("reporting works again (after %d failed attempt%s)", failures, "" if failures == 1 else "s")
            failures = 0
        elif sent == 0:
            unhealthy = sum(not dev["healthy"] for dev in report["devices"])
            log.info(
                "first report sent: %d GPU%s, %d unhealthy",
                report["device_count"],
                "" if report["device_count"] == 1 else "s",
                unhealthy,
            )
        sent += 1
        if cycles is not None and sent >= cycles:
            return
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


def run(args) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"%(asctime)s {PROG}: %(message)s")
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    nvml = None
    try:
        hub = HubClient(report_url(args.hub_url), read_token(args.token_file), args.timeout)
        hostname = args.hostname or os.environ.get(HOSTNAME_ENV) or socket.gethostname()
        nvml = Nvml()
        nvml.open()  # no library / no driver: stop now, with the sentence that says which
        log.info("reporting to %s every %g s as %s", hub.url, args.interval, hostname)
        report_loop(nvml, hub, hostname, args.interval, args.max_temperature, args.cycles, args.docker_config)
    except AgentError as e:
        print(e, file=sys.stderr)  # one sentence, no traceback
        return 2
    except _Stop as e:
        log.info("stopped by %s", e)
    finally:
        if nvml is not None:
            nvml.close()
    return 0


# ---- command line ----

DEFAULT_DOCKER_CONFIG = "/etc/docker/daemon.json"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text!r}")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 up, not {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="GPU node agent for gpuspawner.")
    health = argparse.ArgumentParser(add_help=False)
    health.add_argument(
        "--max-temperature",
        type=float,
        default=DEFAULT_MAX_TEMPERATURE_C,
        metavar="C",
        help="GPUs hotter than this are unhealthy (default: %(default)g)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("probe", parents=[health], help="print this node's GPUs as JSON")
    p_run = sub.add_parser(
        "run",
        parents=[health],
        help="report this node's GPUs to the hub, every few seconds",
        description="Report this node's GPUs to the hub every --interval seconds, until stopped "
        "(SIGTERM / SIGINT). Exits 2 at start when NVML, the token or the hub "
        "address cannot be used; hub outages are waited out.",
    )
    p_run.add_argument(
        "--hub-url",
        required=True,
        metavar="URL",
        help="the hub's public address, with its base path if it has one "
        "(e.g. http://hub.example.org:8000/ or http://hub:8000/jhub/)",
    )
    p_run.add_argument("--token-file", metavar="FILE", help=f"file holding the agent token (default: ${TOKEN_ENV})")
    p_run.add_argument(
        "--interval",
        type=_seconds,
        default=DEFAULT_INTERVAL_S,
        metavar="S",
        help="seconds between reports (default: %(default)g)",
    )
    p_run.add_argument(
        "--hostname",
        metavar="H",
        help=f"the node name to report as: the swarm node's hostname "
        f"(default: ${HOSTNAME_ENV}, else this machine's hostname)",
    )
    p_run.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="seconds to wait for the hub's answer (default: %(default)g)",
    )
    p_run.add_argument(
        "--docker-config",
        metavar="FILE",
        default=DEFAULT_DOCKER_CONFIG,
        help="the node's dockerd daemon.json, read to report its default runtime "
        "(default: %(default)s; mount it read-only into the agent's container)",
    )
    p_run.add_argument(
        "--cycles",
        type=_count,
        default=None,
        metavar="N",
        help="stop after N successful reports (for tests and benchmarks; default: run until stopped)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return run(args)
    try:
        report = probe(max_temperature_c=args.max_temperature)
    except AgentError as e:
        print(e, file=sys.stderr)  # one sentence, no traceback
        return 2
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
