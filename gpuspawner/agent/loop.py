"""gpuspawner-agent's reporting loop: read, post, and through failures back off and keep going."""

from __future__ import annotations

import logging
import signal
import time

from .attribution import Attributor
from .errors import PROG, AgentError, plain
from .hub import HubClient, HubError
from .nvml import Nvml
from .report import encode_report

# Retries after failures wait interval, 2 × interval, 4 × … up to this cap: low enough
# that a restarted hub hears from every agent within a minute or two (its GPUs are offered
# again only then), high enough that a hub that stays down is not flooded.
MAX_BACKOFF_S = 120.0
MAX_BACKOFF_INTERVALS = 4

log = logging.getLogger(PROG)


class Stop(Exception):
    """SIGTERM / SIGINT: leave at once, whatever the loop is doing."""


def _stop(signum, frame):
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # a second signal must not interrupt the exit
    raise Stop(signal.Signals(signum).name)


def stop_on_signals() -> None:
    """From now on SIGTERM and SIGINT raise Stop."""
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)


def backoff_delay(failures: int, interval: float) -> float:
    """Seconds to wait after the n-th failure in a row: interval, 2×, 4×, … capped."""
    cap = min(MAX_BACKOFF_S, MAX_BACKOFF_INTERVALS * interval)
    return min(cap, interval * 2 ** min(failures - 1, 30))


def _sleep_unless(seconds: float, cut_short, step: float = 1.0) -> None:
    """Sleep ``seconds``, checking ``cut_short()`` every ``step`` s: True ends it early."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(step, left))
        if cut_short():
            return


def report_loop(
    nvml: Nvml,
    hub: HubClient,
    hostname: str,
    interval: float,
    max_temperature_c: float,
    cycles: int | None = None,
    docker_config: str | None = None,
    attributor: Attributor | None = None,
    enforcement: tuple[str, str] | None = None,
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
            if attributor is not None:
                attributor.attribute(report)
            hub.post(encode_report(report, hostname, interval, docker_config, enforcement))
        except (AgentError, HubError) as e:
            failures += 1
            delay = backoff_delay(failures, interval)
            log.warning("report failed: %s; retrying in %g s", plain(e), delay)
            _sleep_unless(delay, hub.token_changed)  # a rotated token is tried at once
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
