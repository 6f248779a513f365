"""`make demo-down` in another terminal ends a running `make demo` with status 0
(not make's "Error 1"); a hub that dies by itself is still an error. The hub and
swarm here are stand-ins: only what devtools.demo._serve reads."""

from __future__ import annotations

import contextlib
import json
import re
import runpy
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import requests

from devtools import agent_stack, demo, fakenvml
from devtools import hub as hub_module
from devtools import swarm as swarm_harness


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
    monkeypatch.setattr(demo.agent_stack, "deploy", lambda *a: None)
    monkeypatch.setattr(demo.agent_stack, "remove", lambda *a: None)
    with contextlib.ExitStack() as stack, pytest.raises(demo.HubError, match="stopped answering"):
        demo._agents(stack, hub, cluster, tmp_path)
    (tmp_path / demo.DOWN_MARK).touch()
    assert demo._stopped_by_down(hub) and "stopped by `make demo-down`" in capsys.readouterr().out


# `make demo`, then `make demo-down` in another terminal, each as make runs it
# (`python -m devtools.demo ARGS`, its exit status make's): the swarm, the hub and the agent
# stack's docker calls are stand-ins that behave as the real ones do once demo-down has
# stopped the hub and removed the swarm (the hub does not answer, the docker daemon's
# socket is gone).


def recipe(target: str) -> list[str]:
    """The arguments the Makefile's ``target`` gives ``python -m devtools.demo``."""
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    body = makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
    [line] = re.findall(r"\$\(PYTHON\) -m devtools\.demo (.*)", body)
    return line.split()


def make(target: str, state_dir: Path, gpus: str) -> int:
    """The exit status of ``make target`` (DEMO_SERVER=standin DEMO_GPUS=gpus)."""
    values = {"$(STATE)": str(state_dir), "$(DEMO_SERVER)": "standin", "$(DEMO_GPUS)": gpus}
    with mock.patch.object(sys, "argv", ["devtools.demo", *(values.get(a, a) for a in recipe(target))]):
        try:
            runpy.run_module("devtools.demo", run_name="__main__")
        except SystemExit as exit:
            return 0 if exit.code is None else exit.code if isinstance(exit.code, int) else 1
    return 0


class StandIns:
    """The demo's hub and swarm; ``down_at``: the hub call at which `make demo-down` runs
    ("poll": while the hub serves; "alloc-map": while step 4 waits for the agents)."""

    def __init__(self, tmp_path: Path, down_at: str):
        self.state_dir, self.down_at = tmp_path / "demo-state", down_at
        self.hub_runs = self.swarm_up = False
        self.down_status: int | None = None
        world = self

        class Hub:
            def __init__(self, state_dir, port=8000, extra_config="", env=None):
                self.state_dir, self.port, self.url = Path(state_dir), port, f"http://127.0.0.1:{port}"
                self.log_path = self.state_dir / "jupyterhub.log"
                self.proc = SimpleNamespace(poll=lambda: world.called("poll") or (None if world.hub_runs else 0))

            def leftover_pid(self):
                return 4242 if world.hub_runs else None

            def stop_leftover(self):
                ran, world.hub_runs = world.hub_runs, False
                return ran

            def start(self):
                self.state_dir.mkdir(parents=True, exist_ok=True)
                world.hub_runs = True
                return self

            def stop(self):
                world.hub_runs = False

            def log_tail(self, lines=60):
                return "(the hub's log)"

            def api(self, method, path, **kwargs):
                world.called(path.rsplit("/", 1)[-1])
                if not world.hub_runs:
                    raise requests.ConnectionError("connection refused")
                status = 200
                if path == "/gpuspawner/reservations":  # none yet; a new one is stored as sent
                    status, body = (
                        (201, {**kwargs["json"], "id": 1}) if method == "POST" else (200, {"reservations": []})
                    )
                else:
                    body = {"token": "t0k3n"} if method == "POST" else {"gpu-a": {}, "gpu-b": {}}  # both reported
                return SimpleNamespace(status_code=status, json=lambda: body, text=json.dumps(body))

        self.Hub = Hub
        self.cluster = SimpleNamespace(
            manager_url="unix:///run/gpuspawner-swarm/manager.sock", manager_addr="127.0.0.1", image="busybox"
        )

    def called(self, what: str) -> None:
        if what == self.down_at and self.down_status is None:
            self.down_status = make("demo-down", self.state_dir, "agent")  # in another terminal

    def up(self):
        self.swarm_up = True
        return self.cluster

    def down(self):
        self.swarm_up = False

    def docker(self, swarm, *args, input=None, check=True):
        code = 0 if self.swarm_up else 1  # the CLI's own status: no daemon to ask
        if code and check:
            raise subprocess.CalledProcessError(code, ["docker", *args])
        return subprocess.CompletedProcess(["docker", *args], code, "", "")

    def set_gpu_label(self, swarm, hostname, value):
        if not self.swarm_up:  # the SDK, its daemon's socket gone
            raise requests.ConnectionError("('Connection aborted.', FileNotFoundError(2, 'No such file or directory'))")


@pytest.mark.filterwarnings("ignore:'devtools.demo' found in sys.modules:RuntimeWarning")  # run as make runs it
@pytest.mark.parametrize("down_at", ["poll", "alloc-map"], ids=["while-serving", "while-the-agents-start"])
def test_make_demo_then_make_demo_down_both_end_with_status_0(tmp_path, monkeypatch, capsys, down_at):
    world = StandIns(tmp_path, down_at)
    monkeypatch.setattr(hub_module, "Hub", world.Hub)
    monkeypatch.setattr(swarm_harness, "up", world.up)
    monkeypatch.setattr(swarm_harness, "down", world.down)
    monkeypatch.setattr(fakenvml, "build", lambda dest: Path(dest) / "libnvidia-ml.so.1")
    monkeypatch.setattr(agent_stack, "docker", world.docker)
    monkeypatch.setattr(agent_stack, "set_gpu_label", world.set_gpu_label)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    before = signal.getsignal(signal.SIGTERM)
    try:
        assert make("demo", world.state_dir, "agent") == 0
    finally:
        signal.signal(signal.SIGTERM, before)
    assert world.down_status == 0 and not world.swarm_up and not world.hub_runs
    out, err = capsys.readouterr()
    assert "stopped by `make demo-down`" in out and "Traceback" not in err and err == ""
    if down_at == "poll":  # the hub served: the banner says what to try, the reservation with its time
        assert "Log in as alice, ask for a 0.2 share of the" in out
        assert re.search(r"The reservation Lab opens at \d\d:\d\d UTC \(until \d\d:\d\d\): it keeps 1 ", out), out


def test_the_demos_reservation_is_made_afresh_at_each_start(capsys):
    """A second `make demo` reuses the hub's ledger: the reservation the first one made is
    removed, and a new one opens OPENS_IN (to the next minute) after the start, for LASTS."""
    calls = []

    def api(method, path, **kwargs):
        calls.append((method, path, kwargs.get("json")))
        listed = {
            "reservations": [{"id": 7, "name": "Lab", "group": "lab"}, {"id": 8, "name": "CS101", "group": "lab"}]
        }
        status, body = (201, {**kwargs["json"], "id": 9}) if method == "POST" else (200, listed)
        return SimpleNamespace(status_code=status, json=lambda: body, text=json.dumps(body))

    now = datetime(2026, 12, 8, 14, 0, 30, tzinfo=timezone.utc)
    made = demo._reservation(SimpleNamespace(api=api), now)
    assert [c[:2] for c in calls] == [
        ("GET", "/gpuspawner/reservations"),
        ("DELETE", "/gpuspawner/reservations/7"),  # the admin's own CS101 stays
        ("POST", "/gpuspawner/reservations"),
    ]
    assert made["start"] == "2026-12-08T14:06:00+00:00" and made["end"] == "2026-12-08T16:06:00+00:00"
    assert (made["group"], made["model"], made["count"]) == ("lab", demo.RESERVED, 1)

    def refuses(method, path, **kwargs):
        return SimpleNamespace(
            status_code=400 if method == "POST" else 200, json=lambda: {"reservations": []}, text="no"
        )

    assert demo._reservation(SimpleNamespace(api=refuses), now) is None
    assert "no reservation: the hub answered 400 no" in capsys.readouterr().out
