"""The spawn form in a real browser (headless Chromium, devtools/browser.py) against
the real hub, proxy and swarm, with real Jupyter servers: what a user meets, from the
login page to JupyterLab.

The same code saves the screenshots of the form that the README shows: into
``GPUSPAWNER_SCREENSHOT_DIR`` when set (``make screenshots`` sets docs/screenshots),
otherwise into the test's temporary folder.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from devtools import browser as browser_harness
from tests.ci import skip_or_fail
from tests.integration.support import hub_on, services_of

A100 = "NVIDIA A100 80GB PCIe"
GTX = "NVIDIA GeForce GTX 1070"
ANY = "Any GPU"  # a class of both models (gpu_model_classes)
SPAWN_TIMEOUT = 150  # the local config's start_timeout for real Jupyter servers


@pytest.fixture(scope="module")
def browsers():
    """Opens headless Chromium sessions (each with its own cookies); closes them at the end."""
    reason = browser_harness.unavailable_reason()
    if reason:
        skip_or_fail(f"no browser for the browser tests: {reason}")
    opened = []

    def open_browser(**kw) -> browser_harness.Browser:
        opened.append(browser_harness.Browser(**kw))
        return opened[-1]

    yield open_browser
    for b in opened:
        b.close()


@pytest.fixture(scope="module")
def hub(browsers, swarm, jupyter_image, tmp_path_factory):
    classes = f"c.GPUSwarmSpawner.gpu_model_classes = {{{ANY!r}: [{A100!r}, {GTX!r}]}}\n"
    env = {"GPUSPAWNER_IMAGE": jupyter_image}
    with hub_on(swarm, tmp_path_factory.mktemp("hub-browser"), 21200, extra_config=classes, env=env) as h:
        yield h


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    where = os.environ.get("GPUSPAWNER_SCREENSHOT_DIR")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- what a user does ----------------------------------------------------------


def by():
    from selenium.webdriver.common.by import By  # noqa: PLC0415 - selenium is checked for first

    return By


def wait(driver, condition, message: str, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait  # noqa: PLC0415

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition, message)


def log_in(driver, hub, user: str) -> None:
    B = by()
    driver.get(hub.url + "/hub/login")
    driver.find_element(B.ID, "username_input").send_keys(user)
    driver.find_element(B.ID, "password_input").send_keys("any password")
    driver.find_element(B.ID, "login_submit").click()
    wait(driver, lambda d: "/hub/login" not in d.current_url, f"{user} stays on the login page")


def open_form(driver, hub) -> None:
    driver.get(hub.url + "/hub/spawn")
    wait(driver, lambda d: d.find_elements(by().ID, "gpu-model-none"), "no spawn form")


def model_radio(driver, model: str):
    return driver.find_element(by().CSS_SELECTOR, f'input[name="gpu_model"][value="{model}"]')


def model_help(driver, model: str) -> str:
    return driver.find_element(by().ID, model_radio(driver, model).get_attribute("aria-describedby")).text


def page_text(driver, element_id: str) -> str:
    """Text of an element, also while it is hidden (e.g. inside a closed <details>)."""
    return driver.execute_script(f"var e = document.getElementById('{element_id}'); return e ? e.textContent : '';")


def in_jupyterlab(driver, hub, user: str) -> bool:
    return driver.current_url.startswith(f"{hub.url}/user/{user}/lab") and bool(
        driver.find_elements(by().CSS_SELECTOR, ".jp-LabShell")
    )


# -- the tests -------------------------------------------------------------------


def test_from_the_form_to_jupyterlab_and_the_next_user_sees_one_less(hub, swarm, browsers, shots):
    from selenium.webdriver.common.keys import Keys  # noqa: PLC0415
    from selenium.webdriver.support.ui import Select  # noqa: PLC0415

    B = by()
    r = hub.spawn("holder", {"gpu_model": A100, "gpu_count": 2})  # every A100 is taken
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("holder", timeout=SPAWN_TIMEOUT)

    anna = browsers(width=1000, height=860).driver
    log_in(anna, hub, "anna")
    open_form(anna, hub)
    assert model_help(anna, A100) == "80 GiB memory · 0 of 2 free now"
    assert model_radio(anna, A100).is_enabled()  # none free, but it can be waited for
    assert model_help(anna, GTX) == "8 GiB memory · 3 of 3 free now, up to 3 on one host"
    assert model_radio(anna, "").is_selected()
    anna.save_screenshot(str(shots / "spawn-form.png"))

    # Keyboard only: the arrow keys go through the models (the full A100 too), Tab goes on to the count.
    model_radio(anna, "").send_keys(Keys.ARROW_DOWN)
    assert model_radio(anna, A100).is_selected()
    anna.switch_to.active_element.send_keys(Keys.ARROW_DOWN)
    assert model_radio(anna, GTX).is_selected()
    anna.switch_to.active_element.send_keys(Keys.TAB)
    assert anna.switch_to.active_element.get_attribute("id") == "gpu-count"
    assert Select(anna.find_element(B.ID, "gpu-count")).first_selected_option.text == "1"
    anna.switch_to.active_element.send_keys(Keys.TAB)
    assert anna.switch_to.active_element.get_attribute("id") == "gpu-wait"
    anna.switch_to.active_element.send_keys(Keys.TAB)
    assert anna.switch_to.active_element.text == "Start"
    t0 = time.monotonic()
    anna.switch_to.active_element.send_keys(Keys.ENTER)

    # The progress page shows the allocation step, then the user lands in JupyterLab.
    reserved = f"Reserved 1 × {GTX} on gpu-a"
    wait(
        anna,
        lambda d: reserved in page_text(d, "progress-log") or in_jupyterlab(d, hub, "anna"),
        f"no '{reserved}' event on the progress page",
        timeout=SPAWN_TIMEOUT,
    )
    assert "/hub/spawn-pending/anna" in anna.current_url, f"no progress page; at {anna.current_url}"
    anna.find_element(B.CSS_SELECTOR, "#progress-details summary").click()
    anna.save_screenshot(str(shots / "spawn-progress.png"))
    wait(anna, lambda d: in_jupyterlab(d, hub, "anna"), "anna did not land in JupyterLab", timeout=SPAWN_TIMEOUT)
    print(f"\nspawn form submitted -> JupyterLab shown: {time.monotonic() - t0:.1f} s")
    (service,) = services_of(swarm, "anna")
    assert service.attrs["Spec"]["Labels"]["gpuspawner.model"] == GTX

    # Her home page says which GPU she holds (screenshot: docs/screenshots/home-gpus.png).
    anna.get(hub.url + "/hub/home")
    mine = wait(anna, lambda d: d.find_elements(B.ID, "gpuspawner-servers"), "no 'Your GPUs' on the home page")[0]
    uuid = service.attrs["Spec"]["Labels"]["gpuspawner.devices"]
    assert "Your GPUs" in mine.text and f"{GTX} on gpu-a" in mine.text and uuid in mine.text, mine.text
    anna.save_screenshot(str(shots / "home-gpus.png"))

    # An admin sees who holds what on the GPU page.
    admin = browsers(width=1000, height=900).driver
    log_in(admin, hub, "admin")
    admin.get(hub.url + "/hub/gpus")
    cards = wait(admin, lambda d: d.find_elements(B.CSS_SELECTOR, ".gpu-device"), "no devices on the GPU page")
    assert len(cards) == 5  # 3 GTX on gpu-a, 2 A100 on gpu-b
    text = admin.find_element(B.TAG_NAME, "main").text if admin.find_elements(B.TAG_NAME, "main") else admin.page_source
    assert "anna (1.00)" in text and "holder (1.00)" in text
    admin.save_screenshot(str(shots / "admin-gpus.png"))

    # The next user sees one GTX fewer, asks for two, and is refused when a third user
    # takes one meanwhile: the refusal is on the page, with what is free now.
    ben = browsers(width=1000, height=860).driver
    log_in(ben, hub, "ben")
    open_form(ben, hub)
    assert model_help(ben, GTX) == "8 GiB memory · 2 of 3 free now, up to 2 on one host"
    ben.find_element(B.CSS_SELECTOR, f'label[for="{model_radio(ben, GTX).get_attribute("id")}"]').click()
    Select(ben.find_element(B.ID, "gpu-count")).select_by_value("2")
    r = hub.spawn("carl", {"gpu_model": GTX, "gpu_count": 1})
    assert r.status_code in (201, 202), r.text
    ben.find_element(B.CSS_SELECTOR, "#spawn_form button[type=submit]").click()
    refusal = f"2 × {GTX} requested, at most 1 free on any single host (1 free in total)"
    error = wait(ben, lambda d: d.find_elements(B.CSS_SELECTOR, ".spawn-error-msg"), "no refusal shown")[0]
    assert refusal in error.text
    assert model_help(ben, GTX) == "8 GiB memory · 1 of 3 free now, up to 1 on one host"  # the form is current again
    ben.save_screenshot(str(shots / "spawn-refused.png"))
    assert services_of(swarm, "ben") == []

    # Ben takes the class of both models instead: the server gets the one that is free.
    assert model_help(ben, ANY) == (
        f"Any of {A100}, {GTX} · 1 of 5 free now, up to 1 of one model on one host · does not wait in line"
    )
    ben.find_element(B.CSS_SELECTOR, f'label[for="{model_radio(ben, ANY).get_attribute("id")}"]').click()
    Select(ben.find_element(B.ID, "gpu-count")).select_by_value("1")
    ben.find_element(B.CSS_SELECTOR, "#spawn_form button[type=submit]").click()
    wait(ben, lambda d: services_of(swarm, "ben"), "no server for ben's class of models", timeout=SPAWN_TIMEOUT)
    (service,) = services_of(swarm, "ben")
    assert service.attrs["Spec"]["Labels"]["gpuspawner.model"] == GTX
    assert hub.server_model("ben")["user_options"] == {"gpu_model": ANY, "gpu_count": 1}


def test_the_form_at_phone_width(hub, browsers, shots):
    phone = browsers(width=390, height=844).driver
    log_in(phone, hub, "dora")
    open_form(phone, hub)
    assert phone.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    start = phone.find_element(by().CSS_SELECTOR, "#spawn_form button[type=submit]")
    for element in [model_radio(phone, A100), model_radio(phone, GTX), start]:
        rect = element.rect
        assert 0 <= rect["x"] and rect["x"] + rect["width"] <= 390, rect
    phone.save_screenshot(str(shots / "spawn-form-phone.png"))


def test_the_form_works_without_javascript(hub, browsers):
    from selenium.webdriver.support.ui import Select  # noqa: PLC0415

    B = by()
    plain = browsers(width=1000, height=860, javascript=False).driver
    log_in(plain, hub, "erin")
    open_form(plain, hub)
    # With scripts on, the count is disabled while "No GPU" is chosen: here nothing ran.
    assert model_radio(plain, "").is_selected() and plain.find_element(B.ID, "gpu-count").is_enabled()
    plain.find_element(B.CSS_SELECTOR, f'label[for="{model_radio(plain, A100).get_attribute("id")}"]').click()
    Select(plain.find_element(B.ID, "gpu-count")).select_by_value("2")
    plain.find_element(B.CSS_SELECTOR, "#spawn_form button[type=submit]").click()
    wait(
        plain,
        lambda d: "/hub/spawn-pending/erin" in d.current_url or "/user/erin/" in d.current_url,
        "the spawn was not started",
    )
    assert hub.server_model("erin")["user_options"] == {"gpu_model": A100, "gpu_count": 2}
    hub.wait_ready("erin", timeout=SPAWN_TIMEOUT)
