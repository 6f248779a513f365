"""Every contact with JupyterHub's and dockerspawner's internals, in one module.

gpuspawner runs inside the hub and must do a few things that JupyterHub does
only from its own request handlers: start a spawn that no request waits on (a
spawn resumed after a restart), stop a server the way the REST API's stop does,
raise the hub's ``concurrent_spawn_limit`` while spawns wait in line. And it
evaluates the admin's dockerspawner settings as dockerspawner would. Where no
public way exists, the private member is touched here and nowhere else, and
:data:`PRIVATE_MEMBERS` lists it: ``tests/unit/test_hub_port.py`` checks each
one on the versions CI installs (the lowest that setup.cfg allows, and the
newest), so an upgrade is one file to audit.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

__all__ = [
    "PRIVATE_MEMBERS",
    "admin_settings",
    "docker_connection",
    "hold_spawn_slot",
    "hub_session",
    "running_hub",
    "service_names",
    "spawn_in_background",
    "stop_server",
    "touch_activity",
]

log = logging.getLogger("JupyterHub")

#: The private members used below: ``{"module:Class": (member, ...)}``.
PRIVATE_MEMBERS: dict[str, tuple[str, ...]] = {
    # spawn_in_background: what JupyterHub's spawn handler sets around a spawn, so that the
    # server shows as pending and a DELETE can cancel it (BaseHandler.spawn_single_user).
    # stop_server: what its stop sets, so that nothing starts or stops the server meanwhile.
    "jupyterhub.spawner:Spawner": ("_spawn_pending", "_proxy_pending", "_spawn_future", "_stop_pending", "_log_name"),
    # spawn_in_background waits for the hub to finish starting (proxy routes, users) first.
    "jupyterhub.app:JupyterHub": ("_start_future",),
    # admin_settings: dockerspawner evaluates its settings with these (callables, templates,
    # volumes as binds); gpuspawner checks them before any GPU is reserved.
    "dockerspawner.dockerspawner:DockerSpawner": ("_eval_if_callable", "_render_templates", "_volumes_to_binds"),
}

# The tornado setting JupyterHub's spawn handler reads the limit from (BaseHandler.concurrent_spawn_limit).
SPAWN_LIMIT = "concurrent_spawn_limit"
SPAWN_LIMIT_BASE = "gpuspawner_concurrent_spawn_limit"  # the admin's own limit
WAITING = "gpuspawner_waiting_spawns"

# dockerspawner's name templates, rendered on a spawner's init, need only a user's name.
NOBODY = SimpleNamespace(name="gpuspawner-hub", id=0)


def running_hub():
    """The JupyterHub application this process runs, or None (a test, a tool)."""
    from jupyterhub.app import JupyterHub

    return JupyterHub.instance() if JupyterHub.initialized() else None


def hub_session():
    """The running hub's shared database session (``JupyterHub.db``), or None."""
    app = running_hub()
    return None if app is None else getattr(app, "db", None)


def user_spawner(app, user: str, server: str):
    """``(user, spawner)`` of the hub's server, or ``(None, None)`` when the hub
    has no such user; the spawner is None when the user has no such server."""
    try:
        found = app.users[user]
    except KeyError:
        return None, None
    return found, found.spawners.get(server)


def user_groups(app, user: str) -> list[str] | None:
    """The names of the user's JupyterHub groups (an authenticator's included); None: no such user."""
    try:
        found = app.users[user]
    except KeyError:
        return None
    return [g.name for g in found.groups]


def group_members(app, group: str) -> list[str] | None:
    """The names of a JupyterHub group's members; None: no such group."""
    from jupyterhub import orm

    found = orm.Group.find(app.db, group)
    return None if found is None else [u.name for u in found.users]


# -- dockerspawner -------------------------------------------------------------------


def docker_connection(spawner_class: type, config) -> Callable[[], tuple[Any, Any]]:
    """How to reach Docker as the hub's spawners do: a call that returns
    dockerspawner's client and executor for ``spawner_class`` (made from its
    ``client_kwargs``, ``tls_config`` and ``DOCKER_HOST``, shared by the class).
    The call connects, so it runs off the event loop, at first use."""

    def connect():
        spawner = spawner_class(config=config, user=NOBODY)
        return spawner.client, spawner.executor

    return connect


def service_names(spawner_class: type, config) -> Callable[[str, str], str]:
    """The service name the hub gives ``(user, server)``, as its spawners render
    dockerspawner's ``name_template``."""

    @functools.lru_cache(maxsize=4096)
    def name_for(user: str, server: str) -> str:
        named = SimpleNamespace(name=server, display_name=server, server=None, state=None)
        return spawner_class(config=config, user=SimpleNamespace(name=user, id=0), orm_spawner=named).service_name

    return name_for


async def admin_settings(spawner) -> dict:
    """The admin's dockerspawner settings that go into a service, evaluated as
    dockerspawner evaluates them (callables, templates, volumes as binds)."""
    extra_create = spawner._eval_if_callable(spawner.extra_create_kwargs)
    if inspect.isawaitable(extra_create):
        extra_create = await extra_create
    return dict(
        environment=spawner.environment,
        extra_container_spec=spawner.extra_container_spec,
        extra_placement_spec=spawner.extra_placement_spec,
        extra_task_spec=spawner.extra_task_spec,
        extra_create_kwargs=spawner._render_templates(extra_create or {}),
        extra_resources_spec=spawner.extra_resources_spec,
        # as the spec will mount them: {source: {"bind": target, ...}}, templates filled in
        volumes=spawner._volumes_to_binds(spawner.volumes, {}),
        read_only_volumes=spawner._volumes_to_binds(spawner.read_only_volumes, {}, mode="ro"),
    )


# -- JupyterHub ----------------------------------------------------------------------


def hold_spawn_slot(settings: dict | None, delta: int) -> None:
    """Raise (or lower back) the hub's ``concurrent_spawn_limit`` by ``delta``
    waiting spawns, so that spawns waiting in line don't use up its slots."""
    if settings is None:
        return
    base = settings.setdefault(SPAWN_LIMIT_BASE, settings.get(SPAWN_LIMIT, 0) or 0)
    settings[WAITING] = max(0, settings.get(WAITING, 0) + delta)
    if base:
        settings[SPAWN_LIMIT] = base + settings[WAITING]


def spawn_limit_settings() -> dict | None:
    """The settings JupyterHub's handlers read ``concurrent_spawn_limit`` from
    (the tornado application's: a copy of the hub's ``tornado_settings``)."""
    app = running_hub()
    application = None if app is None else getattr(app, "tornado_application", None)
    return None if application is None else application.settings


async def hub_started(app) -> None:
    """Wait until the hub has started (its proxy and users are ready)."""
    started = getattr(app, "_start_future", None)
    if started is not None:
        await started


def spawn_in_background(app, user, server: str, options: dict) -> asyncio.Future:
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
    return future


async def stop_server(app, user: str, server: str) -> bool:
    """Stop the server as ``DELETE /users/NAME/servers/SERVER`` does, so that
    JupyterHub's state (server row, proxy route, activity) stays right. False
    when the hub has no such server running, or it is mid-spawn or mid-stop."""
    found, spawner = user_spawner(app, user, server)
    if spawner is None or not spawner.active or spawner.pending:
        return False
    spawner._stop_pending = True  # as JupyterHub's stop does: no start or stop of it meanwhile
    try:
        await app.proxy.delete_user(found, server)
        await found.stop(server)
    finally:
        spawner._stop_pending = False
    return True


def touch_activity(app, user: str, server: str) -> None:
    """A busy GPU is activity: the server's (and its user's) last_activity is now."""
    found, spawner = user_spawner(app, user, server)
    if spawner is None or not spawner.active or spawner.orm_spawner is None:
        return
    now = datetime.now(timezone.utc).replace(tzinfo=None)  # JupyterHub stores naive UTC
    spawner.orm_spawner.last_activity = now
    if found.orm_user.last_activity is None or found.orm_user.last_activity < now:
        found.orm_user.last_activity = now
    app.db.commit()
