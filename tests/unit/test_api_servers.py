"""``GET /hub/api/gpuspawner/servers/USER[/SERVER]`` (web/api_servers.py) in a real
JupyterHub served over HTTP on loopback, as test_agent_token_api.py serves one: who may
read which server. A server's own token (JupyterHub's ``server`` role, as JupyterHub makes
it at a spawn) reads that server only; what a token may not see is JupyterHub's 404, as
its own API answers (it cannot tell which servers exist); no valid credentials, 403."""

from __future__ import annotations

import json

import pytest
from jupyterhub import orm
from jupyterhub.app import JupyterHub
from tornado.httpclient import AsyncHTTPClient

from gpuspawner.hub.app import KEY
from tests.unit.test_agent_token_api import hub_config, served


@pytest.fixture
async def hub(monkeypatch, tmp_path):
    """A started hub with the users anna and mia: (its app, the URL of the endpoint)."""
    monkeypatch.chdir(tmp_path)
    config = hub_config(tmp_path)
    config.Authenticator.allowed_users = {"anna", "mia"}
    app, server, port = await served(config)
    yield app, f"http://127.0.0.1:{port}/hub/api/gpuspawner/servers/"
    server.stop()
    await app.tornado_settings[KEY].stop()


def server_token(app: JupyterHub, user: str, server: str = "") -> str:
    """The token JupyterHub gives a server (``JUPYTERHUB_API_TOKEN``): the ``server``
    role's scopes, its ``!server`` filter naming that server (jupyterhub/user.py)."""
    scopes = [s + f"={user}/{server}" if s.endswith("!server") else s for s in orm.Role.find(app.db, "server").scopes]
    return app.users[orm.User.find(app.db, user)].new_api_token(scopes=scopes, note="server")


async def test_a_servers_own_token_reads_its_own_server_only_and_others_get_404(hub):
    """Guards docs/jupyterlab.md, "How it asks the hub": "a server's own token (JupyterHub's server
    role) reads that server only", "A token that may not see the server gets 404, not 403" and "A
    request without valid credentials gets 403"."""
    app, url = hub

    async def ask(path: str, token: str | None) -> tuple[int, dict]:
        headers = {"Authorization": f"token {token}"} if token else {}
        r = await AsyncHTTPClient().fetch(url + path, headers=headers, raise_error=False)
        return r.code, json.loads(r.body or b"{}")

    anna = server_token(app, "anna")
    assert await ask("anna", anna) == (200, {"server": "", "devices": [], "refresh_seconds": 15.0})  # holds nothing
    assert (await ask("anna/big", anna))[0] == 404  # her other server is not this token's
    assert (await ask("mia", anna))[0] == 404  # nor is another user's
    mia = app.users[orm.User.find(app.db, "mia")].new_api_token(note="mia's own")  # as on /hub/token
    assert (await ask("mia/big", mia))[0] == 200  # a user's own token: any of her servers
    assert (await ask("anna", mia))[0] == 404
    assert (await ask("anna", None))[0] == 403  # no credentials
    assert (await ask("anna", "not-a-token"))[0] == 403


async def test_a_multi_gpu_servers_answer_says_how_its_gpus_are_linked(hub, tmp_path):
    """Guards docs/topology.md, "Where you see it": "The servers API" ... "says the same as links" and
    "links is null for a server with one GPU"; docs/jupyterlab.md, "How it asks the hub": "links, how
    the GPUs of a server with several are linked"."""
    from tests.unit.test_gpu_links import BRIDGED, THREE
    from tests.unit.test_holdings import A100, World

    app, url = hub
    world = World(tmp_path, inventory=THREE, max_gpus_per_user=4)  # anna's 2 GPUs and mia's 1, on its hub
    world.hub.holdings.allocator.set_host_topology("gpu-b", BRIDGED)
    await world.started(world.spawner("anna", {"gpu_model": A100, "gpu_count": 2}))
    await world.started(world.spawner("mia", {"gpu_model": A100, "gpu_count": 1}))
    settings = app.tornado_application.settings
    own, settings[KEY] = settings[KEY], world.hub
    try:
        headers = {"Authorization": f"token {server_token(app, 'anna')}"}
        r = await AsyncHTTPClient().fetch(url + "anna", headers=headers)
        links = json.loads(r.body)["links"]
        assert links["summary"] == "Links: 2 NVLinks (GPU 0–1)" and links["worst"] == "2 NVLinks"
        assert links["pairs"] == [{"gpus": [0, 1], "link": "2 NVLinks"}]
        headers = {"Authorization": f"token {server_token(app, 'mia')}"}
        r = await AsyncHTTPClient().fetch(url + "mia", headers=headers)
        assert json.loads(r.body)["links"] is None  # one GPU
    finally:
        settings[KEY] = own
