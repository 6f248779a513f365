"""Quotas for admins (docs/quotas.md), served by JupyterHub under /hub/.

* ``GET /hub/api/gpuspawner/quotas``: per group and model, the quota, what its members
  hold within it and borrow beyond it, what it leaves idle, what its members wait for
  within it and the borrowed servers being taken back for it (``quotas``); and what
  cannot be met as the cluster and JupyterHub are now (``problems``).

It needs ``admin:servers``. ``gpuspawner quotas`` uses it.
"""

from __future__ import annotations

from jupyterhub.apihandlers.base import APIHandler

from .. import hub_port
from .api import ADMIN_SCOPE, _GPUMixin

__all__ = ["handlers"]


class QuotasHandler(_GPUMixin, APIHandler):
    async def get(self):
        self.require(ADMIN_SCOPE)
        hub = self.gpu_hub()
        keeper = hub.quotas
        await hub.reservations.refresh()
        problems = keeper.problems(
            lambda group: hub_port.group_members(self, group) is not None, hub.reservations.reservations
        )
        self.set_header("Content-Type", "application/json")
        self.write(
            {
                "quotas": keeper.status(),
                "problems": [{"problem": problem, "fix": fix} for problem, fix in problems],
            }
        )


handlers = [(r"/api/gpuspawner/quotas", QuotasHandler)]
