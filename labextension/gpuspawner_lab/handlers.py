"""``GET {base_url}gpuspawner-lab/status``: this server's GPUs, for the status bar.

The server asks the hub (``GET {JUPYTERHUB_API_URL}/gpuspawner/servers/USER/SERVER``)
with its own token, which may read only its own server, and passes the answer on,
with ``available: true``. Not under JupyterHub, or when the hub cannot be asked,
the answer says so (``available: false`` and a message) and the item stays hidden:
nothing else in JupyterLab depends on it. Answers are kept for ``refresh_seconds``
(as often as the node's reports arrive), so open tabs do not multiply the hub's work.
"""

from __future__ import annotations

import json
import os
import time
from urllib.parse import quote

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

__all__ = ["StatusHandler", "hub_status_url", "setup_handlers", "status"]

ASK_TIMEOUT = 10.0  # seconds for the hub's answer


def hub_status_url(env=os.environ) -> str | None:
    """Where the hub tells this server's GPUs; None when not started by a hub."""
    api, user = env.get("JUPYTERHUB_API_URL"), env.get("JUPYTERHUB_USER")
    if not api or not user or not env.get("JUPYTERHUB_API_TOKEN"):
        return None
    server = env.get("JUPYTERHUB_SERVER_NAME", "")
    path = f"/gpuspawner/servers/{quote(user, safe='')}" + (f"/{quote(server, safe='')}" if server else "")
    return api.rstrip("/") + path


_kept: tuple[float, dict] | None = None  # (until when, the answer): one per server process


async def status() -> dict:
    """This server's GPUs as the hub tells them, kept for ``refresh_seconds`` (the
    status bar's tabs and the stop-notice file share one answer)."""
    global _kept
    if _kept is not None and time.monotonic() < _kept[0]:
        return _kept[1]
    answer = await _ask_hub()
    if answer.get("available"):
        _kept = (time.monotonic() + float(answer.get("refresh_seconds") or 0), answer)
    return answer


async def _ask_hub() -> dict:
    url = hub_status_url()
    if url is None:
        return {"available": False, "message": "This server was not started by JupyterHub."}
    try:
        response = await AsyncHTTPClient().fetch(
            url,
            headers={"Authorization": f"token {os.environ['JUPYTERHUB_API_TOKEN']}"},
            request_timeout=ASK_TIMEOUT,
        )
        body = json.loads(response.body)
    except HTTPClientError as exc:
        if exc.code == 404:  # a hub without gpuspawner's endpoint
            return {"available": False, "message": "The hub does not tell GPUs (no gpuspawner there)."}
        return {"available": False, "message": f"The hub could not be asked for the GPUs: {exc}"}
    except (OSError, ValueError) as exc:
        return {"available": False, "message": f"The hub could not be asked for the GPUs: {exc}"}
    return {**body, "available": True}


class StatusHandler(APIHandler):
    @web.authenticated
    async def get(self):
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(await status()))


def setup_handlers(web_app) -> None:
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base, "gpuspawner-lab", "status"), StatusHandler)])
