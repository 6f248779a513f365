"""Idle reclaim inside a running JupyterHub: the check loop, stopping a server the
way the hub's own REST stop does (proxy route first, then the spawner), the limits
of each server's own spawner, ``last_activity`` kept fresh while a server's GPUs
are busy, and the notices for the home page's template."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone

from . import reclaim
from .holdings import Holding

__all__ = ["keep_checking", "notices_var"]

log = logging.getLogger("JupyterHub")


def _app():
    from jupyterhub.app import JupyterHub

    return JupyterHub.instance() if JupyterHub.initialized() else None


def _spawner(h: Holding):
    app = _app()
    if app is None:
        return None, None
    try:
        user = app.users[h.labels.user]
    except KeyError:
        return None, None
    return user, user.spawners.get(h.labels.server)


async def stop_through_hub(h: Holding, reason: str) -> bool:
    """Stop the holding's server as ``DELETE /users/NAME/servers/SERVER`` does:
    JupyterHub's state (server row, proxy route, activity) stays right."""
    user, spawner = _spawner(h)
    if spawner is None or not spawner.active or spawner.pending:
        return False  # not a server of this hub now, or mid-spawn/stop: the next check sees
    spawner._stop_pending = True  # as JupyterHub's stop does: no start or stop of it meanwhile
    try:
        await _app().proxy.delete_user(user, h.labels.server)
        await user.stop(h.labels.server)
    finally:
        spawner._stop_pending = False
    log.info("Stopped %s's server %r: %s", h.user, h.labels.server, reason)
    return True


def touch_activity(h: Holding) -> None:
    """A busy GPU is activity: the server's (and its user's) last_activity is now."""
    user, spawner = _spawner(h)
    if spawner is None or not spawner.active or spawner.orm_spawner is None:
        return
    now = datetime.now(timezone.utc).replace(tzinfo=None)  # JupyterHub stores naive UTC
    spawner.orm_spawner.last_activity = now
    if user.orm_user.last_activity is None or user.orm_user.last_activity < now:
        user.orm_user.last_activity = now
    _app().db.commit()


def _limits(view):
    def limits_for(h: Holding):
        _, spawner = _spawner(h)
        return (spawner if hasattr(spawner, "_reclaim_limits") else view)._reclaim_limits()

    return limits_for


def notices_var(config):
    """For ``c.JupyterHub.template_vars``: the logged-in user's notices."""

    def notices(user) -> list[dict]:
        from .api import hub_view

        if user is None or getattr(user, "kind", "user") != "user":
            return []
        try:
            return reclaim.of(hub_view(config).holdings()).notices_for(user.name)
        except Exception:  # a page must render even when the GPU side cannot
            return []

    return notices


async def keep_checking(config) -> None:
    """Every ``gpu_reclaim_interval`` seconds, warn and stop where limits say so."""
    from .api import hub_view

    view = hub_view(config, log=log)
    while True:
        try:
            found = reclaim.of(view.holdings())
            found.limits_for = _limits(view)
            found.stop = stop_through_hub
            found.on_active = touch_activity if view.gpu_activity_updates_last_activity else None
            await found.check()
        except Exception as exc:  # never let the loop die; say what happened in one line
            log.error("GPU idle reclaim failed: %s", getattr(exc, "message", exc))
        await asyncio.sleep(view.gpu_reclaim_interval)
