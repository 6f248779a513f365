"""Waiting in line for a GPU model, end to end: a real JupyterHub (with its
proxy) on the real three-node test swarm, driven through the hub's REST API.

Two users hold the two A100s; a third and a fourth wait in line (the queue
endpoint and their progress events say positions 1 and 2); a fifth without
gpu_wait is refused at once, though the hub's concurrent_spawn_limit (2) is
what the two waiting spawns alone would fill. The hub restarts in the middle:
the line and its order survive. Stopping a holder starts the first waiter by
itself (the time from the stop to its server being ready is printed) and moves
the other up; cancelling the other empties the line. Under gpu_access, a staff
member (priority 10) who waits after a student (priority 0) goes ahead of them.
Fair share is on (a 7-day half-life): of two waiters of equal priority, the one
without recent GPU use goes ahead of an earlier one with some.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.integration import test_browser as browser_tests
from tests.integration.support import admin_cli, hub_on, login, services_of, spawn_ready

A100 = "NVIDIA A100 80GB PCIe"
WAIT = {"gpu_model": A100, "gpu_wait": True}
# Students may wait for an A100, staff go first; users in neither group have the hub's defaults.
RULES = {"students": {"models": [A100], "max_gpus": 1}, "staff": {"models": "*", "max_gpus": 4, "priority": 10}}
CONFIG = (
    "c.JupyterHub.concurrent_spawn_limit = 2\n"
    "c.GPUSwarmSpawner.gpu_fairshare_half_life_days = 7\n"
    f"c.GPUSwarmSpawner.gpu_access = {RULES!r}\n"
    "c.JupyterHub.load_groups = {'students': {'users': ['stu']}, 'staff': {'users': ['prof']}}\n"
)
browsers, shots = browser_tests.browsers, browser_tests.shots  # the browser tests' fixtures


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    with hub_on(swarm, tmp_path_factory.mktemp("hub"), port_from=19700, extra_config=CONFIG) as h:
        yield h


def line(hub) -> list[tuple[str, int]]:
    r = hub.api("GET", "/gpuspawner/queue")
    assert r.status_code == 200, r.text
    return [(w["user"], w["position"]) for w in r.json().get(A100, [])]


def wait_until(hub, condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            log = [x for x in hub.log_path.read_text(errors="replace").splitlines() if " 200 GET " not in x]
            raise AssertionError(what + "\n" + "\n".join(log[-60:]))
        time.sleep(0.2)


def told(hub, user: str, text: str, timeout: float = 60) -> str:
    """The first of the spawn's progress events that starts with ``text``."""
    seen = []
    deadline = time.monotonic() + timeout
    with hub.api("GET", f"/users/{user}/server/progress", stream=True) as r:
        r.raise_for_status()
        for raw in r.iter_lines(decode_unicode=True):
            if raw and raw.startswith("data:"):
                message = json.loads(raw[5:]).get("message", "")
                seen.append(message)
                if message.startswith(text):
                    return message
            assert time.monotonic() < deadline, seen
    raise AssertionError(f"{user}'s progress ended without {text!r}: {seen}")


def test_the_line_end_to_end_through_a_hub_restart(hub, swarm):
    """Guards docs/line.md, "JupyterHub's limits": "a third user's spawn is still taken up" and "not
    throttled with JupyterHub's 429"; "A hub restart": "The waiting users are still waiting, in the
    same order"."""
    spawn_ready(hub, "anna", {"gpu_model": A100})
    spawn_ready(hub, "ben", {"gpu_model": A100})
    for user in ("cara", "dan"):
        r = hub.spawn(user, WAIT)
        assert r.status_code == 202, r.text  # pending: waiting in line
    assert line(hub) == [("cara", 1), ("dan", 2)]
    # The line is for admins: a user's own login gets 403.
    assert login(hub, "fay").get(hub.url + "/hub/api/gpuspawner/queue", timeout=10).status_code == 403
    assert told(hub, "cara", f"You are number 1 in line for {A100}")
    dan_words = told(hub, "dan", f"You are number 2 in line for {A100}")
    assert "Estimate" not in dan_words  # no server of this model has ended yet: no history to go by
    assert services_of(swarm, "cara") == [] and services_of(swarm, "dan") == []

    # Without gpu_wait: refused at once, with the line named (not JupyterHub's 429:
    # the two waiting spawns hold no slot of the concurrent_spawn_limit of 2).
    t = time.monotonic()
    r = hub.spawn("eve", {"gpu_model": A100})
    assert r.status_code == 409, r.text
    assert "2 requests are waiting in line" in r.json()["message"]
    assert time.monotonic() - t < 10
    assert hub.server_model("eve") is None

    # The hub restarts in the middle: the waiting users are still waiting, in order.
    hub.stop()
    hub.start()
    wait_until(hub, lambda: line(hub) == [("cara", 1), ("dan", 2)], "the line after the restart")
    wait_until(hub, lambda: (hub.server_model("cara") or {}).get("pending") == "spawn", "cara's spawn resumed")
    wait_until(hub, lambda: (hub.server_model("dan") or {}).get("pending") == "spawn", "dan's spawn resumed")
    assert told(hub, "cara", f"You are number 1 in line for {A100}")
    assert told(hub, "dan", f"You are number 2 in line for {A100}")
    page = hub.api("GET", "/gpuspawner/alloc-map").json()
    assert sorted(h["user"] for d in page["gpu-b"].values() for h in d["holders"]) == ["anna", "ben"]

    # A holder stops: the first in line gets the GPU, by itself.
    t0 = time.monotonic()
    hub.stop_server("anna")
    t1 = time.monotonic()
    hub.wait_ready("cara", timeout=90)
    t2 = time.monotonic()
    print(f"\nrelease -> ready: {t2 - t1:.1f} s after the stop returned ({t2 - t0:.1f} s after the DELETE)")
    assert line(hub) == [("dan", 1)]
    assert told(hub, "dan", f"You are number 1 in line for {A100}")

    # Cancel (DELETE on the pending server) leaves the line at once.
    r = hub.api("DELETE", "/users/dan/server")
    assert r.status_code in (202, 204), r.text
    assert line(hub) == []
    wait_until(hub, lambda: hub.server_model("dan") is None, "dan's pending server is gone")
    assert services_of(swarm, "dan") == []
    hub.stop_all_servers()


def test_the_waiting_page_shows_the_place_in_line(hub, browsers, shots):
    """In a real browser: the waiting page of a user in line (screenshot:
    docs/screenshots/spawn-waiting.png with ``make screenshots``); his Leave line moves
    the next waiter up on her own page, which takes her to her server when a GPU frees.

    Guards docs/line.md, "Waiting in line for a GPU": "You are number 2 in line for NVIDIA A100
    80GB PCIe" (the screenshot the page shows); "Leaving the line": "leaves the line at once", "JupyterHub's Stop button reads",
    "When the line serves the request, the page becomes JupyterHub's again" and "the page takes the
    user to the server when it is ready"."""
    spawn_ready(hub, "gil", {"gpu_model": A100, "gpu_count": 2})
    assert hub.spawn("hal", WAIT).status_code == 202
    driver = browsers(width=1000, height=700).driver
    browser_tests.log_in(driver, hub, "hal")
    driver.get(hub.url + "/hub/spawn-pending/hal")
    words = f"You are number 1 in line for {A100}"
    message = browser_tests.by().ID, "progress-message"
    browser_tests.wait(driver, lambda d: words in d.find_element(*message).text, "no place in line shown", 60)
    waiting = driver.find_element(browser_tests.by().ID, "gpuspawner-waiting").text
    assert f"Waiting for {A100} — number 1 in line" in waiting and "Leave line takes you out of the line" in waiting
    assert not driver.find_element(browser_tests.by().ID, "progress-bar").is_displayed()  # nothing is starting yet
    leave = driver.find_element(browser_tests.by().ID, "stop-server-btn")
    assert leave.text == "Leave line"
    driver.save_screenshot(str(shots / "spawn-waiting.png"))
    # ida waits behind him, on her own waiting page.
    assert hub.spawn("ida", WAIT).status_code == 202
    ida = browsers(width=1000, height=700).driver
    browser_tests.log_in(ida, hub, "ida")
    ida.get(hub.url + "/hub/spawn-pending/ida")
    second = f"You are number 2 in line for {A100}"
    browser_tests.wait(ida, lambda d: second in d.find_element(*message).text, "ida's place not shown", 60)
    leave.click()  # hal leaves: ida moves up, and her page says so
    wait_until(hub, lambda: line(hub) == [("ida", 1)], "hal left the line")
    browser_tests.wait(ida, lambda d: words in d.find_element(*message).text, "ida's page still says number 2", 60)
    # A GPU comes free: ida's waiting page takes her to her server by itself.
    hub.stop_server("gil")
    browser_tests.wait(ida, lambda d: "/user/ida/" in d.current_url, "ida was not taken to her server", 90)
    assert hub.server_model("ida")["ready"] and line(hub) == []
    hub.stop_all_servers()


def test_a_staff_waiter_goes_ahead_of_an_earlier_student(hub, swarm):
    """Guards docs/line.md, "The order": "a staff member who joins after a student is number 1 and the
    student number 2; the next A100 that frees up starts the staff member's server"."""
    spawn_ready(hub, "ivy", {"gpu_model": A100})
    spawn_ready(hub, "jon", {"gpu_model": A100})
    assert hub.spawn("stu", WAIT).status_code == 202
    assert told(hub, "stu", f"You are number 1 in line for {A100}")
    assert hub.spawn("prof", WAIT).status_code == 202  # later, with priority 10
    assert line(hub) == [("prof", 1), ("stu", 2)]
    assert told(hub, "prof", f"You are number 1 in line for {A100}")
    assert told(hub, "stu", f"You are number 2 in line for {A100}")

    hub.stop_server("ivy")
    hub.wait_ready("prof", timeout=90)  # the release starts the staff member's server
    assert line(hub) == [("stu", 1)]
    assert services_of(swarm, "stu") == []
    assert told(hub, "stu", f"You are number 1 in line for {A100}")
    hub.stop_all_servers()
    assert line(hub) == []


def test_with_fair_share_a_waiter_without_recent_use_goes_ahead_of_an_earlier_one_with_some(hub, swarm):
    spawn_ready(hub, "ken", {"gpu_model": A100, "gpu_count": 2})
    time.sleep(6)  # ken's recent use: 2 GPUs for 6 s, about 0.003 GPU-hours
    hub.stop_server("ken")
    spawn_ready(hub, "kim", {"gpu_model": A100})
    spawn_ready(hub, "kai", {"gpu_model": A100})
    assert hub.spawn("ken", WAIT).status_code == 202
    assert told(hub, "ken", f"You are number 1 in line for {A100}")
    assert hub.spawn("lia", WAIT).status_code == 202  # later, with no GPU use
    assert line(hub) == [("lia", 1), ("ken", 2)]
    waiters = hub.api("GET", "/gpuspawner/queue").json()[A100]
    assert waiters[0]["order"] == "recent use 0.0 GPU-hours" and waiters[0]["recent_gpu_hours"] == 0
    assert 0.002 < waiters[1]["recent_gpu_hours"] < 0.01, waiters
    assert told(hub, "lia", f"You are number 1 in line for {A100}").endswith(
        "Fair share orders this line: recent use 0.0 GPU-hours"
    )
    usage = {u["key"]: u for u in hub.api("GET", "/gpuspawner/usage").json()["usage"]}
    assert 0.002 < usage["ken"]["recent_gpu_hours"] <= usage["ken"]["gpu_hours"], usage

    hub.stop_server("kim")
    hub.wait_ready("lia", timeout=90)  # the GPU goes to lia, who came second
    assert line(hub) == [("ken", 1)]
    hub.stop_all_servers()
    assert line(hub) == []


def test_an_admin_lists_the_line_and_takes_a_request_out_of_it(hub, swarm):
    """Guards docs/line.md, "For admins": "gpuspawner line prints each model's line in order", "takes a
    request out of the line and the ledger" and "A request that is not in line answers 404"."""
    spawn_ready(hub, "gil", {"gpu_model": A100, "gpu_count": 2})
    assert hub.spawn("ivy", WAIT).status_code == 202
    assert told(hub, "ivy", f"You are number 1 in line for {A100}")
    listed = admin_cli(hub, "line")
    assert listed.returncode == 0 and f"{A100}  1  ivy" in listed.stdout, listed
    user = login(hub, "oscar")  # not an admin
    headers = {"X-XSRFToken": user.cookies.get("_xsrf") or ""}
    assert user.delete(hub.url + "/hub/api/gpuspawner/queue/ivy", headers=headers, timeout=30).status_code == 403
    removed = admin_cli(hub, "line", "--remove", "ivy")
    assert removed.returncode == 0 and removed.stdout.strip() == f"Took ivy out of the line for {A100}.", removed
    assert line(hub) == []
    wait_until(hub, lambda: hub.server_model("ivy") is None, "ivy's pending server ended")
    again = admin_cli(hub, "line", "--remove", "ivy")
    assert again.returncode == 1 and "is not waiting in line" in again.stderr, again
    hub.stop_all_servers()


def test_a_refusal_keeps_the_choice_and_one_click_joins_the_line(hub, browsers, shots):
    """In a real browser: kim asks for an A100 while none is free; the refused form keeps
    A100 chosen and says so; "Wait in line for it" sends the same choice with gpu_wait."""
    B = browser_tests.by()
    spawn_ready(hub, "gil", {"gpu_model": A100, "gpu_count": 2})
    driver = browsers(width=1000, height=900).driver
    browser_tests.log_in(driver, hub, "kim")
    browser_tests.open_form(driver, hub)
    driver.find_element(
        B.CSS_SELECTOR, f'label[for="{browser_tests.model_radio(driver, A100).get_attribute("id")}"]'
    ).click()
    driver.find_element(B.CSS_SELECTOR, "#spawn_form button[type=submit]").click()
    error = browser_tests.wait(driver, lambda d: d.find_elements(B.CSS_SELECTOR, ".spawn-error-msg"), "no refusal")[0]
    assert f"No {A100} is free right now" in error.text
    assert browser_tests.model_radio(driver, A100).is_selected()  # the choice is kept
    assert "None of the" in driver.find_element(B.ID, "gpu-wait-hint").text
    driver.execute_script("document.getElementById('gpu-wait-now').scrollIntoView({block: 'center'})")
    driver.save_screenshot(str(shots / "spawn-refused-wait.png"))
    driver.find_element(B.ID, "gpu-wait-now").click()
    browser_tests.wait(driver, lambda d: "/hub/spawn-pending/kim" in d.current_url, "no waiting page", 60)
    wait_until(hub, lambda: line(hub) == [("kim", 1)], "kim waits in line")
    hub.stop_all_servers()
    wait_until(hub, lambda: line(hub) == [], "the line is empty again")
