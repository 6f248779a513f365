"""``gpuspawner reserve`` (gpuspawner/cli.py) against a small fake of the hub: an HTTP
server on 127.0.0.1, in a thread, that records each request (method, path, token,
JSON body) and answers what the test queued. It stands in for JupyterHub's
``/hub/api/gpuspawner/reservations`` only in its HTTP shape (a JSON body, and
``{"status", "message"}`` on errors, as JupyterHub's APIHandler answers); the real
endpoint's answers are tested in test_api_reservations.py."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuspawner.cli import main

TOKEN = "admin-token-0123456789abcdef"
A100 = "NVIDIA A100 80GB PCIe"
MADE = {
    "id": 3,
    "name": "CS101",
    "group": "cs101",
    "model": A100,
    "count": 10,
    "start": "2026-12-08T13:00:00Z",
    "end": "2026-12-08T15:00:00Z",
    "weekly": True,
    "timezone": "Europe/Berlin",
    "created_by": "admin",
    "created_at": "2026-12-01T10:00:00Z",
}


class FakeHub:
    """Each request as (method, path, Authorization, Content-Type, JSON body); the
    answers are (status, JSON) in order."""

    def __init__(self):
        self.requests: list[tuple[str, str, str | None, str | None, object]] = []
        self.answers: list[tuple[int, dict]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                fake.requests.append(
                    (
                        self.command,
                        self.path,
                        self.headers.get("Authorization"),
                        self.headers.get("Content-Type"),
                        json.loads(raw) if raw else None,
                    )
                )
                status, answer = fake.answers.pop(0)
                body = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def run(self, *argv: str) -> int:
        return main(["--hub-url", self.url, "reserve", *argv])


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", TOKEN)
    fake = FakeHub()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()
    fake.thread.join(5)


def test_reserve_posts_the_reservation_and_prints_its_id(hub, capsys):
    hub.answers.append((201, MADE))
    argv = [
        "cs101",
        A100,
        "10",
        "--start",
        "2026-12-08T14:00",
        "--end",
        "2026-12-08T16:00",
        "--weekly",
        "--timezone",
        "Europe/Berlin",
        "--name",
        "CS101",
        "--lend",
    ]
    assert hub.run(*argv) == 0
    assert hub.requests == [
        (
            "POST",
            "/hub/api/gpuspawner/reservations",
            f"token {TOKEN}",
            "application/json",
            {
                "group": "cs101",
                "model": A100,
                "count": 10,
                "start": "2026-12-08T14:00",
                "end": "2026-12-08T16:00",
                "weekly": True,
                "timezone": "Europe/Berlin",
                "name": "CS101",
                "lend": True,
                "shares": False,
            },
        )
    ]
    out, err = capsys.readouterr()
    assert out == f"Reservation 3: CS101, 10 {A100} for cs101.\n" and err == ""


def test_reserve_sends_the_defaults_for_what_is_not_given(hub, capsys):
    hub.answers.append((201, MADE | {"weekly": False, "timezone": "UTC", "name": "cs101", "count": 1}))
    assert hub.run("cs101", A100, "1", "--start", "2026-12-08T14:00Z", "--end", "2026-12-08T16:00Z") == 0
    (request,) = hub.requests
    assert request[4] == {
        "group": "cs101",
        "model": A100,
        "count": 1,
        "start": "2026-12-08T14:00Z",
        "end": "2026-12-08T16:00Z",
        "weekly": False,
        "timezone": "UTC",
        "name": "",
        "lend": False,
        "shares": False,
    }
    assert capsys.readouterr().out == f"Reservation 3: cs101, 1 {A100} for cs101.\n"


def test_reserve_until_sends_the_weekly_reservations_end(hub, capsys):
    hub.answers.append((201, MADE))
    argv = ["cs101", A100, "2", "--weekly", "--start", "2026-12-08T14:00", "--end", "2026-12-08T16:00"]
    assert hub.run(*argv, "--until", "2027-02-09") == 0
    assert hub.requests[0][4]["until"] == "2027-02-09"


def test_reserve_shares_sends_a_share_total(hub, capsys):
    hub.answers.append((201, MADE | {"count": 2.5, "shares": True, "name": "Lab"}))
    argv = ["lab", A100, "2.5", "--shares", "--start", "2026-12-08T14:00Z", "--end", "2026-12-08T16:00Z"]
    assert hub.run(*argv) == 0
    (request,) = hub.requests
    assert (request[4]["count"], request[4]["shares"]) == (2.5, True)
    assert capsys.readouterr().out == f"Reservation 3: Lab, 2.5 {A100} in shares for cs101.\n"


def test_reserve_list_prints_a_table_and_says_when_there_is_none(hub, capsys):
    open_one = MADE | {
        "window": {"start": "2026-12-08T13:00:00Z", "end": "2026-12-08T15:00:00Z"},
        "open": True,
        "members_hold": 2.5,
        "unused": 8,
    }
    over = MADE | {
        "id": 4,
        "name": "Thesis",
        "group": "thesis",
        "count": 4,
        "weekly": False,
        "lend": True,
        "timezone": "UTC",
        "window": None,
        "open": False,
        "members_hold": 0,
        "unused": 4,
    }
    hub.answers += [(200, {"reservations": [open_one, over]}), (200, {"reservations": []})]
    assert hub.run("--list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    header = lines[0]
    columns = ("ID", "NAME", "GROUP", "MODEL", "COUNT", "WEEKLY", "LENDS", "WINDOW (UTC)", "OPEN", "MEMBERS HOLD")
    assert re.split(r" {2,}", header) == list(columns)
    cells = {
        1: (
            "3",
            "CS101",
            "cs101",
            A100,
            "10",
            "yes (Europe/Berlin)",
            "no",
            "2026-12-08T13:00:00Z – 2026-12-08T15:00:00Z",
            "yes",
            "2.5",
        ),
        2: ("4", "Thesis", "thesis", A100, "4", "no", "yes", "over", "no", "0"),
    }
    for row, expected in cells.items():  # each cell under its column
        for column, cell in zip(columns, expected):
            at = header.index(column)
            assert lines[row][at:].startswith(cell + " ") or lines[row][at:] == cell, (row, column)
            assert at == 0 or lines[row][at - 2 : at] == "  "

    assert hub.run("--list") == 0
    assert capsys.readouterr().out == "No reservations.\n"
    assert [(m, p, body) for m, p, _, _, body in hub.requests] == [
        ("GET", "/hub/api/gpuspawner/reservations", None),
        ("GET", "/hub/api/gpuspawner/reservations", None),
    ]


def test_reserve_list_json_prints_the_hubs_answer(hub, capsys):
    answer = {"reservations": [MADE | {"window": None, "open": False, "members_hold": 0, "unused": 10}]}
    hub.answers.append((200, answer))
    assert hub.run("--list", "--json") == 0
    assert json.loads(capsys.readouterr().out) == answer


def test_reserve_remove_sends_delete_with_the_id_and_says_it_was_removed(hub, capsys):
    hub.answers.append((200, MADE))
    assert hub.run("--remove", "3") == 0
    assert [(m, p, body) for m, p, _, _, body in hub.requests] == [
        ("DELETE", "/hub/api/gpuspawner/reservations/3", None)
    ]
    assert capsys.readouterr().out == f"Removed reservation 3: CS101, 10 {A100} for cs101.\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--list", "cs101"], "reserve --list and --remove take nothing else"),
        (["--remove", "3", "--weekly"], "reserve --list and --remove take nothing else"),
        (["--remove", "3", "--name", "x"], "reserve --list and --remove take nothing else"),
        (["--list", "--remove", "3"], "not allowed with argument"),
        (["--remove", "abc"], "argument --remove: invalid int value: 'abc'"),
        (["cs101", A100], "reserve needs GROUP MODEL COUNT --start TIME --end TIME (or --list, --remove ID)"),
        (["cs101", A100, "2", "--start", "2026-12-08T14:00"], "reserve needs GROUP MODEL COUNT --start TIME"),
        ([], "reserve needs GROUP MODEL COUNT"),
        (["cs101", A100, "two"], "argument count: not a number: 'two'"),
    ],
)
def test_reserve_argument_errors_are_usage_errors_and_ask_nothing(hub, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        hub.run(*argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage: gpuspawner") and message in err, err
    assert hub.requests == []


def test_a_refusal_of_the_hub_prints_its_message_and_exits_1(hub, capsys):
    message = f"the cluster has 2 {A100}, fewer than the 3 asked for"
    hub.answers.append((400, {"status": 400, "message": message}))
    assert hub.run("cs101", A100, "3", "--start", "2026-12-08T14:00", "--end", "2026-12-08T16:00") == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"gpuspawner: {hub.url}/hub/api/gpuspawner/reservations: HTTP 400: {message}\n"
    assert [r[0] for r in hub.requests] == ["POST"]


def test_a_missing_reservation_and_a_token_without_the_scope_say_so(hub, capsys):
    hub.answers += [
        (404, {"status": 404, "message": "no reservation 9"}),
        (403, {"status": 403, "message": "Action is not authorized with current scopes"}),
    ]
    assert hub.run("--remove", "9") == 1
    assert capsys.readouterr().err.endswith("/reservations/9: HTTP 404: no reservation 9\n")
    assert hub.run("--list") == 1
    assert capsys.readouterr().err.endswith(
        "HTTP 403: Action is not authorized with current scopes (does the token have the admin:servers scope?)\n"
    )


def test_the_reserve_commands_the_docs_show_parse_as_they_are():
    import shlex
    from pathlib import Path

    from gpuspawner.cli import _reserve_request, build_parser

    root = Path(__file__).resolve().parents[2]
    shown = [
        line
        for doc in (root / "docs" / "reservations.md", root / "docs" / "admin.md")
        for line in doc.read_text().splitlines()
        if line.startswith("gpuspawner reserve")  # the lines of their code blocks
    ]
    assert len(shown) >= 4
    parser = build_parser()
    for line in shown:
        args = parser.parse_args(shlex.split(line)[1:])
        method, _, body = _reserve_request(parser, args)
        assert method in ("GET", "POST", "DELETE") and (body is None or body["group"] == "cs101"), line
