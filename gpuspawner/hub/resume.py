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

Only rows nobody owns are resumed. Users spawn while the hub starts (the
ledger may be down a while), so a row's server may be spawned again already,
by its user: that spawn waits in line live, or is pending in JupyterHub
(its hooks, its checks before the line), and it is left alone, never stopped
nor spawned a second time. Each row is judged when its turn comes, after the
awaits before it: one that left the line meanwhile is not resumed. A server
that JupyterHub itself is still checking or stopping (its record from the old
hub, checked in the background past ``init_spawners_timeout``) is resumed
once that is over, at most :data:`SETTLE_SECONDS` later.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .. import hub_port
from ..core.line_order import Waiter, ordered
from ..holdings.holdings import Holdings
from ..line.wait import WaitLine

__all__ = ["resume_waiting"]

log = logging.getLogger(__name__)

LOAD_RETRY_SECONDS = 5.0
SETTLE_SECONDS = 60.0  # the longest a row waits for JupyterHub's own check or stop of its server
SETTLE_POLL_SECONDS = 0.5
SETTLING = ("check", "stop")  # JupyterHub's pending events that end by themselves, the record then settled


async def resume_waiting(line: WaitLine, holdings: Holdings) -> int:
    """Re-issue the spawns of the line's rows nobody owns (at hub start); how many."""
    app = hub_port.running_hub()
    if app is None:
        return 0
    await line.load()  # first, as the hub starts: a request that does not wait checks it
    while not line.loaded:  # the ledger is down: its rows would hold places nobody resumes
        await asyncio.sleep(LOAD_RETRY_SECONDS)
        await line.load()
    await hub_port.hub_started(app)  # the proxy and the users are ready
    resumed, settling = await _resume_all(app, line, holdings, ordered(line.rows))
    line.restart_clocks()
    if settling:
        late = await _resume_settled(app, line, holdings, settling)
        if late:
            line.restart_clocks()  # their deadlines count from their spawns too
        resumed += late
    if resumed:
        log.info("Resumed %d spawns waiting in line for GPUs", resumed)
    return resumed


async def _resume_all(app: Any, line: WaitLine, holdings: Holdings, rows: list[Waiter]) -> tuple[int, list[Waiter]]:
    """Resume ``rows`` in order: how many were, and those whose server JupyterHub checks or stops now."""
    resumed, settling = 0, []
    for w in rows:
        try:
            done = await _resume(app, line, holdings, w)
        except Exception as exc:  # the others are resumed all the same; this row's deadline runs
            log.error("The spawn of %s waiting in line for %s could not be resumed: %s", w.service, w.model, exc)
            continue
        if done is None:
            settling.append(w)
        else:
            resumed += done
    return resumed, settling


async def _resume_settled(app: Any, line: WaitLine, holdings: Holdings, rows: list[Waiter]) -> int:
    """The rows whose server JupyterHub was checking or stopping, each once that is over."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_SECONDS
    resumed = 0
    while rows:
        if loop.time() >= deadline:
            for w in rows:
                log.warning(
                    "JupyterHub still checks or stops the server of %s after %d s: its spawn waiting in line "
                    "for %s is not resumed (its place holds until its deadline)",
                    w.service,
                    SETTLE_SECONDS,
                    w.model,
                )
            break
        await asyncio.sleep(SETTLE_POLL_SECONDS)
        done, rows = await _resume_all(app, line, holdings, rows)
        resumed += done
    return resumed


async def _resume(app: Any, line: WaitLine, holdings: Holdings, w: Waiter) -> int | None:
    """1: ``w``'s spawn was issued again; 0: not (out of line, or owned); None: not yet
    (JupyterHub checks or stops its server now). No ``await`` between the checks and the spawn."""
    stopped = False
    while True:
        if not line.unowned(w.service):  # out of line meanwhile, or a spawn of it waits in line
            return 0
        user, spawner = hub_port.user_spawner(app, w.user, w.server)
        if user is None:
            log.warning("%s waited in line for %s, but user %s is gone: out of line", w.service, w.model, w.user)
            await line.leave(w.service)
            return 0
        pending = None if spawner is None else spawner.pending
        if pending in SETTLING:
            return None
        if pending:  # its user spawns it again (not in line yet): that spawn owns the place
            log.info("%s is pending %s in JupyterHub: its spawn waiting in line is not resumed", w.service, pending)
            return 0
        if spawner is None or not spawner.ready or stopped:
            break
        if holdings.get(w.service) is not None:  # it runs after all
            await line.leave(w.service)
            return 0
        # The old hub's record of a spawn that died waiting (it has a server
        # entry, and no service yet to say it is gone): stopped first, then
        # looked at again (an admin may take the row out during the stop).
        await user.stop(w.server)
        stopped = True
    spawn = hub_port.spawn_in_background(app, user, w.server, w.request)
    spawn.add_done_callback(lambda f: _failed(line, w.service, f))
    return 1


def _failed(line: WaitLine, service: str, spawn: asyncio.Future) -> None:
    """A resumed spawn that failed before it could wait leaves the line at once."""
    if not spawn.cancelled() and spawn.exception() is not None and line.unowned(service):
        line.leave_soon(service)
