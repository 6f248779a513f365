"""What the hub's log says about ordinary answers, in a real JupyterHub served over HTTP on
loopback (test_agent_token_api.py's hub; its swarm is the in-process fake, where the one
A100's node is drained, so none is free): a request for it by the REST API and by the form,
and an admin's taking a waiting request out of the line with ``gpuspawner line --remove``.
A site that alerts on ERROR must not be paged for any of them.

Guards docs/reliability.md: "An ordinary answer (none free, not allowed, over budget,
options not valid, a wait that timed out, an admin's removal from the line) is one INFO
line of gpuspawner's in the hub's log, and its HTTP status is a 4xx, which JupyterHub's
request log writes at WARNING: nothing about it is logged at ERROR", and "A request refused
for now (none free, the line goes first, a wait that timed out) is answered 409"; and
docs/line.md: "Taking a request out of the line is one INFO line in the hub's log, naming
the admin"."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest
import requests
from tornado.httpclient import AsyncHTTPClient

import gpuspawner
from gpuspawner.cli import main
from tests.unit.test_agent_token_api import ADMIN, hub, hub_config  # noqa: F401 - hub: the fixture

A100 = "NVIDIA A100 80GB PCIe"
NONE_FREE = f"No {A100} is free right now (0 of 1 free)"
PACKAGE = os.path.dirname(os.path.abspath(gpuspawner.__file__))


def drained_a100(tmp_path, slow_spawn_timeout: float = 10):
    """The hub's config: one A100 on gpu-a, drained; users log in with any password.
    ``slow_spawn_timeout``: how long a spawn's request waits before it answers 202."""
    c = hub_config(
        tmp_path,
        gpu_inventory_source=["static"],
        gpu_inventory={"gpu-a": [{"uuid": "GPU-a0", "model": A100, "memory_mib": 81920}]},
    )
    c.JupyterHub.authenticator_class = "dummy"
    c.Authenticator.allow_all = True
    c.JupyterHub.tornado_settings.update({"slow_spawn_timeout": slow_spawn_timeout})
    c.JupyterHub.spawner_class._client.set_node("gpu-a", availability="drain")
    return c


@pytest.fixture
def hub_log(caplog):
    """``hub_log()``: from now on, the records of the hub's log at INFO and above: its own
    logger's (which does not propagate) and the root logger's (gpuspawner's modules', and the
    spawners', whose logger is traitlets' where the hub is not the process's Application
    instance). Called once the hub runs: its logging setup, as it starts, replaces the root
    logger's handlers."""
    loggers = (logging.getLogger("JupyterHub"), logging.getLogger())

    def capture():
        for log in loggers:
            log.addHandler(caplog.handler)
            caplog.set_level(logging.INFO, logger=log.name)
        caplog.clear()
        return caplog

    yield capture
    for log in loggers:
        log.removeHandler(caplog.handler)


def ours(records) -> list[logging.LogRecord]:
    """The records gpuspawner's code logged (JupyterHub's and tornado's are logged from theirs)."""
    return [r for r in records if r.pathname.startswith(PACKAGE)]


def errors(records) -> list[str]:
    return [f"{r.pathname}: {r.getMessage()}" for r in records if r.levelno >= logging.ERROR]


async def logged_in(url: str, user: str) -> requests.Session:
    """A browser's session of ``user`` (the dummy authenticator creates the user)."""
    s = requests.Session()

    def login():
        s.get(url + "/hub/login", timeout=10)
        data = {"username": user, "password": "x", "_xsrf": s.cookies.get("_xsrf")}
        s.post(url + "/hub/login", data=data, timeout=10).raise_for_status()

    await asyncio.get_running_loop().run_in_executor(None, login)
    return s


async def rest_spawn(url: str, user: str, options: dict) -> tuple[int, str]:
    r = await AsyncHTTPClient().fetch(
        f"{url}/hub/api/users/{user}/server",
        method="POST",
        headers={"Authorization": f"token {ADMIN}"},  # the admin's service: admin:servers
        body=json.dumps(options),
        raise_error=False,
    )
    return r.code, r.body.decode()


async def form_spawn(s: requests.Session, url: str, user: str, form: dict) -> tuple[int, str]:
    data = {**form, "_xsrf": s.cookies.get("_xsrf")}
    r = await asyncio.get_running_loop().run_in_executor(
        None, lambda: s.post(f"{url}/hub/spawn/{user}", data=data, timeout=60)
    )
    return r.status_code, r.text


@pytest.mark.parametrize("via", ["rest", "form"])
async def test_none_free_is_one_info_line_of_gpuspawners_a_409_and_no_error(hub, hub_log, tmp_path, via):  # noqa: F811
    api = await hub(drained_a100(tmp_path))
    url = api.base.split("/hub/")[0]
    session = await logged_in(url, "alice")
    log = hub_log()
    if via == "rest":
        code, body = await rest_spawn(url, "alice", {"gpu_model": A100})
        assert code == 409 and json.loads(body)["message"].startswith(NONE_FREE), body
    else:
        code, body = await form_spawn(session, url, "alice", {"gpu_model": A100, "gpu_count": "1"})
        # The form again, with what the user was told and the way to wait for it.
        assert code == 409 and NONE_FREE in body and "Wait in line for it" in body
    records = log.records
    assert errors(records) == []
    about = [r for r in ours(records) if NONE_FREE in r.getMessage()]
    assert len(about) == 1 and about[0].levelno == logging.INFO, [r.getMessage() for r in ours(records)]
    assert about[0].getMessage().startswith("gpuspawner: alice refused (gpu_unavailable, 409): ")
    path = "/hub/api/users/alice/server" if via == "rest" else "/hub/spawn/alice"
    (request,) = [r for r in records if r.pathname.endswith(os.path.join("jupyterhub", "log.py"))]
    assert request.getMessage().startswith(f"409 POST {path} (") and request.levelno == logging.WARNING


async def test_an_admins_removal_from_the_line_is_one_info_line_and_no_error(
    hub,  # noqa: F811
    hub_log,
    tmp_path,
    capsys,
    monkeypatch,
):
    api = await hub(drained_a100(tmp_path, slow_spawn_timeout=0.5))
    url = api.base.split("/hub/")[0]
    await logged_in(url, "bob")
    code, body = await rest_spawn(url, "bob", {"gpu_model": A100, "gpu_wait": True})
    assert code == 202, body
    assert (await api("GET", "queue", ADMIN))[1][A100][0]["user"] == "bob"
    log = hub_log()
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", ADMIN)
    argv = ["--hub-url", url, "line", "--remove", "bob"]
    assert await asyncio.get_running_loop().run_in_executor(None, main, argv) == 0
    assert capsys.readouterr().out.strip() == f"Took bob out of the line for {A100}."
    for _ in range(200):  # bob's spawn ends: his server is gone
        r = await AsyncHTTPClient().fetch(f"{url}/hub/api/users/bob", headers={"Authorization": f"token {ADMIN}"})
        if not json.loads(r.body)["servers"]:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("bob's spawn did not end")
    records = log.records
    assert errors(records) == []
    about = [r for r in ours(records) if "bob" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in about] == [
        (logging.INFO, f"gpuspawner: admin took jupyter-bob out of the line for {A100}")
    ]
