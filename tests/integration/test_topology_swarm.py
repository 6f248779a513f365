"""Multi-GPU servers on the real test swarm get the best linked GPUs their node's agent
reports: gpu-a is a DGX-1 (V100s in the hybrid cube-mesh) and gpu-b a workstation with
NVLink-bridged pairs, each reported by gpuspawner-agent over the fake NVML.

Guards docs/topology.md: "A request for several GPUs of a host ... the split whose groups
are best linked in all is taken, and of it the best linked group", on real services, and
"GPUSPAWNER_GPU_NUMA_NODES"; the form's line for a count and the home page's links are read
as the user reads them (the form fetched before the spawn and in headless Chromium)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from devtools.fakenvml import topologies
from tests.integration import test_browser as browser_tests
from tests.integration.support import hub_with_agents, login, service_gpus, services_of, spawn_ready, wait_until
from tests.integration.test_agents_on_nodes import alloc_map
from tests.integration.test_browser import by, log_in, model_radio, open_form, wait

browsers = browser_tests.browsers  # the browser tests' fixture

DGX1, PAIRS = topologies.dgx1(), topologies.pcie_pairs()


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    work = tmp_path_factory.mktemp("topology")
    config = "c.GPUSwarmSpawner.max_gpus_per_user = 8\n"
    with hub_with_agents(swarm, work, {"gpu-a": DGX1, "gpu-b": PAIRS}, port_from=20200, extra_config=config) as (
        hub,
        _,
    ):
        yield hub


def uuids(devices: list[dict], *positions: int) -> list[str]:
    return [devices[i]["uuid"] for i in positions]


def test_pairs_of_v100s_get_two_nvlinks_and_a_pair_of_a6000s_its_bridge(hub, swarm):
    dgx = alloc_map(hub)["gpu-a"]
    assert dgx[DGX1[0]["uuid"]]["links"][DGX1[3]["uuid"]] == "2 NVLinks"
    for user, want in (("ann", (0, 3)), ("ben", (1, 2)), ("cal", (4, 7))):
        spawn_ready(hub, user, {"gpu_model": topologies.V100, "gpu_count": 2})
        [service] = services_of(swarm, user)
        assert service_gpus(service) == uuids(DGX1, *want), user
    spawn_ready(hub, "dee", {"gpu_model": topologies.RTX, "gpu_count": 2})
    [service] = services_of(swarm, "dee")
    assert service_gpus(service) == uuids(PAIRS, 0, 1)  # the bridged pair, on one socket
    env = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Env"]
    assert "GPUSPAWNER_GPU_NUMA_NODES=0,0" in env  # where they sit, for binding CPU threads near them


def page(hub, user: str, path: str) -> str:
    """A hub page as ``user`` gets it (logged in)."""
    return login(hub, user).get(hub.url + path, timeout=30).content.decode()


class Inputs(HTMLParser):
    """Each <input>'s attributes, as the browser reads them (unescaped)."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.found: list[dict] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "input":
            self.found.append(dict(attrs))


def offers_in_form(hub, user: str, model: str) -> dict[str, str]:
    """What the spawn form says each count of ``model`` gets now (the page's data)."""
    found = Inputs(page(hub, user, f"/hub/spawn/{user}")).found
    [radio] = [a for a in found if a.get("name") == "gpu_model" and a.get("value") == model]
    return json.loads(radio.get("data-offers") or "{}")


def test_the_form_says_a_pair_of_v100s_gets_nvlink_and_the_home_page_shows_the_pairs_links(hub, swarm, browsers):
    """Guards docs/topology.md, "Where you see it": "The spawn form says, for the model and the count
    of 2 or more chosen, what such a request gets now" and "Your GPUs on the home page, for a server
    with 2 or more GPUs" (on the DGX-1, while an NVLink pair of it is free)."""
    from selenium.webdriver.support.ui import Select  # noqa: PLC0415 - the fixture checked for selenium

    B = by()
    said = offers_in_form(hub, "eve", topologies.V100)["2"]
    assert said == f"2 × {topologies.V100}: an NVLink pair free on gpu-a (2 NVLinks)"

    driver = browsers(width=1000, height=900).driver  # the script shows the line of each choice
    log_in(driver, hub, "eve")
    open_form(driver, hub)
    offer = driver.find_element(B.ID, "gpu-offer")
    assert not offer.is_displayed()
    driver.find_element(
        B.CSS_SELECTOR, f'label[for="{model_radio(driver, topologies.V100).get_attribute("id")}"]'
    ).click()
    count = Select(driver.find_element(B.ID, "gpu-count"))
    count.select_by_value("2")
    wait(driver, lambda d: offer.is_displayed() and offer.text == said, f"the form does not say {said!r}")
    count.select_by_value("1")
    wait(driver, lambda d: not offer.is_displayed(), "a count of 1 still has the line")

    spawn_ready(hub, "eve", {"gpu_model": topologies.V100, "gpu_count": 2})
    [service] = services_of(swarm, "eve")
    a, b = service_gpus(service)
    assert alloc_map(hub)["gpu-a"][a]["links"][b] == "2 NVLinks"  # what the form said it would get
    rows = re.findall(r'<div class="small gpu-links">(.*?)</div>', page(hub, "eve", "/hub/home"))
    assert rows == ["Links: 2 NVLinks (GPU 0–1)"]


def agents_reported(hub) -> None:
    both = lambda: set(alloc_map(hub)) == {"gpu-a", "gpu-b"}  # noqa: E731
    wait_until(both, "the agents did not report to the restarted hub", timeout=30)


def test_a_scattered_pair_is_refused_where_nvlink_is_required_and_placed_where_not(hub, swarm):
    """Only GPUs 0 and 5 of the DGX-1 free (no NVLink between them, across the CPUs): with
    gpu_link_required asking NVLink for 2 V100s, a request for 2 is refused, saying so, and the
    form offers no pair; the same hub without it places the request there, and the home page
    reads the pair's links.

    Guards docs/topology.md, "What the admin can require": "Where no host has one free now, the
    refusal names the class" and "it may wait in line (a refusal for now, 409)", on real services."""
    hub.stop_all_servers()
    singles = [f"one{i}" for i in range(len(DGX1))]
    for user in singles:
        spawn_ready(hub, user, {"gpu_model": topologies.V100, "gpu_count": 1})
    holder = {service_gpus(services_of(swarm, user)[0])[0]: user for user in singles}
    for i in (0, 5):
        hub.stop_server(holder[DGX1[i]["uuid"]])
    scattered = f"2 × {topologies.V100}: a pair free on gpu-a, across CPUs, without NVLink"
    assert offers_in_form(hub, "fay", topologies.V100) == {"2": scattered}

    extra = hub.extra_config
    hub.stop()
    hub.extra_config = extra + f'c.GPUSwarmSpawner.gpu_link_required = {{"{topologies.V100}": {{2: "nvlink"}}}}\n'
    try:
        hub.start()
        agents_reported(hub)
        assert offers_in_form(hub, "fay", topologies.V100) == {}  # no pair the hub would give
        r = hub.spawn("fay", {"gpu_model": topologies.V100, "gpu_count": 2})
        assert r.status_code == 409, r.text
        assert "GPUs joined by NVLink" in r.json()["message"], r.text
        assert services_of(swarm, "fay") == []
    finally:
        hub.stop()
        hub.extra_config = extra
        hub.start()
        agents_reported(hub)

    spawn_ready(hub, "fay", {"gpu_model": topologies.V100, "gpu_count": 2})
    [service] = services_of(swarm, "fay")
    assert service_gpus(service) == uuids(DGX1, 0, 5)
    rows = re.findall(r'<div class="small gpu-links">(.*?)</div>', page(hub, "fay", "/hub/home"))
    assert rows == ["Links: across CPUs (GPU 0–1)"]
