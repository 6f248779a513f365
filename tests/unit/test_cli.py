"""The admin CLI without a hub: its table, and one-line errors (pure, plus a closed loopback port)."""

from __future__ import annotations

import socket

import pytest

from gpuspawner.cli import format_agent_tokens, format_alloc_map, main

MAP = {
    "gpu-b": {
        "GPU-b0": {
            "model": "A100",
            "index": 0,
            "allocated": 0.8,
            "health": "ok",
            "problems": [],
            "holders": [{"user": "ann", "server": "", "share": 0.2}, {"user": "bob", "server": "big", "share": 0.6}],
        },
        "GPU-b1": {
            "model": "A100",
            "index": 1,
            "allocated": 0,
            "health": "unhealthy",
            "problems": ["2 uncorrected ECC errors"],
            "holders": [],
        },
    }
}


def test_the_table_has_a_line_per_device_with_holders_and_health():
    lines = format_alloc_map(MAP).splitlines()
    assert lines[0].split() == ["HOST", "#", "DEVICE", "MODEL", "ALLOCATED", "HEALTH", "HOLDERS"]
    assert lines[1].split()[:6] == ["gpu-b", "0", "GPU-b0", "A100", "0.80", "ok"]
    assert lines[1].endswith("ann (0.20), bob/big (0.60)")
    assert "unhealthy: 2 uncorrected ECC errors" in lines[2] and lines[2].endswith("-")
    assert format_alloc_map({}) == "No GPUs are known to the hub."


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_hub_is_one_line_and_status_1(capsys, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "x")
    assert main(["--hub-url", f"http://127.0.0.1:{closed_port()}", "alloc-map"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpuspawner: cannot reach the hub at http://127.0.0.1:") and err.count("\n") == 1


def test_no_token_says_how_to_give_one(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    assert main(["alloc-map"]) == 1
    assert "pass --token-file FILE or set JUPYTERHUB_API_TOKEN" in capsys.readouterr().err
    assert main(["--token-file", str(tmp_path / "missing"), "alloc-map"]) == 1
    assert "cannot read the token file" in capsys.readouterr().err


def test_agent_token_needs_a_host_or_list_and_not_both(capsys, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "x")
    for argv, message in (
        (["agent-token"], "agent-token needs a HOST (or --list)"),
        (["agent-token", "--revoke"], "agent-token needs a HOST (or --list)"),
        (["agent-token", "--list", "gpu-a"], "agent-token --list takes no HOST"),
        (["agent-token", "--list", "--revoke", "gpu-a"], "not allowed with argument"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_agent_token_prints_the_token_alone_on_stdout():
    answer = {"host": "gpu-a", "token": "gpuspawner-node-abc", "rotated": False, "node": True}
    assert format_agent_tokens(answer) == "gpuspawner-node-abc"
    assert format_agent_tokens({"hosts": []}) == "No node has an agent token."
    listed = format_agent_tokens({"hosts": [{"host": "gpu-a", "issued_at": "2026-12-01T18:00:00Z"}]})
    assert listed == "gpu-a  issued 2026-12-01T18:00:00Z"


def test_idle_lists_who_is_idle_now_longest_first_and_the_stray_processes():
    from gpuspawner.cli import format_idle

    result = {
        "idle": [
            {
                "user": "ann",
                "server": "",
                "host": "gpu-b",
                "idle_seconds": 7260,
                "warned": True,
                "last_gpu_activity": "2026-12-01T20:00:00Z",
                "devices": ["GPU-b0"],
            },
            {
                "user": "bob",
                "server": "big",
                "host": "gpu-b",
                "idle_seconds": 75,
                "warned": False,
                "last_gpu_activity": None,
                "devices": ["GPU-b1"],
            },
        ],
        "unattributed": {"gpu-b": [{"uuid": "GPU-b0", "pid": 4242, "used_mib": 300, "service": None}]},
    }
    lines = format_idle(result).splitlines()
    assert lines[0].split() == ["USER", "SERVER", "HOST", "IDLE", "FOR", "LAST", "GPU", "ACTIVITY", "WARNED"]
    assert lines[1].split() == ["ann", "-", "gpu-b", "2", "h", "01", "min", "2026-12-01T20:00:00Z", "yes"]
    assert lines[2].split() == ["bob", "big", "gpu-b", "1", "min", "15", "s", "never", "seen", "no"]
    assert lines[3] == "unattributed: gpu-b GPU-b0 pid 4242 (300 MiB): no container traced"
    assert format_idle({"idle": [], "unattributed": {}}) == "Nobody holding GPUs is idle now."


def test_line_lists_each_models_waiters_in_order_and_remove_names_the_request(capsys):
    from gpuspawner.cli import _request, build_parser, format_line

    since = "2026-12-03T09:00:00Z"
    table = format_line(
        {
            "A100": [
                {"user": "ann", "server": "", "position": 1, "since": since, "request": {}},
                {"user": "bob", "server": "big", "position": 2, "since": since, "request": {}},
            ]
        }
    )
    assert table.splitlines() == [
        "MODEL  #  USER  SERVER  WAITING SINCE",
        f"A100   1  ann   -       {since}",
        f"A100   2  bob   big     {since}",
    ]
    assert format_line({}) == "Nobody waits in line."
    assert format_line({"user": "bob", "server": "big", "model": "A100", "removed": True}) == (
        "Took bob (big) out of the line for A100."
    )
    parser = build_parser()
    assert _request(parser, parser.parse_args(["line"])) == ("GET", "gpuspawner/queue")
    assert _request(parser, parser.parse_args(["line", "--remove", "bob"])) == ("DELETE", "gpuspawner/queue/bob")
    assert _request(parser, parser.parse_args(["line", "--remove", "bob/big one"])) == (
        "DELETE",
        "gpuspawner/queue/bob/big%20one",
    )
    with pytest.raises(SystemExit) as usage:
        _request(parser, parser.parse_args(["line", "--remove", "/x"]))
    assert usage.value.code == 2 and "line --remove needs USER" in capsys.readouterr().err
