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

__all__ = ["LOGGED_BY_SPAWNER", "ORDINARY", "OrdinaryRefusals", "quiet_ordinary_refusals"]

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
