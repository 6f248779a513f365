"""The server's own client for the hub's API looks the hub's name up afresh.

JupyterHub 6's single-user server asks the hub (each login to the server, its activity)
through ``jupyterhub.httpclient``, with aiohttp. With aiodns installed, which JupyterHub
requires, aiohttp resolves through c-ares, and c-ares keeps an answer for its DNS lifetime:
600 s in a swarm's DNS. A server that reaches the hub by a service's name (the stack's
servers reach it through the proxy's) went on asking the old address for up to ten
minutes after that service's task started again elsewhere, and every fresh login to the
server failed meanwhile. Here the client is made, before its first request, with a
resolver that asks getaddrinfo (the overlay's DNS, which keeps nothing) for each new
connection: a few lookups a minute.

Nothing in JupyterHub's configuration reaches that client in a single-user server (it is
made without a parent), so it is made here, with its own documented option
``connector_options``, on the server's event loop, when this extension loads: before
JupyterHub's own extension, which loads after it (Jupyter loads extensions in the order of
their names) and asks the hub as it loads.
"""

from __future__ import annotations

from typing import Any

__all__ = ["look_hub_up_afresh"]


def look_hub_up_afresh(io_loop: Any, log: Any) -> bool:
    """Make JupyterHub's HTTP client for ``io_loop`` (a tornado IOLoop, not running) with
    fresh lookups; True if it was made so. False where there is no such client (JupyterHub
    before 6 asks with tornado, which keeps no answers) or it was made before."""
    try:
        from aiohttp.resolver import ThreadedResolver  # noqa: PLC0415
        from jupyterhub.httpclient import JupyterHubHTTPClient  # noqa: PLC0415
    except ImportError:
        return False

    if JupyterHubHTTPClient.initialized():  # something asked before us: it keeps its answers
        log.warning("gpuspawner-lab: JupyterHub's HTTP client was made first; it keeps DNS answers")
        return False

    async def make() -> None:
        # Both take the running loop: the server's, the one each request to the hub runs on.
        JupyterHubHTTPClient.instance(connector_options={"resolver": ThreadedResolver(), "use_dns_cache": False})

    io_loop.run_sync(make)
    log.info("gpuspawner-lab: the hub's address is looked up for each new connection to it")
    return True
