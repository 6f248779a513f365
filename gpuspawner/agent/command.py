"""gpuspawner-agent: what the GPUs on this node look like right now, via NVML.

Runs on each GPU node. ``probe`` prints one report; ``run`` posts one to the hub
every few seconds. This module is the command line; the work is in agent_nvml (the
readings), agent_report (the body posted), agent_hub (posting it) and agent_loop
(posting it again and again).

Deliberately imports neither docker nor jupyterhub: nodes run only this.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import socket
import sys

from ..core.enforcement import HAMI_LIBRARY, MPS_PIPE_DIR
from ..core.reports import MAX_INTERVAL_S
from .attribution import Attributor, DockerLabels
from .errors import PROG, AgentError
from .hub import DEFAULT_TIMEOUT_S, TOKEN_ENV, TOKEN_FILE_ENV, HubClient, Token, report_url
from .loop import Stop, report_loop, stop_on_signals
from .nvml import DEFAULT_MAX_TEMPERATURE_C, Nvml, probe

DEFAULT_INTERVAL_S = 15.0
DEFAULT_DOCKER_CONFIG = "/etc/docker/daemon.json"
DEFAULT_PROC_ROOT = "/proc"
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"
HOSTNAME_ENV = "GPUSPAWNER_AGENT_HOSTNAME"

log = logging.getLogger(PROG)


def run(args) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"%(asctime)s {PROG}: %(message)s")
    stop_on_signals()
    nvml = None
    try:
        hub = HubClient(
            report_url(args.hub_url), Token(args.token_file or os.environ.get(TOKEN_FILE_ENV)), args.timeout
        )
        hostname = args.hostname or os.environ.get(HOSTNAME_ENV) or socket.gethostname()
        nvml = Nvml()
        nvml.open()  # no library / no driver: stop now, with the sentence that says which
        log.info("reporting to %s every %g s as %s", hub.url, args.interval, hostname)
        attributor = None
        if args.proc_root != "none":
            attributor = Attributor(args.proc_root, DockerLabels(args.docker_socket))
        report_loop(
            nvml,
            hub,
            hostname,
            args.interval,
            args.max_temperature,
            args.cycles,
            args.docker_config,
            attributor,
            (args.mps_pipe_dir, args.hami_library),
        )
    except AgentError as e:
        print(e, file=sys.stderr)  # one sentence, no traceback
        return 2
    except Stop as e:
        log.info("stopped by %s", e)
    finally:
        if nvml is not None:
            nvml.close()
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text!r}")
    return value


def _interval(text: str) -> float:
    """Seconds between reports: up to the longest the hub takes (it refuses reports that say more)."""
    value = _seconds(text)
    if value > MAX_INTERVAL_S:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_INTERVAL_S} seconds (the hub takes no longer), not {text!r}"
        )
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 up, not {text!r}")
    return int(text)


def _add_run_options(p_run: argparse.ArgumentParser) -> None:
    p_run.add_argument(
        "--hub-url",
        required=True,
        metavar="URL",
        help="the hub's public address, with its base path if it has one "
        "(e.g. http://hub.example.org:8000/ or http://hub:8000/jhub/)",
    )
    p_run.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"file holding the agent token, read again when it changes (default: ${TOKEN_FILE_ENV}, else the token in ${TOKEN_ENV})",
    )
    p_run.add_argument(
        "--interval",
        type=_interval,
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
        "--proc-root",
        metavar="DIR",
        default=DEFAULT_PROC_ROOT,
        help="the node's /proc, where each GPU process's cgroup names its container "
        "(default: %(default)s; mount the node's /proc read-only into the agent's container, "
        "e.g. at /host/proc; 'none': report processes without their holder)",
    )
    p_run.add_argument(
        "--docker-socket",
        metavar="PATH",
        default=DEFAULT_DOCKER_SOCKET,
        help="the node's dockerd socket, asked for the swarm service of each GPU process's container "
        "(default: %(default)s)",
    )
    p_run.add_argument(
        "--mps-pipe-dir",
        metavar="DIR",
        default=MPS_PIPE_DIR,
        help="the MPS control daemon's pipe directory, looked at for its control pipe when a node's "
        "shares are enforced with mps (default: %(default)s; mount it read-only into the agent's container)",
    )
    p_run.add_argument(
        "--hami-library",
        metavar="FILE",
        default=HAMI_LIBRARY,
        help="HAMi-core's libvgpu.so, looked for when a node's shares are enforced with hami "
        "(default: %(default)s; mount it read-only into the agent's container)",
    )
    p_run.add_argument(
        "--cycles",
        type=_count,
        default=None,
        metavar="N",
        help="stop after N successful reports (for tests and benchmarks; default: run until stopped)",
    )


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
    _add_run_options(p_run)
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
