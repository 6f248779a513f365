"""One call in jupyterhub_config.py that sets the hub up for gpuspawner.

::

    from gpuspawner.hubconfig import configure
    configure(c)

checks gpuspawner's settings at once (see
:func:`gpuspawner.hub.settings.validate_config`), so that a wrong setting stops the
hub at start with one line; builds the hub's one
:class:`~gpuspawner.hub.app.GPUHub` and keeps it in the hub's tornado settings;
registers gpuspawner's endpoints and admin page (see ``web/api.py``), defines the
``custom:gpuspawner:report`` scope that node agents' tokens get, adds the
admin page's template folder, and, inside the running hub, starts the hub's
background loops. Call it at the end of the file, after the
``c.GPUSwarmSpawner`` settings.
"""

from __future__ import annotations

import asyncio
import logging
import os

__all__ = ["configure"]

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


def configure(c) -> None:
    from .hub import dns, logs
    from .hub.app import KEY, GPUHub
    from .hub.settings import validate_config
    from .web import api, api_quotas, api_reclaim, api_reservations, api_servers, home_budget, home_gpus

    validate_config(c)
    log = logging.getLogger("JupyterHub")
    # "none free" is an answer, not a fault (hub/logs.py)
    logs.quiet_ordinary_refusals(log, logging.getLogger("tornado.application"))
    hub = GPUHub(lambda: _hub_config(c), log=log)
    # JupyterHub logs that extra_handlers is deprecated in favour of services;
    # these must run inside the hub, where the holdings live (README, "How
    # configure(c) registers the endpoints"; tests/unit/test_hubconfig.py).
    c.JupyterHub.extra_handlers.extend(
        api.handlers + api_quotas.handlers + api_reclaim.handlers + api_reservations.handlers + api_servers.handlers
    )
    c.JupyterHub.custom_scopes.update(
        {api.REPORT_SCOPE: {"description": "Report a GPU node's devices to gpuspawner (node agents only)."}}
    )
    _add_templates(c)
    # Servers reached by name get a new address at each start: no cached lookups (hub/dns.py).
    dns.fresh_lookups(c)
    c.JupyterHub.tornado_settings.update({KEY: hub})  # handlers' and users' settings
    c.JupyterHub.template_vars.update(
        {
            "gpuspawner_budget": home_budget.budget_var(hub),
            "gpuspawner_notices": hub.notices_for,
            "gpuspawner_servers": home_gpus.servers_var(hub),
            "gpuspawner_waiting": home_gpus.waiting_var(hub),
        }
    )  # home.html
    try:
        asyncio.get_running_loop()  # JupyterHub reads its config inside its event loop
    except RuntimeError:
        return  # loaded outside a hub (a test, a linter): nothing to run
    hub.start()


def _hub_config(c) -> tuple:
    """The running hub's config (all its files and its command line, read by now)
    and spawner class; outside a hub (a test, a tool), this file's."""
    from . import hub_port
    from .spawn.spawner import GPUSwarmSpawner

    app = hub_port.running_hub()
    config, cls = (c, c.JupyterHub.get("spawner_class")) if app is None else (app.config, app.spawner_class)
    # A GPUSwarmSpawner subclass is the hub's own; a name not resolved yet is GPUSwarmSpawner itself.
    return config, cls if isinstance(cls, type) and issubclass(cls, GPUSwarmSpawner) else GPUSwarmSpawner


def _add_templates(c) -> None:
    """gpuspawner's templates (the admin page, and home.html with its notes) go
    after the admin's own ``template_paths`` but before JupyterHub's, which
    would otherwise shadow home.html (the hub appends its own folder last
    only when it is not listed yet)."""
    paths = c.JupyterHub.template_paths
    if isinstance(paths, list):
        paths.append(TEMPLATES)
    else:  # not set yet: a lazy value that JupyterHub's default comes into
        paths.insert(0, TEMPLATES)
