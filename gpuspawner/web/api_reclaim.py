"""The hub's idle-reclaim endpoints (docs/idle.md), served by JupyterHub under /hub/.

* ``GET /hub/api/gpuspawner/notices``: the warnings of the caller's own servers
  (a server about to be stopped for idleness or for its held time), soonest first.
* ``GET /hub/api/gpuspawner/idle``: who is idle now, and the GPU processes that no
  holder of their device owns; needs ``admin:servers``. ``gpuspawner idle`` reads it.
"""

from __future__ import annotations

from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from .api import ADMIN_SCOPE, _GPUMixin

__all__ = ["handlers"]


class NoticesHandler(_GPUMixin, APIHandler):
    async def get(self):
        user = self.current_user
        if not user or getattr(user, "kind", "user") != "user":
            raise web.HTTPError(403, "Missing or invalid credentials.")
        self.set_header("Content-Type", "application/json")
        self.write({"notices": self.gpu_hub().notices_for(user)})


class IdleHandler(_GPUMixin, APIHandler):
    async def get(self):
        self.require(ADMIN_SCOPE)
        found = self.gpu_hub().reclaimer
        self.set_header("Content-Type", "application/json")
        self.write({"idle": found.idle_now(), "unattributed": found.unattributed})


handlers = [
    (r"/api/gpuspawner/notices", NoticesHandler),
    (r"/api/gpuspawner/idle", IdleHandler),
]
