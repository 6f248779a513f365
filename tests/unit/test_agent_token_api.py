"""Node agents' tokens in a real JupyterHub, served over HTTP on loopback: who may
issue, rotate, revoke and list them (admins only), and what a report made with one
may do (report for its own node only). The hub is initialized from ``configure(c)``'s
config as in test_hubconfig.py; its swarm is the in-process fake of tests/fakedocker.py
and its ledger a SQLite file."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from jupyterhub.app import JupyterHub
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from traitlets.config import Config

from gpuspawner.cli import main
from gpuspawner.core import agent_tokens
from gpuspawner.hub.app import KEY
from gpuspawner.hubconfig import configure
from gpuspawner.spawn.spawner import GPUSwarmSpawner
from tests.fakedocker import FakeDocker
from tests.unit.test_reports import device, report

ADMIN = "admin-token-0123456789abcdef"
SHARED = "shared-agent-token-0123456789"
READER = "reader-token-0123456789abcdef"
INVALID = "Missing or invalid credentials."


async def served(config: Config) -> tuple[JupyterHub, HTTPServer, int]:
    """A JupyterHub made from ``config`` and served over HTTP on a free loopback port: the
    process's hub, as `jupyterhub` makes it (the one gpuspawner's hub_port finds)."""
    JupyterHub.clear_instance()
    app = JupyterHub.instance()
    app.update_config(config)
    await app.initialize([])
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(app.tornado_application)
    server.add_sockets(sockets)
    return app, server, sockets[0].getsockname()[1]


def hub_config(tmp_path, **gpu_settings) -> Config:
    c = Config()
    c.JupyterHub.spawner_class = type(
        "FakeSwarmSpawner",
        (GPUSwarmSpawner,),
        {"_client": FakeDocker(["manager", "gpu-a", "gpu-b"]), "_executor": ThreadPoolExecutor(2)},
    )
    c.JupyterHub.db_url = "sqlite:///:memory:"
    c.JupyterHub.cookie_secret = b"0" * 32
    c.GPUSwarmSpawner.gpu_inventory_source = ["agent"]
    c.GPUSwarmSpawner.gpu_db_url = f"sqlite:///{tmp_path}/gpuspawner.sqlite"
    for key, value in gpu_settings.items():
        setattr(c.GPUSwarmSpawner, key, value)
    c.JupyterHub.services = [
        {"name": "admin", "api_token": ADMIN},
        {"name": "agents", "api_token": SHARED},
        {"name": "reader", "api_token": READER},
    ]
    configure(c)  # defines the report scope, which the roles below use
    c.JupyterHub.load_roles = [
        {"name": "gpu-admin", "scopes": ["admin:servers"], "services": ["admin"]},
        {"name": "gpuspawner-agent", "scopes": ["custom:gpuspawner:report"], "services": ["agents"]},
        {"name": "reader", "scopes": ["read:users"], "services": ["reader"]},
    ]
    return c


class Client:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}/hub/api/gpuspawner/"

    async def __call__(self, method: str, path: str, token: str | None, body=None) -> tuple[int, dict]:
        headers = {"Authorization": f"token {token}"} if token else {}
        data = None if method in ("GET", "DELETE") else json.dumps(body or {})
        r = await AsyncHTTPClient().fetch(
            self.base + path, method=method, headers=headers, body=data, raise_error=False
        )
        return r.code, json.loads(r.body or b"{}")

    async def report(self, token: str | None, host: str, *devices) -> tuple[int, dict]:
        return await self("POST", "report", token, report(*devices, hostname=host))

    async def issue(self, host: str) -> str:
        code, answer = await self("POST", f"agent-tokens/{host}", ADMIN)
        assert code == 200, answer
        return answer["token"]


@pytest.fixture
async def hub(monkeypatch, tmp_path):
    """A started hub's client, for a config built by the test: ``await hub(config)``."""
    monkeypatch.chdir(tmp_path)
    servers, hubs = [], []

    async def start(config: Config) -> Client:
        app, server, port = await served(config)
        hubs.append(app.tornado_settings[KEY])
        servers.append(server)
        return Client(port)

    yield start
    for server in servers:
        server.stop()
    for gpu_hub in hubs:  # configure(c) started its loops in this test's loop
        await gpu_hub.stop()
    JupyterHub.clear_instance()


def b0():
    return device(0, "GPU-b0")


async def test_a_node_token_reports_for_its_own_node_only(hub, tmp_path):
    """Guards docs/security.md, "A node's agent token": "report for a host that is not a node (400),
    use any other endpoint (403)" and "report for another node's hostname: 403 with one sentence"."""
    api = await hub(hub_config(tmp_path))
    a, b = await api.issue("gpu-a"), await api.issue("gpu-b")
    assert await api.report(b, "gpu-b", b0()) == (
        200,
        {"hostname": "gpu-b", "devices": 1, "interval": 15.0, "left_out": []},
    )
    assert (await api.report(a, "gpu-a", device(0, "GPU-a0")))[0] == 200

    code, answer = await api.report(a, "gpu-b")  # gpu-a's token says gpu-b has no GPU
    assert code == 403
    assert answer["message"] == agent_tokens.refusal("gpu-a", "gpu-b")
    _, alloc_map = await api("GET", "alloc-map", ADMIN)
    assert list(alloc_map["gpu-b"]) == ["GPU-b0"]  # nothing changed


async def test_a_rotated_or_revoked_token_stops_working_at_once(hub, tmp_path):
    """Guards docs/security.md, "A node's agent token": "go on working once rotated or revoked: the old
    token gets 403 at once".

    Guards docs/nodes.md, "Where the hub learns the GPUs": "issuing again rotates it, and the old
    one stops working at once"."""
    api = await hub(hub_config(tmp_path))
    old = await api.issue("gpu-a")
    code, answer = await api("POST", "agent-tokens/gpu-a", ADMIN)
    assert code == 200 and answer["rotated"] is True and answer["node"] is True
    new = answer["token"]
    assert await api.report(old, "gpu-a") == (403, {"status": 403, "message": INVALID})
    assert (await api.report(new, "gpu-a"))[0] == 200

    assert await api("DELETE", "agent-tokens/gpu-a", ADMIN) == (200, {"host": "gpu-a", "revoked": True})
    assert await api.report(new, "gpu-a") == (403, {"status": 403, "message": INVALID})
    code, answer = await api("DELETE", "agent-tokens/gpu-a", ADMIN)
    assert code == 404 and answer["message"] == "gpu-a has no agent token: nothing was revoked"


async def test_the_list_names_hosts_and_never_tokens(hub, tmp_path):
    """Guards docs/security.md, "A node's agent token": "the list shows hosts and times"."""
    api = await hub(hub_config(tmp_path))
    tokens = [await api.issue(h) for h in ("gpu-b", "gpu-a", "gpu-c")]
    code, answer = await api("GET", "agent-tokens", ADMIN)
    assert code == 200 and [h["host"] for h in answer["hosts"]] == ["gpu-a", "gpu-b", "gpu-c"]
    text = json.dumps(answer)
    assert not any(t in text or agent_tokens.digest(t) in text for t in tokens)
    stored = (tmp_path / "gpuspawner.sqlite").read_bytes()  # the ledger keeps digests only
    assert agent_tokens.digest(tokens[0]).encode() in stored and not any(t.encode() in stored for t in tokens)
    _, answer = await api("POST", "agent-tokens/gpu-c", ADMIN)
    assert answer["node"] is False  # issued ahead of the node's joining


@pytest.mark.parametrize("token", [None, READER, SHARED, "node"])
async def test_only_admins_may_issue_revoke_or_list_tokens(hub, tmp_path, token):
    """Guards docs/security.md, "An admin (of JupyterHub, or its configuration)": "others (users, agent
    tokens, the shared token) get 403 and change nothing"."""
    api = await hub(hub_config(tmp_path, agent_shared_token=True))
    a = await api.issue("gpu-a")
    token = a if token == "node" else token
    for method, path in (("GET", "agent-tokens"), ("POST", "agent-tokens/gpu-b"), ("DELETE", "agent-tokens/gpu-a")):
        assert (await api(method, path, token))[0] == 403, (method, path)
    _, answer = await api("GET", "agent-tokens", ADMIN)
    assert [h["host"] for h in answer["hosts"]] == ["gpu-a"]  # nothing changed
    assert (await api.report(a, "gpu-a"))[0] == 200


@pytest.mark.parametrize(
    "path, message",
    [
        ("agent-tokens/-gpu", "'-gpu' is not a hostname"),
        ("agent-tokens/gpu%20a", "'gpu a' is not a hostname"),
        ("agent-tokens", "name the node"),
    ],
)
async def test_a_bad_hostname_is_refused_with_a_sentence_and_nothing_is_stored(hub, tmp_path, path, message):
    api = await hub(hub_config(tmp_path))
    code, answer = await api("POST", path, ADMIN)
    assert code == 400 and message in answer["message"]
    assert (await api("GET", "agent-tokens", ADMIN))[1] == {"hosts": []}


async def test_unknown_tokens_get_todays_answer(hub, tmp_path):
    api = await hub(hub_config(tmp_path))
    await api.issue("gpu-a")
    for token in (None, "wrong", agent_tokens.new_token(), ADMIN, READER):
        code, answer = await api.report(token, "gpu-a", device(0, "GPU-a0"))
        assert code == 403, token
    assert (await api.report(ADMIN, "gpu-a"))[1]["message"].endswith("requires custom:gpuspawner:report")


async def test_the_shared_token_is_refused_by_default_with_a_sentence(hub, tmp_path):
    """Guards docs/security.md, "A node's agent token": "report at all by default: 403 with a sentence
    saying how to move".

    Guards docs/nodes.md, "Where the hub learns the GPUs": "is refused unless
    c.GPUSwarmSpawner.agent_shared_token = True"."""
    api = await hub(hub_config(tmp_path))
    assert await api.report(SHARED, "gpu-a") == (403, {"status": 403, "message": agent_tokens.SHARED_TOKEN_REFUSED})
    _, doctor = await api("GET", "doctor", ADMIN)
    assert not any("agent_shared_token" in f["problem"] for f in doctor["findings"])


async def test_the_shared_token_works_while_allowed_and_doctor_warns(hub, tmp_path):
    """Guards docs/security.md, "A node's agent token": "report for any node, only while
    agent_shared_token is on; doctor warns meanwhile"."""
    api = await hub(hub_config(tmp_path, agent_shared_token=True))
    assert (await api.report(SHARED, "gpu-b", b0()))[0] == 200
    _, doctor = await api("GET", "doctor", ADMIN)
    (warning,) = [f for f in doctor["findings"] if "agent_shared_token" in f["problem"]]
    assert warning["severity"] == "warning" and "gpuspawner agent-token HOST" in warning["fix"]
    a = await api.issue("gpu-a")  # node tokens keep their rule meanwhile
    assert (await api.report(a, "gpu-b"))[0] == 403


async def test_the_cli_says_when_the_host_is_no_swarm_node_yet(hub, tmp_path, capsys, monkeypatch):
    api = await hub(hub_config(tmp_path))
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", ADMIN)
    hub_url = api.base.split("/hub/")[0]
    loop = asyncio.get_running_loop()
    for host, note in (
        ("gpu-a", "Issued; install it on gpu-a (docs/agent.md)."),
        ("gpu-z", "gpu-z is not a swarm node yet"),
    ):
        assert await loop.run_in_executor(None, main, ["--hub-url", hub_url, "agent-token", host]) == 0
        out, err = capsys.readouterr()
        assert agent_tokens.is_node_token(out.strip()) and note in err
        assert (await api.report(out.strip(), host))[0] == (200 if host == "gpu-a" else 400)
