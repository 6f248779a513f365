"""gpuspawner-agent run: real pynvml over the fake library, posting to a real HTTP server.

The agent runs as a subprocess (the fake NVML is found through LD_LIBRARY_PATH at
process start); the stand-in hub is a small HTTP server on 127.0.0.1 in this process
(devtools/report_sink.py), which records every request and answers as each test
scripts it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpuspawner
from devtools import fakenvml
from devtools.fakenvml.nodes import MIXED_NODE
from devtools.report_sink import ReportSink
from gpuspawner.agent.hub import HubClient, HubError, Token, report_url
from gpuspawner.core.enforcement import HAMI_LIBRARY, MPS_PIPE_DIR, look
from tests.ci import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-agent-token"
REPORT = "/hub/api/gpuspawner/report"


@pytest.fixture
def hub():
    h = ReportSink()
    yield h
    h.stop()


@pytest.fixture(scope="module")
def devices_file(tmp_path_factory) -> Path:
    return fakenvml.write_devices(
        tmp_path_factory.mktemp("gpus") / "devices.txt", MIXED_NODE, driver="550.54.15", cuda=12040
    )


@pytest.fixture
def token_file(tmp_path) -> Path:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    return f


def start_agent(args, lib_dir, devices=None, **extra_env) -> subprocess.Popen:
    env = fakenvml.process_env(lib_dir, devices, PYTHONPATH=str(REPO), **extra_env)
    for key in ("GPUSPAWNER_AGENT_TOKEN", "GPUSPAWNER_AGENT_TOKEN_FILE", "GPUSPAWNER_AGENT_HOSTNAME"):
        if key not in extra_env:
            env.pop(key, None)
    return subprocess.Popen(
        [sys.executable, "-m", "gpuspawner.agent.command", "run", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 30) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the agent did not finish in {timeout} s; stderr:\n{err}")
    return proc.returncode, out, err


def log_lines(stderr: str) -> list[str]:
    """The messages of the agent's log lines, without their timestamps."""
    lines = stderr.splitlines()
    for line in lines:
        assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} gpuspawner-agent: ", line), line
    return [line.split(" gpuspawner-agent: ", 1)[1] for line in lines]


def probe(lib_dir, devices) -> dict:
    env = fakenvml.process_env(lib_dir, devices, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-m", "gpuspawner.agent.command", "probe"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)


# ---- what it sends, where, with what credentials ----


@pytest.mark.parametrize("base", ["/jhub/", "/jhub"])
def test_posts_the_probe_report_with_its_token_under_the_hubs_base_path(
    hub, fake_lib_dir, devices_file, token_file, base, tmp_path
):
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text('{"default-runtime": "nvidia", "runtimes": {}}')
    proc = start_agent(
        [
            "--hub-url",
            hub.url(base),
            "--token-file",
            str(token_file),
            "--interval",
            "0.05",
            "--hostname",
            "gpu-node-1",
            "--cycles",
            "2",
            "--docker-config",
            str(daemon_json),
            "--proc-root",
            str(tmp_path),  # no process is in a container: each is reported unattributed
        ],
        fake_lib_dir,
        devices_file,
    )
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert out == ""
    assert len(hub.requests) == 2
    probed = probe(fake_lib_dir, devices_file)
    for dev in probed["devices"]:
        for p in dev["processes"]:
            p["holder"] = None
    expected = dict(
        probed,
        hostname="gpu-node-1",
        interval=0.05,
        agent_version=gpuspawner.__version__,
        docker_default_runtime="nvidia",
        share_enforcement=look(MPS_PIPE_DIR, HAMI_LIBRARY),  # what this machine has at the defaults
    )
    for path, headers, body in hub.requests:
        assert path == "/jhub" + REPORT
        assert headers["Authorization"] == f"token {TOKEN}"
        assert headers["Content-Type"] == "application/json"
        assert headers["User-Agent"] == f"gpuspawner-agent/{gpuspawner.__version__}"
        assert json.loads(body) == expected
    assert json.loads(hub.requests[0][2])["devices"][6]["mig_devices"][2]["profile"] == "1c.2g.20gb"
    assert log_lines(err) == [
        f"reporting to {hub.url('/jhub/hub/api/gpuspawner/report')} every 0.05 s as gpu-node-1",
        "first report sent: 8 GPUs, 3 unhealthy",
    ]


def test_token_and_hostname_from_the_environment(hub, fake_lib_dir, devices_file):
    proc = start_agent(
        ["--hub-url", hub.url(), "--interval", "0.05", "--cycles", "1"],
        fake_lib_dir,
        devices_file,
        GPUSPAWNER_AGENT_TOKEN="env-token",
        GPUSPAWNER_AGENT_HOSTNAME="gpu-from-env",
    )
    rc, _, err = finish(proc)
    assert rc == 0, err
    [(path, headers, body)] = hub.requests
    assert path == REPORT
    assert headers["Authorization"] == "token env-token"
    assert json.loads(body)["hostname"] == "gpu-from-env"


def test_hostname_defaults_to_this_machines(hub, fake_lib_dir, devices_file, token_file):
    import socket

    proc = start_agent(
        ["--hub-url", hub.url(), "--token-file", str(token_file), "--interval", "0.05", "--cycles", "1"],
        fake_lib_dir,
        devices_file,
    )
    rc, _, err = finish(proc)
    assert rc == 0, err
    assert json.loads(hub.requests[0][2])["hostname"] == socket.gethostname()


# ---- outages ----


def test_waits_out_a_hub_outage_with_one_line_per_failure(hub, fake_lib_dir, devices_file, token_file):
    hub.answers = [
        (200, b"{}"),
        (503, b'{"status": 503, "message": "The hub is starting"}'),
        (403, b'{"status": 403, "message": "Invalid agent token"}'),
        (500, b"<html><body>Internal error</body></html>"),
        ("slow", 1.0),
    ]
    proc = start_agent(
        [
            "--hub-url",
            hub.url(),
            "--token-file",
            str(token_file),
            "--interval",
            "0.05",
            "--timeout",
            "0.3",
            "--cycles",
            "3",
        ],
        fake_lib_dir,
        devices_file,
    )
    hub.wait_for(5)  # the slow one has arrived: take the hub down
    hub.stop()
    time.sleep(1.5)  # the agent meets a refused connection at least once
    hub.start()
    rc, _, err = finish(proc)
    assert rc == 0, err
    assert "Traceback" not in err

    lines = log_lines(err)
    failures = [line for line in lines if line.startswith("report failed: ")]
    assert failures[:4] == [
        "report failed: the hub answered 503: The hub is starting; retrying in 0.05 s",
        "report failed: the hub answered 403: Invalid agent token; retrying in 0.1 s",
        "report failed: the hub answered 500: Internal Server Error; retrying in 0.2 s",
        "report failed: no answer from the hub within 0.3 s; retrying in 0.2 s",
    ]
    refused = failures[4:]
    assert refused, "no attempt met the hub down"
    for line in refused:  # at the cap of 4 intervals (0.2 s); a retry may meet the hub going down or up
        assert line in {
            "report failed: cannot reach the hub: connection refused; retrying in 0.2 s",
            "report failed: cannot reach the hub: Connection reset by peer; retrying in 0.2 s",
        }, line
    assert lines == [
        f"reporting to {hub.url()}hub/api/gpuspawner/report every 0.05 s as {lines[0].rsplit(' ', 1)[1]}",
        "first report sent: 8 GPUs, 3 unhealthy",
        *failures,
        f"reporting works again (after {len(failures)} failed attempts)",
    ]
    # Hub side: the first report, the four answered failures, then two more reports.
    assert len(hub.requests) == 7


# ---- NVML across cycles ----


def test_nvml_is_initialised_once_and_again_after_it_fails(hub, fake_lib_dir, devices_file, token_file, tmp_path):
    calls = tmp_path / "nvml-calls.log"
    proc = start_agent(
        ["--hub-url", hub.url(), "--token-file", str(token_file), "--interval", "0.02", "--cycles", "5"],
        fake_lib_dir,
        devices_file,
        FAKE_NVML_CALL_LOG=str(calls),
        FAKE_NVML_FAIL_ON_COUNT="3",
    )
    rc, _, err = finish(proc)
    assert rc == 0, err
    # One init for reports 1-2; the third read fails and closes NVML; a fresh init
    # serves reports 3-5; the last shutdown is the exit.
    assert calls.read_text().split() == ["init", "shutdown", "init", "shutdown"]
    assert len(hub.requests) == 5
    assert [line for line in log_lines(err) if "report" in line and "every" not in line] == [
        "first report sent: 8 GPUs, 3 unhealthy",
        "report failed: NVML failed to list the GPUs on this node: Unknown Error; retrying in 0.02 s",
        "reporting works again (after 1 failed attempt)",
    ]


def test_a_gpu_lost_while_running_is_reported_under_its_uuid(hub, fake_lib_dir, devices_file, token_file):
    proc = start_agent(
        ["--hub-url", hub.url(), "--token-file", str(token_file), "--interval", "0.02", "--cycles", "3"],
        fake_lib_dir,
        devices_file,
        FAKE_NVML_LOSE_ON_COUNT="2:0",
    )
    rc, _, err = finish(proc)
    assert rc == 0, err
    first, *later = [json.loads(body)["devices"][0] for _, _, body in hub.requests]
    assert first["lost"] is False and first["healthy"] is True
    for dev in later:
        assert dev == {
            "index": 0,
            "uuid": "GPU-0a1b2c3d-0000-4000-8000-000000000000",
            "name": "NVIDIA GeForce GTX 1070",
            "memory_total_mib": None,
            "memory_used_mib": None,
            "utilization_gpu": None,
            "temperature_c": None,
            "ecc_uncorrected": None,
            "lost": True,
            "processes": [],
            "mig_mode": None,
            "mig_devices": [],
            "healthy": False,
            "problems": ["GPU is lost (NVML_ERROR_GPU_IS_LOST)"],
        }


# ---- start-up failures: exit 2 with one sentence, nothing sent ----


@pytest.mark.parametrize(
    "make_args, env, sentence",
    [
        (
            lambda hub, tmp: [],
            {},
            "gpuspawner-agent: no hub token: pass --token-file FILE or set GPUSPAWNER_AGENT_TOKEN_FILE or GPUSPAWNER_AGENT_TOKEN "
            "(this node's own token, issued with `gpuspawner agent-token HOST`)",
        ),
        (
            lambda hub, tmp: ["--token-file", str(tmp / "missing")],
            {},
            "gpuspawner-agent: cannot read the token file {tmp}/missing: No such file or directory",
        ),
        (
            lambda hub, tmp: ["--token-file", str(tmp / "token")],
            {"FAKE_NVML_NO_DRIVER": "1"},
            "gpuspawner-agent: the NVIDIA driver library is installed but the NVIDIA kernel driver "
            "is not loaded on this node",
        ),
    ],
    ids=["no token", "unreadable token file", "no driver"],
)
def test_start_up_failures_exit_2_with_one_sentence(
    hub, fake_lib_dir, devices_file, tmp_path, token_file, make_args, env, sentence
):
    proc = start_agent(["--hub-url", hub.url(), *make_args(hub, tmp_path)], fake_lib_dir, devices_file, **env)
    rc, out, err = finish(proc)
    assert (rc, out, err) == (2, "", sentence.format(tmp=tmp_path) + "\n")
    assert hub.requests == []


def test_no_library_exits_2(hub, tmp_path, token_file):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = start_agent(["--hub-url", hub.url(), "--token-file", str(token_file), "--cycles", "1"], empty)
    rc, out, err = finish(proc)
    if rc == 0:  # a real driver on this machine shadows the test
        skip_or_fail("a real libnvidia-ml.so.1 is installed system-wide, so the no-library case cannot be made")
    assert (rc, out, err) == (
        2,
        "",
        "gpuspawner-agent: no NVIDIA driver library (libnvidia-ml.so.1) found on this node\n",
    )
    assert hub.requests == []


# ---- stopping ----


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("where", ["between reports", "waiting for the hub"])
def test_a_signal_stops_it_at_once_with_status_0(hub, fake_lib_dir, devices_file, token_file, sig, where):
    if where == "waiting for the hub":
        hub.answers = [("slow", 20)]
    proc = start_agent(
        ["--hub-url", hub.url(), "--token-file", str(token_file), "--interval", "30", "--timeout", "25"],
        fake_lib_dir,
        devices_file,
    )
    hub.wait_for(1)
    time.sleep(0.2)  # inside the wait, not before it
    sent = time.monotonic()
    proc.send_signal(sig)
    rc, _, err = finish(proc, timeout=10)
    assert time.monotonic() - sent < 2
    assert rc == 0, err
    assert "Traceback" not in err
    assert log_lines(err)[-1] == f"stopped by {sig.name}"


# ---- memory over many cycles ----


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_memory_stays_flat_over_many_cycles(hub, fake_lib_dir, devices_file, token_file):
    cycles, early = 1500, 200
    rss = {}
    proc = start_agent(
        ["--hub-url", hub.url(), "--token-file", str(token_file), "--interval", "0.0001", "--cycles", str(cycles)],
        fake_lib_dir,
        devices_file,
    )
    # Read while the agent waits for the answer to its report: the same point of each cycle.
    hub.on_request = lambda n: rss.__setitem__(n, rss_kib(proc.pid)) if n in (early, cycles) else None
    rc, _, err = finish(proc, timeout=120)
    assert rc == 0, err
    assert len(hub.requests) == cycles
    growth = rss[cycles] - rss[early]
    # A leak of 1 KiB a cycle would add 1.3 MiB here.
    assert growth < 512, f"RSS grew by {growth} KiB between cycle {early} and {cycles}"


def test_a_rotated_token_file_is_used_at_once_without_a_restart(hub, fake_lib_dir, devices_file, token_file):
    """The hub refuses the old token (an admin rotated it); once the node's file holds
    the new one, the agent's next post carries it, within a second, not after its backoff."""
    refused = (403, b'{"status": 403, "message": "Missing or invalid credentials."}')
    hub.answers = [(200, b"{}")] + [refused] * 100
    args = ["--hub-url", hub.url(), "--interval", "1", "--cycles", "3"]
    # The file named as the stacks name it; replaced by a new file, as `install` does.
    proc = start_agent(args, fake_lib_dir, devices_file, GPUSPAWNER_AGENT_TOKEN_FILE=str(token_file))
    hub.wait_for(4)  # the first report, then three refused: the agent now backs off 4 s
    time.sleep(0.5)  # it sleeps
    new = token_file.with_name("token.new")
    new.write_text("the-new-token\n")
    new.replace(token_file)
    written = time.monotonic()
    hub.answers.clear()
    hub.wait_for(5)
    arrived = time.monotonic() - written
    rc, _, err = finish(proc)
    assert rc == 0, err
    tokens = [headers["Authorization"] for _, headers, _ in hub.requests]
    assert tokens[:4] == [f"token {TOKEN}"] * 4
    assert tokens[4:] == ["token the-new-token"] * (len(tokens) - 4)
    assert arrived < 2.5, f"the new token was first used {arrived:.1f} s after it was written"
    assert any(
        "report failed: the hub answered 403: Missing or invalid credentials." in line for line in log_lines(err)
    )
    assert f"the token file {token_file} holds a new token: using it" in log_lines(err)


def test_a_new_token_file_found_before_a_post_is_logged_as_it_is_used(hub, token_file, caplog):
    """Guards docs/agent.md, "Running, failing, stopping": "the token file
    /run/gpuspawner/agent-token holds a new token: using it" (the line for a file found
    changed before a post, as for one read again after a 403)."""
    caplog.set_level("INFO", logger="gpuspawner-agent")
    client = HubClient(report_url(hub.url()), Token(str(token_file)), timeout=5)
    client.post(b"{}")
    assert caplog.records == []  # the same file: nothing to say
    new = token_file.with_name("token.new")
    new.write_text("the-new-token\n")
    new.replace(token_file)
    client.post(b"{}")
    assert [h["Authorization"] for _, h, _ in hub.requests] == [f"token {TOKEN}", "token the-new-token"]
    assert [r.getMessage() for r in caplog.records] == [f"the token file {token_file} holds a new token: using it"]
    caplog.clear()
    os.utime(token_file)  # touched, the same token: read again, nothing to say
    client.post(b"{}")
    assert caplog.records == []


def test_a_refused_post_reads_the_token_file_again_and_retries_once_with_a_new_one(hub, token_file):
    """The file was rewritten while a post was on its way: the 403 makes the client read
    it again, and the same report goes out at once with the new token."""
    refused = (403, b'{"status": 403, "message": "Missing or invalid credentials."}')
    hub.answers = [refused]
    hub.on_request = lambda n: n == 1 and token_file.write_text("the-new-token\n")
    client = HubClient(report_url(hub.url()), Token(str(token_file)), timeout=5)
    client.post(b"{}")
    assert [h["Authorization"] for _, h, _ in hub.requests] == [f"token {TOKEN}", "token the-new-token"]
    # A refusal while the file holds the same token: one request, and the hub's message.
    hub.answers, hub.on_request = [refused], None
    with pytest.raises(HubError, match="the hub answered 403: Missing or invalid credentials."):
        client.post(b"{}")
    assert len(hub.requests) == 3


def test_a_report_taken_with_a_device_left_out_is_logged_with_what_was_left_out(hub, token_file, caplog):
    """The hub took the report but left out a UUID another node has: the agent says which."""
    sentence = "GPU-b0 is on gpu-b (by its agent's report), not on gpu-a"
    hub.answers = [(200, json.dumps({"hostname": "gpu-a", "left_out": [sentence]}).encode())]
    caplog.set_level("WARNING", logger="gpuspawner-agent")
    HubClient(report_url(hub.url()), Token(str(token_file)), timeout=5).post(b"{}")
    assert [r.getMessage() for r in caplog.records] == [
        f"the hub left a device out: {sentence} (a copied inventory or a spoofed agent; check nvidia-smi -L on both)"
    ]
    caplog.clear()
    hub.answers = [(200, b'{"hostname": "gpu-a", "left_out": []}'), (200, b'{"left_out": {"odd": 1}}')]
    HubClient(report_url(hub.url()), Token(str(token_file)), timeout=5).post(b"{}")
    HubClient(report_url(hub.url()), Token(str(token_file)), timeout=5).post(b"{}")  # not a list: ignored
    assert caplog.records == []
