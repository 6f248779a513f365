"""Reconciliation on the real swarm: the hub's holdings follow the services the
swarm actually runs, without any spawn or stop going through the hub."""

from __future__ import annotations

import pytest
import yaml

from devtools.hub import REPO
from tests.integration.support import hub_on, spawn_ready, wait_until

INVENTORY = yaml.safe_load((REPO / "examples/local/gpus.yaml").read_text())
A100_0, A100_1 = (d["uuid"] for d in INVENTORY["gpu-b"])


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    config = "c.GPUSwarmSpawner.reconcile_interval = 2\n"
    with hub_on(swarm, tmp_path_factory.mktemp("hub"), port_from=19000, extra_config=config) as h:
        yield h


def holders(hub, uuid: str) -> list[str]:
    m = hub.api("GET", "/gpuspawner/alloc-map").json()
    return [h["user"] for h in m["gpu-b"][uuid]["holders"]]


def test_a_labelled_service_of_a_server_the_hub_does_not_know_is_adopted_then_removed(hub, swarm):
    """E.g. a spawn that a killed hub never finished: its GPU is held at once (so
    it is never handed out twice), and the service is removed at the next round.

    Guards docs/reliability.md, "Measured on the test swarm": "The first is adopted at once (its GPU
    never offered twice), then removed as a server the hub does not know"."""
    labels = {
        "gpuspawner.user": "ghost",
        "gpuspawner.server": "",
        "gpuspawner.host": "gpu-b",
        "gpuspawner.devices": A100_1,
        "gpuspawner.model": "NVIDIA A100 80GB PCIe",
    }
    service = swarm.client().services.create(  # named as the hub names ghost's server
        "gpuspawner-test/busybox:latest",
        ["sleep", "600"],
        name="jupyter-ghost",
        labels=labels,
        constraints=["node.hostname==gpu-b"],
    )
    try:
        wait_until(lambda: holders(hub, A100_1) == ["ghost"], "the orphan service was not adopted", timeout=20)
        wait_until(
            lambda: not swarm.client().services.list(filters={"name": "jupyter-ghost"}),
            "the orphan service was not removed",
            timeout=30,
        )
        wait_until(lambda: holders(hub, A100_1) == [], "the orphan's GPU was not released", timeout=30)
    finally:
        if swarm.client().services.list(filters={"name": "jupyter-ghost"}):
            service.remove()


def test_a_labelled_service_under_another_name_is_left_alone_and_shown_by_doctor(hub, swarm):
    """Labels are claims: a service that says it is ghost's server but is not
    named as the hub names it is neither charged to ghost nor removed.

    Guards docs/security.md, "Anyone with access to the swarm manager's API": "have it charged to
    that user or adopted, unless its name is the one the hub gives that user's server; it is listed
    by doctor and left alone"."""
    labels = {
        "gpuspawner.user": "ghost",
        "gpuspawner.server": "",
        "gpuspawner.host": "gpu-b",
        "gpuspawner.devices": A100_1,
        "gpuspawner.model": "NVIDIA A100 80GB PCIe",
    }
    service = swarm.client().services.create(
        "gpuspawner-test/busybox:latest",
        ["sleep", "600"],
        name="not-ghosts",
        labels=labels,
        constraints=["node.hostname==gpu-b"],
    )
    try:

        def flagged():
            findings = hub.api("GET", "/gpuspawner/doctor").json()["findings"]
            return [f for f in findings if f["host"] == "not-ghosts"]

        wait_until(flagged, "doctor does not list the foreign service", timeout=20)
        assert "jupyter-ghost" in flagged()[0]["problem"]
        assert holders(hub, A100_1) == []
        assert swarm.client().services.list(filters={"name": "not-ghosts"})  # left alone
    finally:
        service.remove()


def test_a_server_whose_service_vanished_behind_the_hubs_back_gives_its_gpu_back(hub, swarm):
    """Guards docs/reliability.md, "Measured on the test swarm": "the second's GPU is released within
    one reconcile interval"."""
    spawn_ready(hub, "tess", {"gpu_model": "NVIDIA A100 80GB PCIe"})
    (uuid,) = [u for u in (A100_0, A100_1) if holders(hub, u) == ["tess"]]
    (service,) = swarm.client().services.list(filters={"label": "gpuspawner.user=tess"})
    service.remove()
    wait_until(lambda: holders(hub, uuid) == [], "the vanished service's GPU was not released", timeout=20)
    hub.stop_server("tess")
