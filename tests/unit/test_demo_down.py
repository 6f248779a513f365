"""`make demo-down` in another terminal ends a running `make demo` with status 0
(not make's "Error 1"); a hub that dies by itself is still an error. The hub and
swarm here are stand-ins: only what devtools.demo._serve reads."""

from __future__ import annotations

import contextlib
import signal
from types import SimpleNamespace

import pytest
import requests

from devtools import demo


def test_demo_down_ends_a_running_demo_quietly_and_a_crash_is_still_an_error(tmp_path, capsys):
    hub = SimpleNamespace(
        url="http://127.0.0.1:8000",
        log_path=tmp_path / "jupyterhub.log",
        state_dir=tmp_path,
        proc=SimpleNamespace(poll=lambda: 0),  # the hub has exited
        stop=lambda: None,
        log_tail=lambda lines=20: "the hub's last lines",
    )
    cluster = SimpleNamespace(manager_url="unix:///run/gpuspawner-swarm/manager.sock")
    before = signal.getsignal(signal.SIGTERM)
    try:
        (tmp_path / demo.DOWN_MARK).touch()  # as _down leaves it
        assert demo._serve(hub, cluster, "standin", "static") == 0
        assert "stopped by `make demo-down`" in capsys.readouterr().out
        (tmp_path / demo.DOWN_MARK).unlink()
        assert demo._serve(hub, cluster, "standin", "static") == 1
        assert "JupyterHub exited" in capsys.readouterr().err
    finally:
        signal.signal(signal.SIGTERM, before)


def test_demo_down_while_the_agents_start_ends_the_demo_quietly_too(tmp_path, capsys, monkeypatch):
    """The hub stops answering while step 4 waits for the agents' first reports."""

    def gone(*_a, **_kw):
        raise requests.ConnectionError("connection refused")

    hub = SimpleNamespace(state_dir=tmp_path, port=8000, api=gone, stop=lambda: None)
    cluster = SimpleNamespace(manager_addr="127.0.0.1", image="busybox")
    monkeypatch.setattr(demo, "_agent_files", lambda state_dir: (tmp_path, tmp_path))
    monkeypatch.setattr(demo, "_issue_tokens", lambda *a: None)
    monkeypatch.setattr(demo.agent_stack, "local_stack", lambda *a, **kw: {})
    monkeypatch.setattr(demo.agent_stack, "deployed", lambda *a: contextlib.nullcontext())
    with contextlib.ExitStack() as stack, pytest.raises(demo.HubError, match="stopped answering"):
        demo._agents(stack, hub, cluster, tmp_path)
    (tmp_path / demo.DOWN_MARK).touch()
    assert demo._stopped_by_down(hub) and "stopped by `make demo-down`" in capsys.readouterr().out
