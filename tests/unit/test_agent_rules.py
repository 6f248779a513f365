"""The agent's pure parts: health rule, MIG profile names, hub URL, token, backoff, CLI."""

from __future__ import annotations

import json

import pytest

import gpuspawner
from gpuspawner.agent import hub as agent_hub
from gpuspawner.agent.command import build_parser
from gpuspawner.agent.errors import AgentError
from gpuspawner.agent.hub import Token, read_token, report_url
from gpuspawner.agent.loop import backoff_delay
from gpuspawner.agent.nvml import mig_profile_from_attributes, mig_profile_from_name, reading_problems
from gpuspawner.agent.report import docker_default_runtime, encode_report


@pytest.mark.parametrize(
    "info, limit, problems",
    [
        ({"lost": False, "ecc_uncorrected": 0, "temperature_c": 90}, 90, []),
        ({"lost": False, "ecc_uncorrected": None, "temperature_c": None}, 90, []),  # GeForce, no sensor
        ({"lost": True, "ecc_uncorrected": None, "temperature_c": None}, 90, ["GPU is lost (NVML_ERROR_GPU_IS_LOST)"]),
        ({"lost": False, "ecc_uncorrected": 3, "temperature_c": 40}, 90, ["3 uncorrected ECC errors"]),
        ({"lost": False, "ecc_uncorrected": 0, "temperature_c": 91}, 90, ["temperature 91 C is above 90 C"]),
        ({"lost": False, "ecc_uncorrected": 0, "temperature_c": 91}, 92.5, []),
        (
            {"lost": False, "ecc_uncorrected": 1, "temperature_c": 84},
            83.5,
            ["1 uncorrected ECC errors", "temperature 84 C is above 83.5 C"],
        ),
        ({}, 90, []),  # a record without the fields: nothing known, nothing wrong
    ],
)
def test_reading_problems(info, limit, problems):
    assert reading_problems(info, limit) == problems


@pytest.mark.parametrize(
    "name, profile",
    [
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb"),
        ("NVIDIA A100 80GB PCIe MIG 3g.40gb", "3g.40gb"),
        ("NVIDIA A100 80GB PCIe MIG 1c.2g.20gb", "1c.2g.20gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
        ("MIG 7g.80gb", "7g.80gb"),
        ("NVIDIA A100 80GB PCIe", None),  # older drivers: the GPU's name only
        ("NVIDIA A100-SXM4-40GB MIG", None),
        ("NVIDIA MIGHTY 1g.5gb", None),
        ("", None),
        (None, None),
    ],
)
def test_mig_profile_from_name(name, profile):
    assert mig_profile_from_name(name) == profile


@pytest.mark.parametrize(
    "gi, ci, slice_mb, gpu_mib, profile",
    [
        (1, 1, 4864, 40960, "1g.5gb"),  # A100 40GB
        (1, 1, 9856, 81920, "1g.10gb"),  # A100 80GB
        (3, 3, 40320, 81920, "3g.40gb"),
        (2, 1, 19968, 81920, "1c.2g.20gb"),  # a compute instance smaller than its GPU instance
        (7, 7, 81152, 81920, "7g.80gb"),  # 79.25 GB on its own: rounding that gives "7g.79gb"
        (1, 1, 11008, 95830, "1g.12gb"),  # H100 NVL, 94 GB
        (0, 0, 9856, 81920, None),  # no attributes to speak of
        (1, 1, 9856, None, None),  # GPU memory unknown
    ],
)
def test_mig_profile_from_attributes(gi, ci, slice_mb, gpu_mib, profile):
    assert mig_profile_from_attributes(gi, ci, slice_mb, gpu_mib) == profile


@pytest.mark.parametrize(
    "hub_url, url",
    [
        ("http://hub:8000", "http://hub:8000/hub/api/gpuspawner/report"),
        ("http://hub:8000/", "http://hub:8000/hub/api/gpuspawner/report"),
        ("http://hub:8000/jhub/", "http://hub:8000/jhub/hub/api/gpuspawner/report"),
        ("http://hub:8000/jhub", "http://hub:8000/jhub/hub/api/gpuspawner/report"),
        ("https://hub.example.org/a/b//", "https://hub.example.org/a/b/hub/api/gpuspawner/report"),
        (" http://10.0.0.5:8081/ ", "http://10.0.0.5:8081/hub/api/gpuspawner/report"),
    ],
)
def test_report_url_joins_the_base_path(hub_url, url):
    assert report_url(hub_url) == url


@pytest.mark.parametrize(
    "hub_url, message",
    [
        ("hub:8000", "--hub-url must be the hub's address, like http://hub.example.org:8000/ (got 'hub:8000')"),
        ("ftp://hub/", "--hub-url must be the hub's address"),
        ("http:///jhub/", "--hub-url must be the hub's address"),
        ("http://hub:8000/?next=/x", "--hub-url must not carry a query or a fragment"),
    ],
)
def test_report_url_refuses_what_is_not_a_hub_address(hub_url, message):
    with pytest.raises(AgentError, match="^gpuspawner-agent: ") as info:
        report_url(hub_url)
    assert message in str(info.value)


def test_token_from_file_wins_over_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSPAWNER_AGENT_TOKEN", "from-env")
    f = tmp_path / "token"
    f.write_text("from-file\n")  # docker secrets and editors add a newline
    assert read_token(str(f)) == "from-file"
    assert read_token(None) == "from-env"


@pytest.mark.parametrize(
    "content, env, message",
    [
        (None, None, "gpuspawner-agent: no hub token: pass --token-file FILE or set GPUSPAWNER_AGENT_TOKEN"),
        (None, "  ", "gpuspawner-agent: no hub token"),
        ("", None, "gpuspawner-agent: the token file {f} is empty"),
        ("abc def", None, "gpuspawner-agent: the token file {f} holds more than one token"),
        (None, "abc\ndef", "gpuspawner-agent: $GPUSPAWNER_AGENT_TOKEN holds more than one token"),
    ],
)
def test_token_problems_are_one_sentence(tmp_path, monkeypatch, content, env, message):
    monkeypatch.delenv("GPUSPAWNER_AGENT_TOKEN", raising=False)
    if env is not None:
        monkeypatch.setenv("GPUSPAWNER_AGENT_TOKEN", env)
    f = tmp_path / "token"
    if content is not None:
        f.write_text(content)
    with pytest.raises(AgentError) as info:
        read_token(str(f) if content is not None else None)
    assert str(info.value).startswith(message.format(f=f))


def test_unreadable_token_file(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(
        AgentError, match=f"^gpuspawner-agent: cannot read the token file {missing}: No such file or directory$"
    ):
        read_token(str(missing))


def test_backoff_doubles_from_the_interval_up_to_its_cap():
    # 4 intervals, at most 120 s.
    assert [backoff_delay(n, 15) for n in range(1, 6)] == [15, 30, 60, 60, 60]
    assert [backoff_delay(n, 2) for n in range(1, 6)] == [2, 4, 8, 8, 8]
    assert [backoff_delay(n, 60) for n in range(1, 5)] == [60, 120, 120, 120]
    assert backoff_delay(10_000, 15) == 60  # no overflow after a long outage


def test_report_body_is_the_probe_plus_who_sends_it():
    report = {"driver_version": "550.54.15", "cuda_version": "12.4", "device_count": 0, "healthy": True, "devices": []}
    body = json.loads(encode_report(report, "gpu-a", 15.0))
    assert body == dict(
        report, hostname="gpu-a", interval=15.0, agent_version=gpuspawner.__version__, docker_default_runtime=None
    )


def test_run_command_line():
    args = build_parser().parse_args(
        [
            "run",
            "--hub-url",
            "http://hub:8000/jhub/",
            "--token-file",
            "/run/secrets/t",
            "--interval",
            "5",
            "--hostname",
            "gpu-a",
            "--max-temperature",
            "85",
            "--cycles",
            "3",
        ]
    )
    assert (
        args.command,
        args.hub_url,
        args.token_file,
        args.interval,
        args.hostname,
        args.max_temperature,
        args.cycles,
        args.timeout,
    ) == ("run", "http://hub:8000/jhub/", "/run/secrets/t", 5.0, "gpu-a", 85.0, 3, agent_hub.DEFAULT_TIMEOUT_S)
    defaults = build_parser().parse_args(["run", "--hub-url", "http://hub:8000"])
    assert (defaults.interval, defaults.cycles, defaults.hostname, defaults.token_file) == (15.0, None, None, None)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run"], "the following arguments are required: --hub-url"),
        (["run", "--hub-url", "http://h", "--interval", "0"], "must be a number of seconds above 0, not '0'"),
        (["run", "--hub-url", "http://h", "--interval", "-1"], "must be a number of seconds above 0"),
        (["run", "--hub-url", "http://h", "--interval", "nan"], "must be a number of seconds above 0"),
        (
            ["run", "--hub-url", "http://h", "--interval", "1e300"],
            "must be at most 3600 seconds (the hub takes no longer)",
        ),
        (["run", "--hub-url", "http://h", "--timeout", "inf"], "must be a number of seconds above 0"),
        (["run", "--hub-url", "http://h", "--cycles", "0"], "must be a whole number from 1 up, not '0'"),
        (["run", "--hub-url", "http://h", "--cycles", "2.5"], "must be a whole number from 1 up"),
    ],
)
def test_bad_command_lines_exit_2_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_docker_default_runtime_from_daemon_json(tmp_path):
    f = tmp_path / "daemon.json"
    assert docker_default_runtime(str(f)) is None  # not there (e.g. not mounted): unknown
    f.write_text('{"default-runtime": "nvidia"}')
    assert docker_default_runtime(str(f)) == "nvidia"
    f.write_text('{"log-driver": "json-file"}')
    assert docker_default_runtime(str(f)) == "runc"  # dockerd's own default
    f.write_text("{not json")
    assert docker_default_runtime(str(f)) is None


def test_a_token_file_is_read_again_when_it_changes_and_a_bad_one_keeps_the_token_in_use(tmp_path):
    f = tmp_path / "token"
    f.write_text("first\n")
    token = Token(str(f))
    assert not token.changed() and not token.refresh() and token.value == "first"
    f.unlink()  # an admin replaces it: gone for a moment
    assert token.changed()
    with pytest.raises(AgentError, match="cannot read the token file"):
        token.refresh()
    assert token.value == "first" and not token.changed()  # dealt with: no retry loop on the same state
    f.write_text("second\n")
    assert token.changed() and token.refresh() and token.value == "second"
