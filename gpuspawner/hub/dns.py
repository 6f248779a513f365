"""The hub's HTTP client looks names up afresh.

JupyterHub 6 talks to servers and to the proxy with aiohttp. With aiodns installed (a
JupyterHub dependency), aiohttp resolves through c-ares, whose cache keeps an answer for
its DNS lifetime: 600 s in a swarm's DNS. A server reached by its service's name gets a
new address each time it starts; a user who stopped and started again within those 10
minutes met "never showed up ... after http_timeout" while the hub tried the old one.
:class:`FreshResolver` asks getaddrinfo on each new connection instead (the overlay's
DNS, no cache): a few lookups a minute, not a cost worth caching for.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Any

from aiohttp.abc import AbstractResolver
from aiohttp.resolver import ThreadedResolver

if TYPE_CHECKING:  # aiohttp >= 3.10 has it; the annotation is never evaluated
    from aiohttp.abc import ResolveResult


class FreshResolver(AbstractResolver):
    """getaddrinfo (in the loop's executor) for every lookup. Made at config time,
    outside any event loop: it uses the loop that is running when it resolves."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return await ThreadedResolver(asyncio.get_running_loop()).resolve(host, port, family)

    async def close(self) -> None:
        pass


def fresh_lookups(c: Any) -> None:
    """``c.JupyterHubHTTPClient.connector_options`` with :class:`FreshResolver` and no
    aiohttp DNS cache; what the admin set there (a resolver of their own) wins."""
    fresh = {"resolver": FreshResolver(), "use_dns_cache": False}
    current = c.JupyterHubHTTPClient.get("connector_options") or {}
    if not isinstance(current, dict):  # a lazy value: what .update() calls gave it
        current = current.to_dict().get("update", {})
    c.JupyterHubHTTPClient.connector_options = {**fresh, **current}
