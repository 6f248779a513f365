"""Fractional GPU shares end to end on the real swarm, through the REST API and
the allocation map: the seed example, and what each service carries."""

from __future__ import annotations

import pytest
import yaml

from devtools.hub import REPO
from tests.integration.support import hub_on, login, services_of, spawn_ready

A100 = "NVIDIA A100 80GB PCIe"
B0, B1 = (d["uuid"] for d in yaml.safe_load((REPO / "examples/local/gpus.yaml").read_text())["gpu-b"])


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    config = f'c.GPUSwarmSpawner.gpu_sharing = {{"{A100}": {{"quantum": 0.05, "split": True}}}}\n'
    with hub_on(swarm, tmp_path_factory.mktemp("hub"), port_from=21000, extra_config=config) as h:
        yield h


def spec_of(swarm, user) -> tuple[dict, dict]:
    (service,) = services_of(swarm, user)
    spec = service.attrs["Spec"]
    env = dict(e.split("=", 1) for e in spec["TaskTemplate"]["ContainerSpec"]["Env"])
    return env, spec["Labels"]


def test_seed_example_two_a100s_shared_by_0_2_and_1_2(hub, swarm):
    spawn_ready(hub, "alice", {"gpu_model": A100, "gpu_share": 0.2})
    spawn_ready(hub, "bob", {"gpu_model": A100, "gpu_share": 1.2})
    m = hub.api("GET", "/gpuspawner/alloc-map").json()["gpu-b"]
    assert sorted(d["allocated"] for d in m.values()) == [0.6, 0.8]
    (shared,) = [u for u, d in m.items() if d["allocated"] == 0.8]
    other = B1 if shared == B0 else B0
    holders = sorted((h["user"], h["share"], h["rule"]) for h in m[shared]["holders"])
    assert holders == [("alice", 0.2, "one device"), ("bob", 0.6, "even split")]
    assert m[other]["holders"] == [
        {"user": "bob", "server": "", "share": 0.6, "rule": "even split", "phase": "running"}
    ]

    # What the services carry, read from the swarm: every device touched, and the shares.
    env, labels = spec_of(swarm, "alice")
    assert env["NVIDIA_VISIBLE_DEVICES"] == shared and env["GPUSPAWNER_GPU_SHARES"] == "0.2"
    assert labels["gpuspawner.shares"] == "0.2" and env["GPUSPAWNER_GPU_ISOLATION"] == "none"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2"
    env, labels = spec_of(swarm, "bob")
    assert set(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == {B0, B1}
    assert env["GPUSPAWNER_GPU_SHARES"] == "0.6,0.6" and labels["gpuspawner.shares"] == "0.6,0.6"

    # The admin page draws it; a rescan from the services' labels finds the same.
    page = login(hub, "admin").get(hub.url + "/hub/gpus", timeout=30).content.decode()
    assert "0.80" in page and "0.60" in page and "alice (0.20)" in page
    again = hub.api("POST", "/gpuspawner/rescan").json()["gpu-b"]
    assert {u: d["allocated"] for u, d in again.items()} == {u: d["allocated"] for u, d in m.items()}

    # 0.2 is left on one device, 0.4 on the other: 0.5 fits on neither, 0.6 split does not either.
    r = hub.spawn("carol", {"gpu_model": A100, "gpu_share": 0.5})
    assert r.status_code == 409, r.text
    assert services_of(swarm, "carol") == []
    spawn_ready(hub, "carol", {"gpu_model": A100, "gpu_share": 0.4})
    hub.stop_all_servers()
    m = hub.api("GET", "/gpuspawner/alloc-map").json()["gpu-b"]
    assert [d["allocated"] for d in m.values()] == [0, 0]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"gpu_model": A100, "gpu_share": 0.33}, "0.05"),
        ({"gpu_model": A100, "gpu_share": 3}, "limit"),
        ({"gpu_model": A100, "gpu_share": 0.5, "gpu_count": 1}, "gpu_share"),
        ({"gpu_model": "NVIDIA GeForce GTX 1070", "gpu_share": 0.5}, "GTX 1070"),
    ],
)
def test_bad_shares_are_refused_and_create_nothing(hub, swarm, options, message):
    r = hub.spawn("dave", options)
    assert r.status_code == 400, r.text
    assert message in r.json()["message"]
    assert services_of(swarm, "dave") == []


def test_the_form_offers_shares_and_a_chosen_share_is_what_the_server_gets(hub, swarm):
    s = login(hub, "erin")
    page = s.get(hub.url + "/hub/spawn/erin", timeout=30).content.decode()
    assert 'name="gpu_share"' in page and '<option value="0.5">0.5 GPU</option>' in page
    assert "without isolation" in page
    r = s.post(
        hub.url + "/hub/spawn/erin",
        data={"gpu_model": A100, "gpu_count": "1", "gpu_share": "0.5", "_xsrf": s.cookies.get("_xsrf")},
        timeout=60,
    )
    assert r.status_code == 200
    hub.wait_ready("erin")
    env, labels = spec_of(swarm, "erin")
    assert env["GPUSPAWNER_GPU_SHARES"] == "0.5" and labels["gpuspawner.shares"] == "0.5"
    hub.stop_server("erin")
