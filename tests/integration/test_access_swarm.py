"""gpu_access on the real swarm with the real hub: groups from JupyterHub (load_groups
and its REST API), the student's form, 403s through the REST API, and a weekly
budget used up in the ledger."""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from devtools import browser as browser_harness
from devtools.hub import REPO
from gpuspawner.ledger.ledger import Ledger
from tests.ci import skip_or_fail
from tests.integration.support import hub_on, login, services_of, spawn_ready
from tests.integration.test_browser import by, log_in, open_form

A100 = "NVIDIA A100 80GB PCIe"
GTX = "NVIDIA GeForce GTX 1070"
INVENTORY = yaml.safe_load((REPO / "examples/local/gpus.yaml").read_text())
GTX_UUIDS = {d["uuid"] for d in INVENTORY["gpu-a"]}
RULES = {
    "students": {"models": [GTX], "max_gpus": 1, "max_hours": 4, "weekly_gpu_hours": 20},
    "staff": {"models": "*", "max_gpus": 4, "priority": 10},
    "*": {"models": [], "max_gpus": 0},
}


@pytest.fixture(scope="module")
def db_url(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('ledger')}/gpuspawner.sqlite"


@pytest.fixture(scope="module")
def hub(swarm, db_url, tmp_path_factory):
    config = (
        f"c.GPUSwarmSpawner.gpu_db_url = {db_url!r}\n"
        f"c.GPUSwarmSpawner.gpu_access = {RULES!r}\n"
        "c.JupyterHub.load_groups = {'students': {'users': ['stu', 'spent']}, 'staff': {'users': ['prof']}}\n"
        # the tests' admin token also changes group membership
        "c.JupyterHub.load_roles.append("
        "{'name': 'groups-admin', 'scopes': ['groups'], 'services': ['gpuspawner-admin']})\n"
    )
    with hub_on(swarm, tmp_path_factory.mktemp("hub"), port_from=21800, extra_config=config) as h:
        yield h


def visible(swarm, user: str) -> str:
    (service,) = services_of(swarm, user)
    env = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Env"]
    return next(e.split("=", 1)[1] for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES="))


def test_a_students_form_lists_only_the_allowed_model_and_another_gets_403(hub, swarm):
    """Guards docs/access.md, "Tests": "a student's form lists only the allowed model and a REST
    request for another gets 403, and the home page shows what is left of the budget"; "What users
    see": "The spawn form lists only the models the user may have" and "is refused with 403 before
    anything is reserved"."""
    page = login(hub, "stu").get(hub.url + "/hub/spawn/stu", timeout=30).content.decode()
    assert f'value="{GTX}"' in page and A100 not in page
    assert "Your limit: 1 per user" in page and "of 20 GPU-hours left" in page
    home = login(hub, "stu").get(hub.url + "/hub/home", timeout=30).content.decode()
    assert "Your weekly GPU budget: 20.0 of 20 GPU-hours left (over the last 7 days)." in home

    r = hub.spawn("stu", {"gpu_model": A100})
    assert r.status_code == 403, r.text
    assert (
        r.json()["message"]
        == f"{A100} is not available to you. Your group (students) allows {GTX}, up to 1 GPU at a time."
    )
    r = hub.spawn("stu", {"gpu_model": GTX, "gpu_count": 2})
    assert r.status_code == 403 and "2 GPUs requested." in r.json()["message"]
    assert services_of(swarm, "stu") == []

    spawn_ready(hub, "stu", {"gpu_model": GTX})
    assert visible(swarm, "stu") in GTX_UUIDS
    hub.stop_server("stu")


def test_staff_get_every_model_beyond_the_hubs_limit(hub, swarm):
    """Guards docs/access.md, "Tests": "staff get more than max_gpus_per_user"."""
    page = login(hub, "prof").get(hub.url + "/hub/spawn/prof", timeout=30).content.decode()
    assert f'value="{GTX}"' in page and f'value="{A100}"' in page and "Your limit: 4 per user" in page
    home = login(hub, "prof").get(hub.url + "/hub/home", timeout=30).content.decode()
    assert "My Server" in home and 'id="gpu-budget"' not in home  # staff have no budget
    spawn_ready(hub, "prof", {"gpu_model": GTX, "gpu_count": 3})  # the hub's max_gpus_per_user is 2
    assert set(visible(swarm, "prof").split(",")) == GTX_UUIDS
    hub.stop_server("prof")


def test_a_budget_used_up_in_the_ledger_refuses_with_when_it_frees_up(hub, swarm, db_url):
    """Guards docs/access.md, "Tests": "a budget used up in the ledger refuses with the time it frees
    up"."""
    ledger = Ledger(db_url)
    now = datetime.now(timezone.utc)
    start = now - timedelta(days=5)
    uuids = sorted(GTX_UUIDS)[:2]
    ledger.open("jupyter-spent-old", "spent", "old", "gpu-a", GTX, uuids, [1000, 1000], started_at=start)
    ledger.close("jupyter-spent-old", start + timedelta(hours=11))  # 22 of 20 GPU-hours
    r = hub.spawn("spent", {"gpu_model": GTX})
    assert r.status_code == 403, r.text
    message = r.json()["message"]
    assert "Your weekly GPU budget of 20 GPU-hours is used up (22.0 GPU-hours in the last 7 days)" in message
    back = datetime.strptime(re.search(r"from (\S+ \S+) UTC", message)[1], "%Y-%m-%d %H:%M")
    # 2 GPU-hours must age out: the first hour of the two-GPU span, a week after it
    assert abs(back.replace(tzinfo=timezone.utc) - (start + timedelta(hours=1, days=7))) <= timedelta(minutes=1)
    assert services_of(swarm, "spent") == []
    session = login(hub, "spent")
    page = session.get(hub.url + "/hub/spawn/spent", timeout=30).content.decode()
    assert "is used up" in page and 'name="gpu_count"' not in page
    home = session.get(hub.url + "/hub/home", timeout=30).content.decode()
    assert 'id="gpu-budget"' in home and "GPUs can be had again from" in home
    spawn_ready(hub, "spent", {"gpu_count": 0})  # CPU-only servers still start ({} reuses the stored options)
    assert visible(swarm, "spent") == "void"
    hub.stop_server("spent")


def test_membership_changed_through_the_rest_api_applies_at_the_next_spawn(hub, swarm):
    """Guards docs/access.md, "Tests": "membership changed through the REST API applies at the next
    spawn"."""
    hub.ensure_user("newbie")
    r = hub.spawn("newbie", {"gpu_model": GTX})
    assert r.status_code == 403, r.text
    assert r.json()["message"] == "Users in none of the hub's GPU groups may have CPU-only servers only."

    r = hub.api("POST", "/groups/students/users", json={"users": ["newbie"]})
    assert r.status_code == 200, r.text
    spawn_ready(hub, "newbie", {"gpu_model": GTX})
    assert visible(swarm, "newbie") in GTX_UUIDS
    hub.stop_server("newbie")

    r = hub.api("DELETE", "/groups/students/users", json={"users": ["newbie"]})
    assert r.status_code == 200, r.text
    r = hub.spawn("newbie", {"gpu_model": GTX})
    assert r.status_code == 403, r.text


def test_a_students_form_in_the_browser(hub, tmp_path):
    """What a student meets (the screenshot docs/access.md shows, with ``make screenshots``)."""
    reason = browser_harness.unavailable_reason()
    if reason:
        skip_or_fail(f"no browser for the browser tests: {reason}")
    shots = Path(os.environ.get("GPUSPAWNER_SCREENSHOT_DIR") or tmp_path)
    with browser_harness.Browser(width=1000, height=760) as b:
        driver = b.driver
        log_in(driver, hub, "stu")
        open_form(driver, hub)
        radios = driver.find_elements(by().CSS_SELECTOR, 'input[name="gpu_model"]')
        assert [r.get_attribute("value") for r in radios] == ["", GTX]
        assert driver.find_element(by().ID, "gpu-budget").text.startswith("Your weekly GPU budget:")
        assert "Your limit: 1 per user" in driver.find_element(by().ID, "gpu-count-help").text
        driver.save_screenshot(str(shots / "spawn-form-student.png"))
