"""The JupyterLab extension's server half (labextension/gpuspawner_lab) in a real Jupyter
server, asking a small stand-in hub on loopback (a tornado app in this test: only the
one endpoint, answering as gpuspawner's does). The endpoint itself, the browser's status
bar and the server's real token are tested on the swarm (tests/integration/test_jupyterlab_status.py).

Guards docs/jupyterlab.md, "The GPUs in JupyterLab's status bar": "and in a real Jupyter server (the
answer kept, a hub that refuses or is not there, the setting's default)"."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from jupyterhub.httpclient import JupyterHubHTTPClient, fetch
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.netutil import bind_sockets

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "labextension"))
from gpuspawner_lab.handlers import hub_status_url  # noqa: E402
from gpuspawner_lab.hub_lookups import look_hub_up_afresh  # noqa: E402

GPUS = {
    "server": "",
    "model": "NVIDIA A100 80GB PCIe",
    "host": "gpu-b",
    "devices": [
        {"uuid": "GPU-b0", "share": "the whole GPU", "entitled_mib": 81920, "used_mib": 900, "utilization": 35}
    ],
    "held_for": "12 min",
    "stops": [],
    "refresh_seconds": 30,
}


def test_the_hub_is_asked_for_this_server_only_and_not_at_all_outside_a_hub():
    env = {"JUPYTERHUB_API_URL": "http://hub:8081/hub/api", "JUPYTERHUB_USER": "anna", "JUPYTERHUB_API_TOKEN": "t"}
    assert hub_status_url(env) == "http://hub:8081/hub/api/gpuspawner/servers/anna"
    named = {**env, "JUPYTERHUB_SERVER_NAME": "big gpu", "JUPYTERHUB_USER": "a/b"}
    assert hub_status_url(named) == "http://hub:8081/hub/api/gpuspawner/servers/a%2Fb/big%20gpu"
    assert hub_status_url({}) is None
    assert hub_status_url({k: v for k, v in env.items() if k != "JUPYTERHUB_API_TOKEN"}) is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandInHub(web.RequestHandler):
    asked: list[tuple[str, str]] = []
    answer: dict = GPUS

    def get(self, user):
        StandInHub.asked.append((self.request.path, self.request.headers.get("Authorization", "")))
        if self.request.headers.get("Authorization") != f"token {user}-server-token":
            raise web.HTTPError(403)
        self.write(StandInHub.answer)


async def jupyter_server(
    tmp_path: Path, hub_port: int, user: str, token: str, **extra_env: str
) -> tuple[subprocess.Popen, str]:
    """A Jupyter server with the extension enabled, as the single-user image has it."""
    port = free_port()
    env = {
        **os.environ,
        **extra_env,
        "PYTHONPATH": str(REPO / "labextension"),
        "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub_port}/hub/api",
        "JUPYTERHUB_USER": user,
        "JUPYTERHUB_API_TOKEN": token,
    }
    cmd = [sys.executable, "-m", "jupyter_server", f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1"]
    cmd += ["--ServerApp.token=lab-token", "--ServerApp.open_browser=False", f"--ServerApp.root_dir={tmp_path}"]
    cmd += ["--ServerApp.jpserver_extensions={'gpuspawner_lab': True}", "--ServerApp.allow_root=True"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if (await asyncio.to_thread(requests.get, f"{url}/api/status?token=lab-token", timeout=2)).ok:
                return proc, url
        except requests.ConnectionError:
            await asyncio.sleep(0.2)
    proc.kill()
    pytest.fail(f"the Jupyter server did not start:\n{proc.communicate()[0][-3000:]}")


async def status(url: str, token: str | None = "lab-token") -> requests.Response:
    headers = {"Authorization": f"token {token}"} if token else {}
    return await asyncio.to_thread(requests.get, f"{url}/gpuspawner-lab/status", headers=headers, timeout=20)


@pytest.fixture
async def hub():
    port = free_port()
    server = HTTPServer(web.Application([(r"/hub/api/gpuspawner/servers/([^/]+)", StandInHub)]))
    server.listen(port, "127.0.0.1")
    StandInHub.asked, StandInHub.answer = [], GPUS
    yield port
    server.stop()


async def test_the_status_is_the_hubs_answer_for_this_server_asked_with_its_token_and_kept_a_while(tmp_path, hub):
    """Guards docs/jupyterlab.md, "The GPUs in JupyterLab's status bar": "the server keeps each answer
    that long, however many tabs are open"."""
    proc, url = await jupyter_server(tmp_path, hub, "anna", "anna-server-token")
    try:
        first = await status(url)
        assert first.status_code == 200 and first.json() == {**GPUS, "available": True}
        assert StandInHub.asked == [("/hub/api/gpuspawner/servers/anna", "token anna-server-token")]
        again = await status(url)  # within refresh_seconds: the hub is not asked again
        assert again.json() == first.json() and len(StandInHub.asked) == 1
        assert (await status(url, token=None)).status_code == 403  # only for the server's own users
    finally:
        proc.terminate()
        proc.wait(10)
    # Under a hub, JupyterHub's own client in the server was made by the extension (see below).
    assert "the hub's address is looked up for each new connection" in proc.stdout.read()


async def test_a_hub_that_refuses_or_is_not_there_is_said_and_nothing_fails(tmp_path, hub):
    """Guards docs/jupyterlab.md, "The GPUs in JupyterLab's status bar": "when the hub cannot be asked,
    the item stays hidden"."""
    proc, url = await jupyter_server(tmp_path, hub, "zed", "a-wrong-token")
    try:
        refused = await status(url)
        assert refused.status_code == 200 and refused.json()["available"] is False
        assert "The hub could not be asked for the GPUs: HTTP 403" in refused.json()["message"]
        assert len(StandInHub.asked) == 1
        await status(url)  # a refusal is not kept: asked again
        assert len(StandInHub.asked) == 2
    finally:
        proc.terminate()
        proc.wait(10)
    # A port bound but not listening refuses connections, and holding it keeps
    # the Jupyter server (which also asks for a free port) from taking it.
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        proc, url = await jupyter_server(tmp_path, gone.getsockname()[1], "anna", "anna-server-token")
        try:
            answer = (await status(url)).json()
            assert answer["available"] is False and answer["message"].startswith("The hub could not be asked")
        finally:
            proc.terminate()
            proc.wait(10)


def test_the_setting_asks_every_15_s_by_default():
    """Guards docs/jupyterlab.md, "The GPUs in JupyterLab's status bar": "Settings → GPU status
    (gpuspawner); 15 by default"."""
    schema = json.loads((REPO / "labextension" / "schema" / "status.json").read_text())
    assert schema["properties"]["refreshSeconds"]["default"] == 15
    assert schema["title"] == "GPU status (gpuspawner)"  # as docs/jupyterlab.md names it in Settings


async def test_an_announced_stop_writes_the_notice_file_and_a_withdrawn_one_removes_it(tmp_path, hub):
    """Guards docs/quotas.md, "A notice a notebook survives": "the file that
    GPUSPAWNER_STOP_NOTICE names appears with the stop time in it", "whether or not a
    browser is open", and "it goes away when the stop is withdrawn"."""
    notice = {
        "reason": "preempted",
        "stop_at": "2026-12-07T13:10:00Z",
        "seconds_left": 600,
        "message": "Your default server will be stopped at 13:10 UTC.",
    }
    StandInHub.answer = {**GPUS, "refresh_seconds": 1, "notices": [notice]}
    path = tmp_path / "stop-notice"
    proc, _ = await jupyter_server(
        tmp_path, hub, "anna", "anna-server-token", GPUSPAWNER_STOP_NOTICE=str(path)
    )  # no browser asks: the server itself does
    try:
        for _ in range(100):
            if path.exists():
                break
            await asyncio.sleep(0.1)
        assert (
            path.read_text() == "2026-12-07T13:10:00Z\npreempted\nYour default server will be stopped at 13:10 UTC.\n"
        )
        StandInHub.answer = {**GPUS, "refresh_seconds": 1, "notices": []}
        for _ in range(150):
            if not path.exists():
                break
            await asyncio.sleep(0.1)
        assert not path.exists()
    finally:
        proc.terminate()
        proc.wait(10)


class ClosingHub(web.RequestHandler):
    def get(self):
        self.set_header("Connection", "close")  # each request a new connection, so a new lookup
        self.write({})


def hub_lookups(afresh: bool) -> list[str]:
    """The names JupyterHub's HTTP client asks the event loop's getaddrinfo for, in two
    requests to a stand-in hub at ``localhost`` (each on a new connection), with the
    extension's client or JupyterHub's own."""
    JupyterHubHTTPClient.clear_instance()  # one a hub of another test made, with its own lookups
    io_loop, asked = IOLoop(), []
    loop = io_loop.asyncio_loop
    plain = loop.getaddrinfo

    async def getaddrinfo(host, *args, **kwargs):
        asked.append(host)
        return await plain(host, *args, **kwargs)

    loop.getaddrinfo = getaddrinfo
    server = HTTPServer(web.Application([(r"/hub/api", ClosingHub)]))
    [sock] = bind_sockets(0, "127.0.0.1")
    port = sock.getsockname()[1]

    async def serve_and_ask() -> None:
        server.add_sockets([sock])
        for _ in range(2):
            (await fetch(f"http://localhost:{port}/hub/api")).release()
        await JupyterHubHTTPClient.instance().close()

    try:
        if afresh:
            assert look_hub_up_afresh(io_loop, logging.getLogger("test")) is True
        io_loop.run_sync(serve_and_ask)
    finally:
        server.stop()
        JupyterHubHTTPClient.clear_instance()
        io_loop.close(all_fds=True)
    return [h for h in asked if h == "localhost"]


def test_the_servers_hub_client_looks_the_hubs_name_up_for_each_new_connection():
    """Guards docs/deploy.md, "How a proxy restart behaves": "makes JupyterHub's own client in the server
    look the name up for each new connection"."""
    # JupyterHub's own client resolves through c-ares (aiodns), which keeps each answer for
    # its DNS lifetime, and never asks the loop: what left servers on a dead proxy's address.
    assert hub_lookups(afresh=False) == []
    assert hub_lookups(afresh=True) == ["localhost", "localhost"]


def test_a_hub_client_made_before_the_extension_is_left_as_it_is_with_a_warning(caplog, monkeypatch):
    """Something in the server asked the hub first: its client keeps DNS answers, and
    replacing it under whoever holds it would break them. Without JupyterHub's client
    (JupyterHub before 6 asks with tornado, which keeps no answers) there is nothing to do."""
    JupyterHubHTTPClient.clear_instance()
    io_loop = IOLoop()
    log = logging.getLogger("test")

    async def made() -> object:
        return JupyterHubHTTPClient.instance()

    try:
        first = io_loop.run_sync(made)
        with caplog.at_level(logging.INFO, logger="test"):
            assert look_hub_up_afresh(io_loop, log) is False
        assert io_loop.run_sync(made) is first
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            ("WARNING", "gpuspawner-lab: JupyterHub's HTTP client was made first; it keeps DNS answers")
        ]
        io_loop.run_sync(first.close)
    finally:
        JupyterHubHTTPClient.clear_instance()
    monkeypatch.setitem(sys.modules, "jupyterhub.httpclient", None)  # an import of it fails
    caplog.clear()
    assert look_hub_up_afresh(io_loop, log) is False and caplog.records == []
    io_loop.close(all_fds=True)
