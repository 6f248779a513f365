"""The hub's log says what went wrong, not what was refused as designed.

JupyterHub logs every failed spawn at ERROR, a form's with its full traceback
("Failed to spawn single-user server with form"). For gpuspawner most of those
are answers, not faults: no GPU of the model is free, the user's rules forbid
the request, the weekly budget is used up, the options are not valid. Those
become one WARNING line with the user's message; a dependency's failure (the
ledger, the swarm) stays an ERROR with everything JupyterHub logged.
"""

from __future__ import annotations

import logging
import re
import sys

__all__ = ["ORDINARY", "OrdinaryRefusals", "quiet_ordinary_refusals"]

# SpawnException reasons (spawn/errors.py) that answer a request rather than report a fault.
ORDINARY = frozenset(
    {"gpu_unavailable", "gpu_request", "gpu_access", "gpu_budget", "invalid_options", "gpu_wait_timeout"}
)
# How JupyterHub writes a SpawnException into the lines it logs outside an except block.
_NAMED = re.compile(r"SpawnException\(reason=([a-z_]+)\)")


class OrdinaryRefusals(logging.Filter):
    """ERROR records about a refusal in :data:`ORDINARY` become WARNING, one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        message = record.getMessage()
        # Inside JupyterHub's except blocks the exception is the one being handled;
        # after them, its text names the reason.
        exc = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        told = getattr(exc, "jupyterhub_message", None)  # what the user was told (spawn/errors.py)
        if told is not None and getattr(exc, "reason", None) in ORDINARY:
            message = message if told in message else f"{message}: {told}"
        else:
            named = _NAMED.search(message)
            if named is None or named[1] not in ORDINARY:
                return True
        record.msg, record.args = message, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        return True


def quiet_ordinary_refusals(*loggers: logging.Logger) -> None:
    """Install the filter once on each logger (the hub's handlers log through the
    hub's own logger, its User objects through tornado's ``app_log``, which
    JupyterHub shows under the hub's name)."""
    for logger in loggers:
        if not any(isinstance(f, OrdinaryRefusals) for f in logger.filters):
            logger.addFilter(OrdinaryRefusals())
