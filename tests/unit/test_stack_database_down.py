"""The stack's shared database down, as users and agents meet it: a real JupyterHub served on
loopback (the hub of tests/unit/test_agent_token_api.py, its swarm the in-process fake)
whose own database and GPU ledger are one real PostgreSQL database (devtools/postgres.py),
as examples/stack/jupyterhub_config.py has them. The server is stopped ("fast", as a
stopped service's is) and started again under the same running hub.

Guards docs/reliability.md, "The production stack as a whole": "The hub's health check
answers, so the swarm does not restart the hub", "A login fails (500)", "A browser already
logged in is sent to the login page", "Every request with an API token is refused (403
Missing or invalid credentials)", "A spawn request is refused before it reaches the
spawner", "An agent's report is refused (503, the ledger's database is unreachable)" and
"The same hub answers as before, without a restart: the browser's session is still logged
in, tokens work, logins and spawns work, and the agents' next reports are taken" and "The
first request that needs the database waits 30 s for it, then fails; the next ones fail at
once until a connection succeeds"."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import requests
from tornado.httpclient import AsyncHTTPClient

from devtools import postgres
from gpuspawner.hub.app import KEY
from gpuspawner.hub.database_wait import WAIT_SECONDS, waiting_connections
from tests.ci import skip_or_fail
from tests.unit.test_agent_token_api import ADMIN, READER, hub, hub_config  # noqa: F401 - hub: the fixture
from tests.unit.test_reports import device

A100 = "NVIDIA A100 80GB PCIe"
INVALID = {"status": 403, "message": "Missing or invalid credentials."}


@pytest.fixture
def database():
    reason = postgres.unavailable_reason()
    if reason:
        skip_or_fail(reason)
    server = postgres.PostgresServer.create()
    try:
        yield server
    finally:
        server.destroy()


async def fetch(url: str, method: str = "GET", token: str | None = None, body: dict | None = None):
    """(status, JSON body or None, Location) of one request, redirects not followed."""
    r = await AsyncHTTPClient().fetch(
        url,
        method=method,
        headers={"Authorization": f"token {token}"} if token else {},
        body=None if body is None else json.dumps(body),
        raise_error=False,
        follow_redirects=False,
        request_timeout=60,
    )
    try:
        answer = json.loads(r.body) if r.body else None
    except ValueError:
        answer = None
    return r.code, answer, r.headers.get("Location")


class Browser:
    """A user's browser: a session with the hub's cookies, its requests off the event loop."""

    def __init__(self, url: str):
        self.url, self.session = url, requests.Session()

    async def _run(self, call):
        return await asyncio.get_running_loop().run_in_executor(None, call)

    async def login(self, user: str) -> tuple[int, str | None]:
        def login():
            self.session.get(self.url + "/hub/login", timeout=90)
            data = {"username": user, "password": "x", "_xsrf": self.session.cookies.get("_xsrf")}
            r = self.session.post(self.url + "/hub/login", data=data, timeout=90, allow_redirects=False)
            return r.status_code, r.headers.get("Location")

        return await self._run(login)

    async def home(self) -> tuple[int, str | None]:
        def home():
            r = self.session.get(self.url + "/hub/home", timeout=90, allow_redirects=False)
            return r.status_code, r.headers.get("Location")

        return await self._run(home)


async def stack_like_hub(hub, database, tmp_path):  # noqa: F811
    """A hub whose own database and GPU ledger are one PostgreSQL database, connecting as
    examples/stack/jupyterhub_config.py has it connect: (its API, its URL, its config)."""
    url = database.create_database("jupyterhub")
    config = hub_config(
        tmp_path,
        gpu_inventory_source=["static"],
        gpu_inventory={"gpu-b": [{"uuid": "GPU-b0", "model": A100, "memory_mib": 81920}]},
    )
    config.JupyterHub.db_url = config.GPUSwarmSpawner.gpu_db_url = url  # one database, as the stack's
    config.JupyterHub.db_kwargs = waiting_connections(url)  # as the stack's
    config.JupyterHub.authenticator_class = "dummy"
    config.Authenticator.allow_all = True
    config.JupyterHub.tornado_settings.update({"slow_spawn_timeout": 1})
    api = await hub(config)
    return api, api.base.split("/hub/")[0], config


async def test_the_shared_database_down_and_back_under_a_running_hub(hub, database, tmp_path):  # noqa: F811
    api, base, config = await stack_like_hub(hub, database, tmp_path)
    alice = Browser(base)
    assert await alice.login("alice") == (302, "/hub/spawn")
    assert await alice.home() == (200, None)
    node = await api.issue("gpu-b")
    assert (await api.report(node, "gpu-b", device(0, "GPU-b0")))[0] == 200

    await asyncio.sleep(1.5)  # the session's idle transaction ended (database_wait)
    database.stop()  # "fast": every connection ends, as the stack's database service stops
    assert (await fetch(base + "/hub/health"))[0] == 200
    # The first request that needs the database waits WAIT_SECONDS for it, then fails; the
    # next ones fail at once until it is back.
    asked = time.monotonic()
    assert (await Browser(base).login("bob"))[0] == 500
    assert WAIT_SECONDS <= time.monotonic() - asked < WAIT_SECONDS + 5
    asked = time.monotonic()
    assert await alice.home() == (302, "/hub/login?next=%2Fhub%2Fhome")
    assert (await fetch(base + "/hub/api/users/alice", token=READER))[:2] == (403, INVALID)
    for options in ({}, {"gpu_model": A100}):
        assert (await fetch(base + "/hub/api/users/alice/server", "POST", ADMIN, options))[:2] == (403, INVALID)
    code, answer = await api.report(node, "gpu-b", device(0, "GPU-b0"))
    assert code == 503 and "GPU ledger database" in answer["message"] and "Connection refused" in answer["message"]
    holdings = config.JupyterHub.tornado_settings.get_value({})[KEY].holdings
    assert holdings.all() == {}  # no server was started, no GPU booked
    assert time.monotonic() - asked < 5  # no more waits

    database.start()  # the same hub, not restarted
    assert await alice.home() == (200, None)
    code, answer, _ = await fetch(base + "/hub/api/users/alice", token=READER)
    assert code == 200 and answer["name"] == "alice"
    assert (await Browser(base).login("bob"))[0] == 302
    assert (await api.report(node, "gpu-b", device(0, "GPU-b0")))[0] == 200
    assert (await fetch(base + "/hub/api/users/alice/server", "POST", ADMIN, {"gpu_model": A100}))[0] in (201, 202)
    assert [h.held.uuids for h in holdings.all().values()] == [("GPU-b0",)]


async def test_a_short_restart_of_the_shared_database_is_a_pause_for_users(hub, database, tmp_path):  # noqa: F811
    """Guards docs/reliability.md, "The production stack as a whole": "a restart shorter than
    that is a pause: each request waits for the database and is answered as usual"."""
    api, base, config = await stack_like_hub(hub, database, tmp_path)
    alice = Browser(base)
    assert await alice.login("alice") == (302, "/hub/spawn")
    node = await api.issue("gpu-b")
    assert (await api.report(node, "gpu-b", device(0, "GPU-b0")))[0] == 200

    await asyncio.sleep(1.5)  # the session's idle transaction ended (database_wait)
    database.stop()
    back = threading.Timer(2, database.start)  # its restart: back 2 s later
    back.start()
    asked = time.monotonic()
    try:
        code, answer, _ = await fetch(base + "/hub/api/users/alice", token=READER)
        assert code == 200 and answer["name"] == "alice"
        assert time.monotonic() - asked >= 2  # it waited for the database
        assert await alice.home() == (200, None)
        assert (await Browser(base).login("bob"))[0] == 302
        assert (await fetch(base + "/hub/api/users/alice/server", "POST", ADMIN, {"gpu_model": A100}))[0] in (201, 202)
        assert (await api.report(node, "gpu-b", device(0, "GPU-b0")))[0] == 200
    finally:
        back.join()
    holdings = config.JupyterHub.tornado_settings.get_value({})[KEY].holdings
    assert [h.held.uuids for h in holdings.all().values()] == [("GPU-b0",)]
