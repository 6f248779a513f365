"""After a hub restart, the spawns that were waiting in line are started again.

The line's rows are in the ledger; their spawns died with the old hub. Once
the new hub has started, each row's spawn is issued again through the hub's
own user objects, in line order, with the user_options it waited with. Each
finds its row and keeps its place (``LedgerQueue.enqueue`` keeps a service's
place), and until it does, nobody behind it is served (``WaitLine._serve``).
A row whose user is gone, or whose server already runs, leaves the line.
The hub's own record of the dead spawn (a server entry without a service) is
stopped first, as JupyterHub would stop any server it finds gone.
"""

from __future__ import annotations

import logging

from .. import hub_port
from ..core.line_order import ordered
from ..holdings.holdings import Holdings
from ..line.wait import WaitLine

__all__ = ["resume_waiting"]

log = logging.getLogger(__name__)


async def resume_waiting(line: WaitLine, holdings: Holdings) -> int:
    """Re-issue the spawns of the line's rows (at hub start); how many."""
    app = hub_port.running_hub()
    if app is None:
        return 0
    await line.load()  # first, as the hub starts: a request that does not wait checks it
    await hub_port.hub_started(app)  # the proxy and the users are ready
    resumed = 0
    for w in ordered(line.rows):
        user, _ = hub_port.user_spawner(app, w.user, w.server)
        if user is None:
            log.warning("%s waited in line for %s, but user %s is gone: out of line", w.service, w.model, w.user)
            await line.leave(w.service)
            continue
        spawner = user.spawners[w.server]  # made for a server not yet known
        if spawner.active:
            if holdings.get(w.service) is not None:  # it runs after all
                await line.leave(w.service)
                continue
            # The old hub's record of a spawn that died waiting (it has a
            # server entry, and no service yet to say it is gone): stopped first.
            await user.stop(w.server)
        hub_port.spawn_in_background(app, user, w.server, w.request)
        resumed += 1
    if resumed:
        log.info("Resumed %d spawns waiting in line for GPUs", resumed)
    return resumed
