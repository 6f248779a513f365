"""`make demo-down` in another terminal ends a running `make demo` with status 0
(not make's "Error 1"); a hub that dies by itself is still an error. The hub and
swarm here are stand-ins: only what devtools.demo._serve reads."""

from __future__ import annotations

import signal
from types import SimpleNamespace

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
