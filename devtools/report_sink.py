"""A stand-in for the hub's agent-report endpoint, for the agent's tests and benchmark.

A real HTTP server on 127.0.0.1 (or another address of this machine: the test swarm's
bridge, for agents in its nodes) on a free port, in a thread of the calling process; it
does not check what it is sent: the tests do, from what it records.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ReportSink:
    """Records (path, headers, body) of each POST and answers from a script.

    ``answers`` holds what to do with the next requests, in order: an HTTP status with
    a body, or ("slow", seconds) to answer 200 only after that long; when it runs out,
    200 with JSON. ``on_request(n)`` runs as the n-th request (1-based) arrives, while
    the agent waits for the answer. With ``record=False`` only ``count`` is kept (for
    long runs).
    """

    def __init__(self, record: bool = True, host: str = "127.0.0.1"):
        self.host = host
        self.record = record
        self.count = 0
        self.requests: list[tuple[str, dict, bytes]] = []
        self.answers: list = []
        self.on_request = None
        self.arrived = threading.Condition()
        self.port = 0
        self.server = None
        self.start()

    def start(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with hub.arrived:
                    hub.count += 1
                    n = hub.count
                    if hub.record:
                        hub.requests.append((self.path, dict(self.headers), body))
                    answer = hub.answers.pop(0) if hub.answers else (200, b'{"status": "ok"}')
                    hub.arrived.notify_all()
                if hub.on_request:
                    hub.on_request(n)
                if answer[0] == "slow":
                    time.sleep(answer[1])
                    answer = (200, b"{}")
                status, payload = answer
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the agent gave up waiting, as it should

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((self.host, self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        """Down: the port refuses connections until start()."""
        self.server.shutdown()
        self.server.server_close()

    def url(self, base="/"):
        return f"http://{self.host}:{self.port}{base}"

    def wait_for(self, n: int, timeout: float = 20) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: self.count >= n, timeout), f"only {self.count} of {n} reports arrived"
