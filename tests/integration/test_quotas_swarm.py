"""A GPU quota taken back on the real three-node swarm, end to end: a real JupyterHub
(with its proxy), real Jupyter servers (the image of devtools/jupyter_image.py, whose
server extension writes the stop-notice file), gpu-b's two A100s as gpuspawner-agent
reports them over the fake NVML (every second, so the servers ask the hub every 5 s).

The group lab-a is guaranteed one A100, with 45 seconds' notice. Two users
in no group hold both A100s: both are borrowed. A member of lab-a asks for one and waits
in line; the borrower whose stop loses the fewer GPU-hours (the newer) is told at once,
the other is not. The timeline from the member's request to its server being ready is
printed.

Guards docs/quotas.md: "the users of the servers taken back are told at once" (the
notices endpoint and the home page, within seconds of the request), "the file that
GPUSPAWNER_STOP_NOTICE names appears with the stop time in it" (inside the borrower's
container), "stopped after the notice with the end reason preempted" (not before the
notice's stop time, then gone from the swarm, and so in the ledger) and "the member is
then served" (on the GPU taken back, while the other borrower keeps running).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from gpuspawner.ledger.ledger import Ledger
from tests.integration.support import (
    admin_cli,
    ask_and_see_who_is_told,
    gpu_b,
    hub_with_quota,
    login,
    notices_of,
    server_of,
    services_of,
    wait_stopped_after,
    wait_until,
)

A100 = gpu_b()[0]["name"]
NOTICE = 45.0  # seconds: the server looks for a notice every 30 s while none is announced
QUOTAS = {"lab-a": {A100: {"gpus": 1, "notice_minutes": NOTICE / 60}}}
BORROWERS = ("bo", "bea")  # in no group: all they hold is borrowed
SPAWN_TIMEOUT = 150  # the local config's start_timeout for real Jupyter servers
STOP_NOTICE = "/tmp/gpuspawner-stop-notice"  # the file GPUSPAWNER_STOP_NOTICE names
SLACK = 2.0  # seconds: the reclaim loop's interval and the time to ask


@pytest.fixture(scope="module")
def hub(swarm, jupyter_image, tmp_path_factory):
    with hub_with_quota(swarm, tmp_path_factory.mktemp("quotas"), jupyter_image, QUOTAS, 22400) as h:
        yield h


def home(hub, user: str) -> str:
    r = login(hub, user).get(hub.url + "/hub/home", timeout=30)
    r.raise_for_status()
    return r.text


def container_of(swarm, user: str):
    """The user's server's container, on gpu-b."""
    [service] = services_of(swarm, user)
    [container] = swarm.client("gpu-b").containers.list(
        filters={"label": f"com.docker.swarm.service.name={service.name}"}
    )
    return container


def stop_notice_in(container) -> str | None:
    """The stop-notice file's text inside the container (None: no such file)."""
    code, out = container.exec_run(["cat", STOP_NOTICE])
    return out.decode() if code == 0 else None


def start(hub, user: str, options: dict) -> None:
    r = hub.spawn(user, options)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user, timeout=SPAWN_TIMEOUT)


def test_a_borrowed_gpu_is_taken_back_with_notice_for_a_member_within_its_quota(hub, swarm):
    for user in BORROWERS:
        start(hub, user, {"gpu_model": A100})
    assert all(notices_of(hub, u) == [] for u in BORROWERS)
    devices = {u: server_of(swarm, u)[0] for u in BORROWERS}
    containers = {u: container_of(swarm, u) for u in BORROWERS}
    assert all(stop_notice_in(c) is None for c in containers.values())

    # ada (lab-a, below its quota) asks while nothing is free: she waits in line. (The
    # hub answers 202 only after its slow_spawn_timeout, 10 s: the notice comes before.)
    ada = {"gpu_model": A100, "gpu_wait": True}
    asked, t_ask, t_notice, told = ask_and_see_who_is_told(hub, "ada", ada, BORROWERS)
    [chosen] = [u for u in BORROWERS if told[u]]
    [other] = [u for u in BORROWERS if u != chosen]
    assert chosen == "bea", told  # the newer: its stop loses fewer GPU-hours
    [notice] = told[chosen]
    assert notice["reason"] == "preempted" and notice["server"] == "", notice
    assert NOTICE - SLACK <= notice["seconds_left"] <= NOTICE, notice
    assert f"its {A100} is borrowed, and a member of lab-a asks for the GPUs of its quota" in notice["message"]
    stop_at = datetime.fromisoformat(notice["stop_at"].replace("Z", "+00:00"))
    assert abs(stop_at - datetime.now(timezone.utc)) <= timedelta(seconds=NOTICE + SLACK), notice
    assert notices_of(hub, other) == []
    page = home(hub, chosen)
    assert 'data-reason="preempted"' in page and "a member of lab-a asks for the GPUs of its quota" in page
    assert 'data-reason="preempted"' not in home(hub, other)

    # The borrower's server extension writes the stop-notice file while the notice stands.
    text: list[str] = []

    def file_written() -> bool:
        found = stop_notice_in(containers[chosen])
        text[:] = found.splitlines() if found else []
        return bool(text)

    wait_until(file_written, "no stop-notice file in the borrower's container", timeout=NOTICE - SLACK)
    t_file = time.monotonic()
    assert text[:2] == [notice["stop_at"], "preempted"], text
    assert "a member of lab-a asks for the GPUs of its quota" in text[2], text
    assert stop_notice_in(containers[other]) is None
    r = asked.result(timeout=30)
    assert r.status_code == 202, r.text  # pending: in line

    # Stopped after the notice, not before: its service goes from the swarm.
    t_stop = wait_stopped_after(swarm, hub, chosen, stop_at, SLACK, timeout=NOTICE + 30)
    assert t_stop - t_notice >= NOTICE - SLACK

    # The member is then served, on the GPU taken back.
    hub.wait_ready("ada", timeout=SPAWN_TIMEOUT)
    t_served = time.monotonic()
    print(
        f"\nquota take-back: ask -> notice {t_notice - t_ask:.1f} s, -> stop-notice file {t_file - t_ask:.1f} s, "
        f"-> {chosen} stopped {t_stop - t_ask:.1f} s, -> ada served {t_served - t_ask:.1f} s "
        f"({t_served - t_stop:.1f} s after the stop; notice {NOTICE:.0f} s)"
    )
    assert t_served - t_stop <= 15, f"ada ready {t_served - t_stop:.1f} s after the stop"
    assert server_of(swarm, "ada")[0] == devices[chosen]
    assert (hub.server_model(other) or {}).get("ready") and len(services_of(swarm, other)) == 1
    assert notices_of(hub, other) == [] and notices_of(hub, "ada") == []
    [quota] = hub.api("GET", "/gpuspawner/quotas").json()["quotas"]
    assert (quota["group"], quota["within"], quota["waiting"], quota["taking_back"]) == ("lab-a", "1", "0", [])

    # The ledger: the borrower's allocation ended with the reason preempted.
    [closed] = Ledger(hub.db_url).history(user=chosen)
    assert closed.end_reason == "preempted" and closed.ended_at is not None
    assert [r.ended_at for r in Ledger(hub.db_url).history(user=other)] == [None]  # still held
    by_reason = admin_cli(hub, "usage", "--by", "reason")
    assert by_reason.returncode == 0, by_reason.stderr
    assert any(line.split()[:1] == ["preempted"] for line in by_reason.stdout.splitlines()), by_reason.stdout
