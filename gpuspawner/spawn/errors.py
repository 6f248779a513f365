"""What a spawn that fails tells the user: one sentence, its reason code and
HTTP status, shown alike on the form, the progress page and the REST API."""

from __future__ import annotations

from jupyterhub.spawner import SpawnException

from ..allocator.refusals import NOT_NOW
from ..holdings.holdings import HoldingBusy
from ..holdings.ports import NoPortFree
from ..ledger.ledger import LedgerError

__all__ = ["CONFLICT", "NOT_NOW", "NOT_RESERVED", "STALE", "spawn_error"]

CONFLICT = "Servers cannot start: the hub's configuration conflicts with how GPUs are assigned. Please tell an admin."
STALE = "Your previous server is still being removed; please try again in a minute."
# Why a start could not reserve (each a 503: trying again later may work).
NOT_RESERVED = {
    HoldingBusy: (STALE, "stale_service"),
    LedgerError: (
        "GPU bookings cannot be recorded right now (the hub's GPU ledger database is unreachable); "
        "please try again in a minute.",
        "ledger_unavailable",
    ),
    NoPortFree: ("Too many servers are running for the ports configured; please try again later.", "no_port"),
}


def spawn_error(message: str, *, reason: str, status_code: int, log_message: str = "") -> SpawnException:
    """A SpawnException whose message is what the user sees, on the form, the
    progress page and the REST API alike (JupyterHub otherwise shows str(exc),
    which carries the status and class name)."""
    exc = SpawnException(message, reason=reason, status_code=status_code, log_message=log_message)
    exc.jupyterhub_message = message
    return exc
