"""A real JupyterHub process (with its configurable-http-proxy) for tests and the demo.

It runs examples/local/jupyterhub_config.py, optionally followed by extra
config lines, in a state folder of its own, and talks to the hub's REST API
with an admin service token.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
LOCAL_CONFIG = REPO / "examples" / "local" / "jupyterhub_config.py"


class HubError(RuntimeError):
    pass


def free_port_block(start: int = 18000) -> int:
    """A port p with p (proxy), p+1 (proxy API) and p+81 (hub API) free on loopback."""
    for port in range(start, start + 4000, 100):
        try:
            for p in (port, port + 1, port + 81):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise HubError("no free ports for a hub")


class Hub:
    def __init__(self, state_dir: Path, port: int = 8000, extra_config: str = "", env: dict | None = None):
        self.state_dir = Path(state_dir)
        self.port = port
        self.token = secrets.token_hex(16)
        self.extra_config = extra_config
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = self.state_dir / "jupyterhub.log"
        self.pid_file = self.state_dir / "jupyterhub.pid"

    def write_config(self) -> Path:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / "jupyterhub_config.py"
        path.write_text(f"load_subconfig({str(LOCAL_CONFIG)!r})\n{self.extra_config}\n")
        return path

    def start(self, timeout: float = 60) -> Hub:
        config = self.write_config()
        env = {
            **os.environ,
            "GPUSPAWNER_STATE_DIR": str(self.state_dir),
            "GPUSPAWNER_HUB_PORT": str(self.port),
            "GPUSPAWNER_HUB_API_PORT": str(self.port + 81),
            "GPUSPAWNER_API_TOKEN": self.token,
            **self.env,
        }
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)],
            cwd=self.state_dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the proxy goes with the hub's process group
        )
        self.pid_file.write_text(f"{self.proc.pid}\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HubError(f"JupyterHub exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/hub/api/", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise HubError(f"JupyterHub did not answer within {timeout} s:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Stop the hub and its proxy (the whole process group)."""
        if self.proc is None or self.proc.poll() is not None:
            self._kill_group(signal.SIGKILL)
            return
        self._kill_group(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill_group(signal.SIGKILL)
            self.proc.wait(10)
        self._stop_proxy()
        self.pid_file.unlink(missing_ok=True)

    def leftover_pid(self) -> int | None:
        """The pid of a hub that an earlier run started in this state folder and that
        still runs (its runner was killed, or runs elsewhere), else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"jupyterhub" in cmdline else None

    def stop_leftover(self, timeout: float = 30) -> bool:
        """Stop such a hub (its process group) and its proxy; True if a hub ran."""
        pid = self.leftover_pid()
        if pid is not None:
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            if Path(f"/proc/{pid}").exists():
                os.killpg(pid, signal.SIGKILL)
        self._stop_proxy()
        self.pid_file.unlink(missing_ok=True)
        return pid is not None

    def _stop_proxy(self) -> None:
        """The hub leaves its proxy running (cleanup_proxy = False, so routes
        survive a hub restart); stop it from its pid file."""
        pid_file = self.state_dir / "jupyterhub-proxy.pid"
        try:
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            pass
        pid_file.unlink(missing_ok=True)

    def _kill_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- REST API ------------------------------------------------------------

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"Authorization": f"token {self.token}", **kwargs.pop("headers", {})}
        return requests.request(method, f"{self.url}/hub/api{path}", headers=headers, timeout=60, **kwargs)

    def ensure_user(self, name: str) -> None:
        r = self.api("POST", f"/users/{name}")
        if r.status_code not in (201, 409):
            raise HubError(f"creating user {name}: {r.status_code} {r.text}")

    def spawn(self, user: str, options: dict | None = None, server: str = "") -> requests.Response:
        self.ensure_user(user)
        path = f"/users/{user}/server" + (f"s/{server}" if server else "")
        return self.api("POST", path, json=options or {})

    def server_model(self, user: str, server: str = "") -> dict | None:
        r = self.api("GET", f"/users/{user}")
        r.raise_for_status()
        return r.json().get("servers", {}).get(server)

    def wait_ready(self, user: str, server: str = "", timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        model = None
        while time.monotonic() < deadline:
            model = self.server_model(user, server)
            if model and model.get("ready"):
                return model
            if model is None:
                raise HubError(f"{user}'s server is gone (spawn failed?):\n{self.log_tail(20)}")
            time.sleep(0.2)
        raise HubError(f"{user}'s server not ready in {timeout} s: {model}\n{self.log_tail(20)}")

    def stop_all_servers(self) -> None:
        """Stop every running server, so that one test's failure leaves no GPU
        held for the next."""
        active = []  # read every page first: stopping changes what the pages hold
        while True:
            r = self.api("GET", "/users", params={"state": "active", "offset": len(active), "limit": 100})
            r.raise_for_status()
            page = r.json()
            active += page
            if len(page) < 100:
                break
        for user in active:
            for server in user.get("servers", {}):
                self.stop_server(user["name"], server)

    def progress(self, user: str, timeout: float = 60) -> list[dict]:
        """The spawn's progress events, read from the hub's event stream until
        the spawn is ready or has failed."""
        events = []
        with self.api("GET", f"/users/{user}/server/progress", stream=True) as r:
            r.raise_for_status()
            deadline = time.monotonic() + timeout
            for line in r.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    event = json.loads(line[5:])
                    events.append(event)
                    if event.get("ready") or event.get("failed"):
                        break
                if time.monotonic() > deadline:
                    raise HubError(f"progress of {user}'s spawn did not finish in {timeout} s: {events}")
        return events

    def stop_server(self, user: str, server: str = "", timeout: float = 60) -> None:
        path = f"/users/{user}/server" + (f"s/{server}" if server else "")
        r = self.api("DELETE", path)
        if r.status_code not in (202, 204, 400):  # 400: not running
            raise HubError(f"stopping {user}'s server: {r.status_code} {r.text}")
        deadline = time.monotonic() + timeout
        while self.server_model(user, server) is not None:
            if time.monotonic() > deadline:
                raise HubError(f"{user}'s server did not stop in {timeout} s")
            time.sleep(0.2)
