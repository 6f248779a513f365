"""An unsaved edit survives a quota's take-back, in real Chromium against the real
three-node swarm: a real JupyterHub (with its proxy), real Jupyter servers (the image
of devtools/jupyter_image.py, with gpuspawner's JupyterLab extension), gpu-b's two
A100s as gpuspawner-agent reports them over the fake NVML.

The group lab-a is guaranteed one A100, with a minute's notice. Two users in no group
hold both A100s: both are borrowed. The newer borrower opens a text file in JupyterLab
and types into it without saving (JupyterLab's own autosave is off, so only a stop
notice can save it). A member of lab-a then asks for an A100 and waits in line: the
newer borrower is told, and before the stop the file on the server holds the edit,
saved by JupyterLab on its own; the server is then stopped (reason preempted) and the
member served. The timeline (edit typed, notice, saved, stopped, served) is printed.

Guards docs/quotas.md, "A notice a notebook survives": "JupyterLab saves every open
document before the stop" (when a stop comes before its next look but one, the
status-bar extension runs Save All).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
import requests

from gpuspawner.ledger.ledger import Ledger
from tests.integration.support import (
    ask_and_see_who_is_told,
    gpu_b,
    hub_with_quota,
    services_of,
    wait_stopped_after,
    wait_until,
)
from tests.integration.test_browser import SPAWN_TIMEOUT, browsers, by, log_in, wait  # noqa: F401 - fixtures

A100 = gpu_b()[0]["name"]
NOTICE = 60.0  # seconds: notice_minutes 1, time to open JupyterLab and type first
QUOTAS = {"lab-a": {A100: {"gpus": 1, "notice_minutes": NOTICE / 60}}}
BORROWERS = ("bo", "bea")  # in no group: all they hold is borrowed; bea, the newer, is chosen
FILE = "unsaved-notes.txt"
BEFORE = "first line, saved\n"
EDIT = "typed in the browser, never saved by hand"
REFRESH = 15.0  # seconds: the extension's refreshSeconds (the agent reports every second)
SLACK = 2.0  # seconds: the reclaim loop's interval and the time to ask
DOCMANAGER = "@jupyterlab/docmanager-extension:plugin"


@pytest.fixture(scope="module")
def hub(swarm, jupyter_image, tmp_path_factory):
    with hub_with_quota(swarm, tmp_path_factory.mktemp("quotas-browser"), jupyter_image, QUOTAS, 22600) as h:
        yield h


def server_api(hub, method: str, user: str, path: str, **kwargs) -> requests.Response:
    """The user's Jupyter server's REST API through the hub's proxy (the hub's token,
    scope access:servers)."""
    return requests.request(
        method, f"{hub.url}/user/{user}/{path}", headers={"Authorization": f"token {hub.token}"}, timeout=30, **kwargs
    )


def on_server(hub, user: str) -> str | None:
    """The file's text as the server has it (None: the server does not answer)."""
    try:
        r = server_api(hub, "GET", user, f"api/contents/{FILE}?type=file&format=text&content=1", allow_redirects=False)
        return r.json()["content"] if r.status_code == 200 else None
    except (requests.RequestException, ValueError, KeyError):
        return None


def start(hub, user: str, options: dict) -> None:
    r = hub.spawn(user, options)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user, timeout=SPAWN_TIMEOUT)


def editor(driver):
    """The open file's editor (CodeMirror's editable content), once shown."""
    found = driver.find_elements(by().CSS_SELECTOR, ".jp-FileEditor .cm-content[contenteditable=true]")
    return found[0] if found and found[0].is_displayed() else None


def tab_dirty(driver) -> bool:
    """Whether the file's tab carries JupyterLab's unsaved marker."""
    tabs = driver.find_elements(by().CSS_SELECTOR, ".lm-DockPanel-tabBar .lm-TabBar-tab")
    return any(FILE in t.text and "jp-mod-dirty" in (t.get_attribute("class") or "") for t in tabs)


def lab_state(driver) -> str:
    """What the page says about its status-bar item and its requests, for a failure."""
    script = """
        const done = arguments[arguments.length - 1];
        const item = document.getElementById('gpuspawner-lab-status');
        const asked = performance.getEntriesByType('resource')
            .filter(e => e.name.includes('gpuspawner-lab/status'))
            .map(e => Math.round(e.startTime / 100) / 10);
        fetch(location.pathname.split('/lab')[0] + '/gpuspawner-lab/status')
            .then(r => r.text()).catch(e => String(e))
            .then(answer => done(JSON.stringify({
                item: item ? item.textContent : null, title: item ? item.title : null,
                asked_at_s: asked, now_s: Math.round(performance.now() / 100) / 10, answer: answer})));
    """
    try:
        return driver.execute_async_script(script)
    except Exception as exc:  # the page is gone with the server
        return f"(the page could not be asked: {exc})"


def test_jupyterlab_saves_an_unsaved_edit_before_a_quota_take_back_stops_the_server(hub, swarm, browsers):  # noqa: F811
    from selenium.webdriver.common.keys import Keys  # noqa: PLC0415 - selenium is checked for first

    for user in BORROWERS:  # bo first: bea is the newer, whose stop loses fewer GPU-hours
        start(hub, user, {"gpu_model": A100})
    user = "bea"

    # The file, and JupyterLab's own autosave off: only the stop notice may save it.
    r = server_api(hub, "PUT", user, f"api/contents/{FILE}", json={"type": "file", "format": "text", "content": BEFORE})
    assert r.status_code in (200, 201), r.text
    r = server_api(hub, "PUT", user, f"lab/api/settings/{DOCMANAGER}", json={"raw": '{"autosave": false}'})
    assert r.status_code in (200, 204), r.text

    # In Chromium: bea opens the file in JupyterLab and types into it, without saving.
    driver = browsers(width=1200, height=800).driver
    log_in(driver, hub, user)
    driver.get(f"{hub.url}/user/{user}/lab/tree/{FILE}")
    shown = wait(driver, editor, "the file's editor was not shown in JupyterLab", timeout=120)
    wait(driver, lambda d: BEFORE.strip() in shown.text, f"the editor shows {shown.text!r}", timeout=30)
    wait(
        driver,
        lambda d: (d.find_elements(by().ID, "gpuspawner-lab-status") or [None])[0] is not None,
        "no GPU item in JupyterLab's status bar",
        timeout=60,
    )
    shown.click()
    shown.send_keys(Keys.CONTROL, Keys.END)
    shown.send_keys(EDIT)
    wait(driver, lambda d: EDIT in shown.text, f"the edit was not typed: {shown.text!r}", timeout=10)
    wait(driver, tab_dirty, "the file's tab shows no unsaved marker", timeout=10)
    t_edit = time.monotonic()
    assert on_server(hub, user) == BEFORE  # not saved: the server has the old text

    # ada (lab-a, below its quota) asks while nothing is free: she waits in line, and bea is told.
    ada = {"gpu_model": A100, "gpu_wait": True}
    asked, t_ask, t_notice, told = ask_and_see_who_is_told(hub, "ada", ada, BORROWERS)
    assert [u for u in BORROWERS if told[u]] == [user], told
    [notice] = told[user]
    assert notice["reason"] == "preempted" and notice["seconds_left"] >= NOTICE - SLACK, notice
    stop_at = datetime.fromisoformat(notice["stop_at"].replace("Z", "+00:00"))
    assert on_server(hub, user) == BEFORE and tab_dirty(driver)  # still unsaved when told

    # Before the stop, JupyterLab saves the file on its own: the server has the edit.
    saved: list[str] = []

    def saved_or_stopped() -> bool:
        text = on_server(hub, user)
        if text is not None and EDIT in text:
            saved.append(text)
            return True
        return not services_of(swarm, user)

    wait_until(saved_or_stopped, "neither saved nor stopped", timeout=NOTICE + 30)
    t_saved = time.monotonic()
    left = (stop_at - datetime.now(timezone.utc)).total_seconds()
    assert saved, (
        f"{user}'s server was stopped {t_saved - t_notice:.1f} s after the notice with the edit unsaved "
        f"(tab dirty: {tab_dirty(driver)}); the page: {lab_state(driver)}"
    )
    assert saved[0] == BEFORE + EDIT, saved
    assert not tab_dirty(driver), "the tab still shows the unsaved marker after the save"
    # Saved when the stop came within two looks (and 10 s), not at once.
    assert left <= 2 * REFRESH + 10 + SLACK, f"saved {left:.1f} s before the stop: {lab_state(driver)}"
    assert services_of(swarm, user), "the server is gone"

    # Then stopped after the notice, and the member served.
    t_stop = wait_stopped_after(swarm, hub, user, stop_at, SLACK, timeout=NOTICE + 30)
    r = asked.result(timeout=30)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ada", timeout=SPAWN_TIMEOUT)
    t_served = time.monotonic()
    assert (hub.server_model("bo") or {}).get("ready") and len(services_of(swarm, "bo")) == 1
    [closed] = Ledger(hub.db_url).history(user=user)
    assert closed.end_reason == "preempted", closed
    print(
        f"\nquota take-back in JupyterLab: edit typed (unsaved) at 0.0 s, ada asks {t_ask - t_edit:.1f} s, "
        f"notice to {user} {t_notice - t_edit:.1f} s ({notice['seconds_left']} s left), "
        f"saved by JupyterLab {t_saved - t_edit:.1f} s ({left:.1f} s before the stop), "
        f"stopped {t_stop - t_edit:.1f} s, ada served {t_served - t_edit:.1f} s (notice {NOTICE:.0f} s)"
    )
