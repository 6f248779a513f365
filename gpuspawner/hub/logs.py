"""The hub's log says what went wrong, not what was refused as designed.

JupyterHub logs every failed spawn at ERROR, up to three times (a form's with
its full traceback: "Not starting …", "Error starting server …", "Failed to
spawn single-user server with form"), and again when the user next opens the
pending page ("Previous spawn for … failed"). For gpuspawner most of those are
answers, not faults: no GPU of the model is free, the user's rules forbid the
request, the weekly budget is used up, the options are not valid, the wait in
line timed out, an admin took the request out of the line. Each of those is
one INFO line of gpuspawner's own (the spawner's, or for an admin's removal the
API's, which names the admin), and JupyterHub's ERROR lines about it are left
out. A dependency's failure (the ledger, the swarm) stays an ERROR with
everything JupyterHub logged. The status of an answer is a 4xx, which
JupyterHub's request log writes at WARNING (see allocator/refusals.py's
``NOT_NOW``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

__all__ = [
    "LOGGED_BY_SPAWNER",
    "ORDINARY",
    "OrdinaryRefusals",
    "ToHubLog",
    "log_through_hub",
    "quiet_ordinary_refusals",
]

PACKAGE_LOGGER = "gpuspawner"  # the parent of gpuspawner's modules' loggers (logging.getLogger(__name__))

# SpawnException reasons (spawn/errors.py) that answer a request rather than report a fault.
ORDINARY = frozenset(
    {
        "gpu_unavailable",
        "gpu_request",
        "gpu_access",
        "gpu_budget",
        "invalid_options",
        "gpu_wait_timeout",
        "line_removed",
    }
)
# Those the spawner logs as its start fails; an admin's removal is logged where it is asked for.
LOGGED_BY_SPAWNER = ORDINARY - {"line_removed"}
# How JupyterHub writes a SpawnException into the lines it logs outside an except block.
_NAMED = re.compile(r"SpawnException\(reason=([a-z_]+)\)")


class OrdinaryRefusals(logging.Filter):
    """Leaves out JupyterHub's ERROR records about a refusal in :data:`ORDINARY`
    (gpuspawner has logged it once, below ERROR)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        # A record carries the exception (a form's traceback) or names it in its text;
        # nothing else is left out (another error logged meanwhile is kept).
        exc = record.exc_info[1] if record.exc_info else None
        if getattr(exc, "jupyterhub_message", None) is not None:  # gpuspawner's (spawn/errors.py)
            return getattr(exc, "reason", None) not in ORDINARY
        named = _NAMED.search(record.getMessage())
        return named is None or named[1] not in ORDINARY


def quiet_ordinary_refusals(*loggers: logging.Logger) -> None:
    """Install the filter once on each logger (the hub's handlers log through the
    hub's own logger, its User objects through tornado's ``app_log``, which
    JupyterHub shows under the hub's name)."""
    for logger in loggers:
        if not any(isinstance(f, OrdinaryRefusals) for f in logger.filters):
            logger.addFilter(OrdinaryRefusals())


class ToHubLog(logging.Handler):
    """Hands gpuspawner's records to the hub's own logger's handlers: the hub's format (its
    timestamp, level and logger name) and the levels the hub logs at. Without it, the
    modules' loggers reach only the root logger, which in a running hub has no handler of
    its own (Python's last resort prints a WARNING's bare message, and INFO is lost) or,
    once JupyterHub has run its database migrations, one in alembic's format."""

    def __init__(self, hub_log: logging.Logger):
        super().__init__(logging.NOTSET)
        self.hub_log = hub_log
        self.hubs = 0  # the running hubs that log through it

    def emit(self, record: logging.LogRecord) -> None:
        if self.hub_log.isEnabledFor(record.levelno):
            self.hub_log.handle(record)  # its filters, then its handlers (each with its level)


def log_through_hub(hub_log: logging.Logger | logging.LoggerAdapter) -> Callable[[], None]:
    """From now on, gpuspawner's modules log through the hub's logger (:class:`ToHubLog`),
    and only there: each line once, in the hub's format. Returns the undo, which the hub's
    stop calls: once no running hub's logger is left, the modules log as Python's defaults
    have them (a process that runs hubs for a while, such as a test, gets that back)."""
    if isinstance(hub_log, logging.LoggerAdapter):
        hub_log = hub_log.logger
    if not isinstance(hub_log, logging.Logger):
        return lambda: None
    package = logging.getLogger(PACKAGE_LOGGER)
    handler = next((h for h in package.handlers if isinstance(h, ToHubLog) and h.hub_log is hub_log), None)
    if handler is None:
        handler = ToHubLog(hub_log)
        package.addHandler(handler)
    handler.hubs += 1
    _route(package)
    done = False

    def undo() -> None:
        nonlocal done
        if done:
            return
        done = True
        handler.hubs -= 1
        if handler.hubs <= 0:
            package.removeHandler(handler)
        _route(package)

    return undo


_before: tuple[int, bool] | None = None  # the package logger's level and propagate before any hub routed it


def _route(package: logging.Logger) -> None:
    """Through the hubs' loggers alone while there are any; else as it was before (an
    admin's own level for ``gpuspawner`` is kept throughout)."""
    global _before
    routed = any(isinstance(h, ToHubLog) for h in package.handlers)
    if routed:
        if _before is None:
            _before = (package.level, package.propagate)
        # Left unset by the admin: each hub's logger decides which levels it shows.
        package.setLevel(logging.DEBUG if _before[0] == logging.NOTSET else _before[0])
        package.propagate = False  # else the root logger's handler prints each line again
    elif _before is not None:
        package.setLevel(_before[0])
        package.propagate = _before[1]
        _before = None
