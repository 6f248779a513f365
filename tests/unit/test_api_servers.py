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
