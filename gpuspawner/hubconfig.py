"""One call in jupyterhub_config.py that sets the hub up for gpuspawner.

::

    from gpuspawner.hubconfig import configure
    configure(c)

registers gpuspawner's endpoints and admin page (see ``api.py``), defines the
``custom:gpuspawner:report`` scope that node agents' tokens get, adds the
admin page's template folder, and checks gpuspawner's settings at once (see
:func:`gpuspawner.settings.validate_config`), so that a wrong setting stops the
hub at start with one line. Call it at the end of the file, after the
``c.GPUSwarmSpawner`` settings.
"""

from __future__ import annotations

import asyncio
import logging
import os

__all__ = ["configure"]

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


def configure(c) -> None:
    from . import api, api_reclaim, home_budget, metrics, reclaim_hub
    from .settings import validate_config

    # JupyterHub logs that extra_handlers is deprecated in favour of services;
    # these must run inside the hub, where the holdings live (README, "How
    # configure(c) registers the endpoints"; tests/unit/test_hubconfig.py).
    c.JupyterHub.extra_handlers.extend(api.handlers + api_reclaim.handlers)
    c.JupyterHub.custom_scopes.update(
        {api.REPORT_SCOPE: {"description": "Report a GPU node's devices to gpuspawner (node agents only)."}}
    )
    _add_templates(c)
    c.JupyterHub.template_vars.update(
        {"gpuspawner_budget": home_budget.budget_var(c), "gpuspawner_notices": reclaim_hub.notices_var(c)}
    )  # home.html
    metrics.use_cluster(lambda: api.hub_view(c).holdings().cluster)
    validate_config(c)
    try:
        asyncio.get_running_loop()  # JupyterHub reads its config inside its event loop
    except RuntimeError:
        return  # loaded outside a hub (a test, a linter): nothing to run
    for job in (_keep_reconciling(c), metrics.watch_event_loop(), reclaim_hub.keep_checking(c)):
        _run(job)


_background: set = set()


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


def _run(job) -> None:
    task = asyncio.get_running_loop().create_task(job)
    _background.add(task)  # the loop keeps only weak references to tasks
    task.add_done_callback(_background.discard)


async def _resume(owner, log) -> None:
    from .line_resume import resume_waiting

    try:
        await resume_waiting(owner)
    except Exception as exc:  # the hub runs on; say what happened in one line
        log.error("Resuming the spawns waiting in line failed: %s", getattr(exc, "message", exc))


def _untracked(user: str, server: str) -> bool:
    """True when the running hub has no such server running or starting."""
    from jupyterhub.app import JupyterHub

    if not JupyterHub.initialized():
        return False
    try:
        spawner = JupyterHub.instance().users[user].spawners.get(server)
    except KeyError:  # no such user
        return True
    return spawner is None or not spawner.active


async def _keep_reconciling(config) -> None:
    """At hub start, and then every ``reconcile_interval`` seconds, make the
    GPU holdings match the services the swarm runs (see Holdings.reconcile)."""
    from .api import hub_view
    from .swarm import SwarmError

    log = logging.getLogger("JupyterHub")
    view = hub_view(config, log=log)
    first = True
    while True:
        try:
            owner = await view._up_to_date()  # the first use rebuilds holdings from the swarm
            if first:
                _run(_resume(owner, log))  # the spawns waiting in line when the hub stopped
            else:
                await owner.reconcile(_untracked)
            first = False
        except SwarmError as exc:
            log.warning("GPU reconciliation: the swarm could not be asked: %s", exc)
        except Exception as exc:  # never let the loop die; say what happened in one line
            log.error("GPU reconciliation failed: %s", getattr(exc, "message", exc))
        if view.reconcile_interval <= 0:
            return
        await asyncio.sleep(view.reconcile_interval)
