"""Talk to a user's real Jupyter server through the hub's proxy, as a notebook or a
terminal would: a kernel over its websocket (Jupyter's message protocol), and a terminal
(terminado's). Authenticated with the hub's test token (scope access:servers)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid

import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from devtools.hub import Hub


def _ws_request(hub: Hub, path: str) -> HTTPRequest:
    url = hub.url.replace("http://", "ws://", 1) + path
    return HTTPRequest(url, headers={"Authorization": f"token {hub.token}"}, request_timeout=30)


def _message(msg_type: str, content: dict, session: str) -> dict:
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": msg_type,
        "session": session,
        "username": "test",
        "version": "5.3",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return {
        "header": header,
        "parent_header": {},
        "metadata": {},
        "content": content,
        "channel": "shell",
        "buffers": [],
    }


async def _run_in_kernel(hub: Hub, user: str, code: str, timeout: float) -> str:
    kernel = await asyncio.to_thread(
        lambda: _server_api(hub, "POST", f"/user/{user}/api/kernels", json={"name": "python3"})
    )
    ws = await websocket_connect(_ws_request(hub, f"/user/{user}/api/kernels/{kernel['id']}/channels"))
    try:
        request = _message(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": False,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
            session=uuid.uuid4().hex,
        )
        await ws.write_message(json.dumps(request))
        out = []
        async with asyncio.timeout(timeout):
            while True:
                raw = await ws.read_message()
                if raw is None:
                    raise AssertionError(f"kernel websocket closed; output so far: {out}")
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != request["header"]["msg_id"]:
                    continue
                kind = msg["header"]["msg_type"]
                if kind == "stream":
                    out.append(msg["content"]["text"])
                elif kind == "error":
                    raise AssertionError("kernel error: " + "\n".join(msg["content"]["traceback"]))
                elif kind == "status" and msg["content"]["execution_state"] == "idle":
                    return "".join(out)
    finally:
        ws.close()
        await asyncio.to_thread(lambda: _server_api(hub, "DELETE", f"/user/{user}/api/kernels/{kernel['id']}"))


async def _run_in_terminal(hub: Hub, user: str, command: str, expect: str, timeout: float) -> str:
    term = await asyncio.to_thread(lambda: _server_api(hub, "POST", f"/user/{user}/api/terminals"))
    ws = await websocket_connect(_ws_request(hub, f"/user/{user}/terminals/websocket/{term['name']}"))
    try:
        await ws.write_message(json.dumps(["stdin", command + "\r"]))
        screen = ""
        async with asyncio.timeout(timeout):
            while not re.search(expect, screen):
                raw = await ws.read_message()
                if raw is None:
                    raise AssertionError(f"terminal websocket closed; screen so far: {screen!r}")
                kind, *payload = json.loads(raw)
                if kind == "stdout":
                    screen += payload[0]
        return screen
    finally:
        ws.close()
        await asyncio.to_thread(lambda: _server_api(hub, "DELETE", f"/user/{user}/api/terminals/{term['name']}"))


def _server_api(hub: Hub, method: str, path: str, **kwargs):
    r = requests.request(method, hub.url + path, headers={"Authorization": f"token {hub.token}"}, timeout=60, **kwargs)
    assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text[:500]}"
    return r.json() if r.content else None


def run_in_kernel(hub: Hub, user: str, code: str, timeout: float = 60) -> str:
    """Start a python3 kernel in the user's server, run ``code``, return what it printed."""
    return asyncio.run(_run_in_kernel(hub, user, code, timeout))


def run_in_terminal(hub: Hub, user: str, command: str, expect: str, timeout: float = 60) -> str:
    """Open a terminal in the user's server, type ``command``, return the screen once it
    matches the regular expression ``expect``."""
    return asyncio.run(_run_in_terminal(hub, user, command, expect, timeout))
