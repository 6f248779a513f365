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

import asyncio
import logging

from .holdings import Holdings
from .line import ordered
from .line_wait import line_of

__all__ = ["resume_waiting"]

log = logging.getLogger(__name__)


async def resume_waiting(owner: Holdings) -> int:
    """Re-issue the spawns of the line's rows (at hub start); how many."""
    from jupyterhub.app import JupyterHub

    if not JupyterHub.initialized():
        return 0
    line = line_of(owner)
    await line.load()  # first, as the hub starts: a request that does not wait checks it
    app = JupyterHub.instance()
    started = getattr(app, "_start_future", None)
    if started is not None:
        await started  # the proxy and the users are ready
    resumed = 0
    for w in ordered(line.rows):
        try:
            user = app.users[w.user]
        except KeyError:
            log.warning("%s waited in line for %s, but user %s is gone: out of line", w.service, w.model, w.user)
            await line.leave(w.service)
            continue
        spawner = user.spawners[w.server]
        if spawner.active:
            if owner.get(w.service) is not None:  # it runs after all
                await line.leave(w.service)
                continue
            # The old hub's record of a spawn that died waiting (it has a
            # server entry, and no service yet to say it is gone): stopped first.
            await user.stop(w.server)
        _spawn(app, user, w.server, w.request)
        resumed += 1
    if resumed:
        log.info("Resumed %d spawns waiting in line for GPUs", resumed)
    return resumed


def _spawn(app, user, server: str, options: dict) -> None:
    """What JupyterHub's spawn handler does for a spawn nobody waits on: the
    spawn, then the proxy route; pending meanwhile, cancellable by DELETE."""
    spawner = user.spawners[server]
    spawner._spawn_pending = True

    async def spawn_and_route():
        await user.spawn(server, options=options)
        spawner._proxy_pending = True
        try:
            await app.proxy.add_user(user, server)
        finally:
            spawner._proxy_pending = False

    future = spawner._spawn_future = asyncio.ensure_future(spawn_and_route())

    def done(f: asyncio.Future) -> None:
        spawner._spawn_pending = False
        if f.cancelled() or f.exception() is None:
            spawner._spawn_future = None
        else:
            log.warning("The resumed spawn of %s failed: %s", spawner._log_name, f.exception())

    future.add_done_callback(done)
