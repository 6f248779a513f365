"""The spawn form's script in real Chromium, against a real hub on the three-node swarm
with `make demo`'s settings (devtools/demo.py: the GTX 1070s shared in tenths, the A100s
whole; stand-in servers): what the page's counts show is not free suggests the line as
soon as it is chosen, before Start, and a chosen share disables the number of GPUs.
"""

from __future__ import annotations

import pytest

from devtools import demo
from tests.integration import test_browser as browser_tests
from tests.integration.support import hub_on, spawn_ready, wait_until
from tests.integration.test_browser import by, log_in, model_radio, open_form, wait

A100, GTX = demo.RESERVED, demo.SHARED
browsers = browser_tests.browsers  # the browser tests' fixture


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    with hub_on(swarm, tmp_path_factory.mktemp("hub-form-hints"), port_from=22800, extra_config=demo.hub_config()) as h:
        yield h


def choose(driver, model: str) -> None:
    label = f'label[for="{model_radio(driver, model).get_attribute("id")}"]'
    driver.find_element(by().CSS_SELECTOR, label).click()


def share(driver, value: str) -> None:
    from selenium.webdriver.support.ui import Select  # noqa: PLC0415 - selenium is checked for first

    Select(driver.find_element(by().ID, "gpu-share")).select_by_value(value)


def suggested(driver) -> str:
    """The line's hint as shown ("" while hidden), once the Wait in line button shows with it."""
    B = by()
    hint, button = driver.find_element(B.ID, "gpu-wait-hint"), driver.find_element(B.ID, "gpu-wait-now")
    assert hint.is_displayed() == button.is_displayed()
    return hint.text if hint.is_displayed() else ""


def test_a_choice_with_none_free_suggests_the_line_at_once_and_a_share_disables_the_count(hub, browsers):
    """Guards docs/line.md: "The form suggests the line as soon as a model with none free is
    chosen, or a share larger than any one device of the model has free: it says what the
    refusal would, with the Wait in line for it button, before Start is pressed" and
    docs/sharing.md: "while a share is chosen, Number of GPUs is disabled"."""
    B = by()
    spawn_ready(hub, "holder", {"gpu_model": A100, "gpu_count": 2})  # every A100 is taken
    driver = browsers(width=1000, height=900).driver
    log_in(driver, hub, "alice")
    open_form(driver, hub)
    offered = driver.find_element(B.ID, "gpu-offered").text
    assert offered.endswith(f"A server gets whole GPUs of one model, all on one host, or a share of a GPU of {GTX}.")
    count = driver.find_element(B.ID, "gpu-count")
    assert suggested(driver) == ""

    choose(driver, A100)  # none free: the hint and the button, with nothing sent yet
    assert suggested(driver) == f"None of the {A100} you chose is free right now: tick this to wait in line for one, or"
    assert "gpu-wait-hint" in driver.find_element(B.ID, "gpu-wait").get_attribute("aria-describedby")
    choose(driver, GTX)  # three free
    assert suggested(driver) == "" and count.is_enabled()
    share(driver, "0.2")
    assert not count.is_enabled() and suggested(driver) == ""  # a share instead of a count
    share(driver, "")
    assert count.is_enabled()
    assert hub.server_model("alice") is None

    # Every GTX 1070 at 0.9: a share of at most one GPU fits on one device, or waits.
    for user in ("gia", "gil", "gus"):
        spawn_ready(hub, user, {"gpu_model": GTX, "gpu_share": 0.9})
    open_form(driver, hub)
    choose(driver, GTX)
    share(driver, "0.1")
    assert suggested(driver) == ""
    share(driver, "0.5")
    assert suggested(driver) == (
        f"No {GTX} has 0.5 of a GPU free right now (at most 0.1 on one device): tick this to wait in line for one, or"
    )
    driver.execute_script("document.getElementById('gpu-wait-now').scrollIntoView({block: 'center'})")
    driver.find_element(B.ID, "gpu-wait-now").click()  # the same choice, with gpu_wait
    wait(driver, lambda d: "/hub/spawn-pending/alice" in d.current_url, "no waiting page", 60)
    waiting = lambda: [w["user"] for w in hub.api("GET", "/gpuspawner/queue").json().get(GTX, [])]  # noqa: E731
    wait_until(lambda: waiting() == ["alice"], "alice does not wait in line for a GTX 1070")
    assert hub.server_model("alice")["user_options"] == {"gpu_model": GTX, "gpu_share": 0.5, "gpu_wait": True}
