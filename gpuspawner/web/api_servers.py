"""What one server holds, for the server itself (its JupyterLab status bar, see
labextension/) and its user.

* ``GET /hub/api/gpuspawner/servers/USER`` and ``…/servers/USER/SERVER``: the
  server's GPUs as the home page shows them (model, host, each device's UUID, share,
  memory in use against its entitlement, utilization), how long they have been held,
  what would stop the server when, its place in line while it waits, and how often
  the node's reports arrive (``refresh_seconds``: asking more often shows nothing new).
  Needs ``access:servers`` for that server: its own token (JupyterHub's ``server``
  role), its user, or an admin. Anyone else gets JupyterHub's 404 for what a token
  may not see; no credentials, 403.
"""

from __future__ import annotations

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import needs_scope

from .api import _GPUMixin
from .home_gpus import server_rows

__all__ = ["DEFAULT_REFRESH_SECONDS", "handlers"]

DEFAULT_REFRESH_SECONDS = 15.0  # the agent's default interval, until its node has reported


class ServerGPUsHandler(_GPUMixin, APIHandler):
    @needs_scope("access:servers")
    async def get(self, user_name: str, server_name: str = ""):
        hub = self.gpu_hub()
        row = next((r for r in server_rows(hub, user_name) if r["server"] == server_name), {})
        reports = hub.holdings.cluster.reports
        report = reports.get(row["host"], (None, 0.0))[0] if row.get("host") else None
        self.set_header("Content-Type", "application/json")
        self.write(
            {
                "server": server_name,
                "devices": [],
                **row,
                "refresh_seconds": report.interval if report is not None else DEFAULT_REFRESH_SECONDS,
            }
        )


handlers = [
    (r"/api/gpuspawner/servers/([^/]+)", ServerGPUsHandler),
    (r"/api/gpuspawner/servers/([^/]+)/([^/]+)", ServerGPUsHandler),
]
