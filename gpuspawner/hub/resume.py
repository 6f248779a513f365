"""After a hub restart, the spawns that were waiting in line are started again.

The line's rows are in the ledger; their spawns died with the old hub. Once
the new hub has started, each row's spawn is issued again through the hub's
own user objects, in line order, with the user_options it waited with. Each
finds its row and keeps its place (``LedgerQueue.enqueue`` keeps a service's
place), and until it does, nobody behind it is served (``WaitLine._serve``).
A row whose user is gone, or whose server already runs, leaves the line, and
so does one whose resumed spawn fails before it waits (an authenticator's or
the admin's hook, the ledger); one row's failure never stops the others'.
The hub's own record of the dead spawn (a server entry without a service) is
stopped first, as JupyterHub would stop any server it finds gone. While the
ledger cannot be read, the line is read again every :data:`LOAD_RETRY_SECONDS`.
"""

from __future__ import annotations

import asyncio
import logging

from .. import hub_port
from ..core.line_order import ordered
from ..holdings.holdings import Holdings
from ..line.wait import WaitLine

__all__ = ["resume_waiting"]

log = logging.getLogger(__name__)

LOAD_RETRY_SECONDS = 5.0


async def resume_waiting(line: WaitLine, holdings: Holdings) -> int:
    """Re-issue the spawns of the line's rows (at hub start); how many."""
    app = hub_port.running_hub()
    if app is None:
        return 0
    await line.load()  # first, as the hub starts: a request that does not wait checks it
    while not line.loaded:  # the ledger is down: its rows would hold places nobody resumes
        await asyncio.sleep(LOAD_RETRY_SECONDS)
        await line.load()
    await hub_port.hub_started(app)  # the proxy and the users are ready
    resumed = 0
    for w in ordered(line.rows):
        try:
            resumed += await _resume(app, line, holdings, w)
        except Exception as exc:  # the others are resumed all the same; this row's deadline runs
            log.error("The spawn of %s waiting in line for %s could not be resumed: %s", w.service, w.model, exc)
    line.restart_clocks()
    if resumed:
        log.info("Resumed %d spawns waiting in line for GPUs", resumed)
    return resumed


async def _resume(app, line: WaitLine, holdings: Holdings, w) -> int:
    user, _ = hub_port.user_spawner(app, w.user, w.server)
    if user is None:
        log.warning("%s waited in line for %s, but user %s is gone: out of line", w.service, w.model, w.user)
        await line.leave(w.service)
        return 0
    spawner = user.spawners[w.server]  # made for a server not yet known
    if spawner.active:
        if holdings.get(w.service) is not None:  # it runs after all
            await line.leave(w.service)
            return 0
        # The old hub's record of a spawn that died waiting (it has a
        # server entry, and no service yet to say it is gone): stopped first.
        await user.stop(w.server)
    spawn = hub_port.spawn_in_background(app, user, w.server, w.request)
    spawn.add_done_callback(lambda f: _failed(line, w.service, f))
    return 1


def _failed(line: WaitLine, service: str, spawn: asyncio.Future) -> None:
    """A resumed spawn that failed before it could wait leaves the line at once."""
    if not spawn.cancelled() and spawn.exception() is not None and line.unowned(service):
        line.leave_soon(service)
