"""Agent reports into a real hub on the real test swarm: who may report, what
is refused (always a clean 4xx), and what the form and the allocation map then
show. Reports are posted here over HTTP exactly as gpuspawner-agent posts them;
test_agents_on_nodes.py runs the agent itself on each node. This hub still allows
the agents' shared token (``agent_shared_token``), which most tests here post with;
each node's own token, issued by ``gpuspawner agent-token``, may report only for
its node."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuspawner.core.reports import MAX_REPORT_BYTES
from tests.integration.support import admin_cli, hub_on, login, spawn_ready
from tests.unit.test_reports import A100, MIG, device, report

AGENT_TOKEN = "agent-token-for-tests-0123456789"
GTX = "NVIDIA GeForce GTX 1070"


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    env = {"GPUSPAWNER_INVENTORY_SOURCE": "agent", "GPUSPAWNER_AGENT_TOKEN": AGENT_TOKEN}
    config = "c.GPUSwarmSpawner.agent_shared_token = True\n"
    with hub_on(swarm, tmp_path_factory.mktemp("hub"), port_from=18500, extra_config=config, env=env) as h:
        yield h


def post(hub, body, token=AGENT_TOKEN, raw: bytes | None = None) -> requests.Response:
    headers = {"Authorization": f"token {token}"} if token else {}
    data = raw if raw is not None else json.dumps(body)
    return requests.post(hub.url + "/hub/api/gpuspawner/report", data=data, headers=headers, timeout=30)


def form(hub, user) -> str:
    # JupyterHub's pages say charset=utf-8 in a meta tag, not in the header.
    return login(hub, user).get(hub.url + f"/hub/spawn/{user}", timeout=30).content.decode()


def gpu_a(*devices):
    return report(*devices, hostname="gpu-a")


def test_only_the_agent_token_may_report(hub):
    """Guards docs/security.md, "A node's agent token": "report devices for its own node"."""
    body = gpu_a(device(0, "GPU-gtx-a0", GTX, 8192))
    assert post(hub, body, token=None).status_code == 403
    assert post(hub, body, token="wrong").status_code == 403
    assert post(hub, body, token=hub.token).status_code == 403  # an admin token lacks the report scope
    r = post(hub, body)
    assert r.status_code == 200, r.text
    assert r.json() == {"hostname": "gpu-a", "devices": 1, "interval": 15.0, "left_out": []}


def test_the_agent_token_can_do_nothing_else(hub):
    """Guards docs/security.md, "A node's agent token": "use any other endpoint (403)".

    Guards docs/reliability.md, "Measured on the test swarm": "the agent token cannot read, list
    users or spawn"."""
    h = {"Authorization": f"token {AGENT_TOKEN}"}
    assert requests.get(hub.url + "/hub/api/gpuspawner/alloc-map", headers=h, timeout=30).status_code == 403
    assert requests.get(hub.url + "/hub/api/users", headers=h, timeout=30).status_code == 403
    assert requests.post(hub.url + "/hub/api/users/mallory/server", headers=h, timeout=30).status_code == 403


@pytest.mark.parametrize(
    "body, raw, status, message",
    [
        (report(device(0, "GPU-x"), hostname="not-a-node"), None, 400, "not-a-node is not a node of this swarm"),
        (None, b"{not json", 400, "not valid JSON"),
        (report(device(0, "GPU-x,GPU-y"), hostname="gpu-a"), None, 400, "devices[0].uuid"),
        (None, b" " * (MAX_REPORT_BYTES + 1), 400, "limit"),
    ],
)
def test_bad_reports_get_a_clear_400(hub, body, raw, status, message):
    r = post(hub, body, raw=raw)
    assert r.status_code == status
    assert message in r.json()["message"]


def test_reports_become_the_form_and_the_allocation_map(hub, swarm):
    assert post(hub, gpu_a(*[device(i, f"GPU-gtx-a{i}", GTX, 8192) for i in range(3)])).status_code == 200
    assert post(hub, report(device(0, "GPU-a100-b0"), MIG)).status_code == 200
    page = form(hub, "nora")
    assert "3 of 3 free now" in page
    for model in (A100, A100 + " · MIG 1g.10gb", A100 + " · MIG 3g.40gb"):
        assert re.search(f'value="{re.escape(model)}"', page), model

    spawn_ready(hub, "nora", {"gpu_model": A100 + " · MIG 1g.10gb"})
    m = hub.api("GET", "/gpuspawner/alloc-map").json()
    assert m["gpu-b"]["MIG-aaaa-0002"]["holders"] == [
        {"user": "nora", "server": "", "share": 1.0, "rule": None, "phase": "running"}
    ]
    assert m["gpu-b"]["MIG-aaaa-0002"]["allocated"] == 1.0
    assert m["gpu-a"]["GPU-gtx-a0"]["allocated"] == 0 and m["gpu-a"]["GPU-gtx-a0"]["health"] == "ok"
    # The server really got the MIG device, by its MIG UUID.
    (service,) = swarm.client().services.list(filters={"label": "gpuspawner.user=nora"})
    env = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Env"]
    assert "NVIDIA_VISIBLE_DEVICES=MIG-aaaa-0002" in env

    # The admin CLI shows the same.
    cli = admin_cli(hub, "alloc-map")
    assert cli.returncode == 0, cli.stderr
    (line,) = [ln for ln in cli.stdout.splitlines() if "MIG-aaaa-0002" in ln]
    assert "1.00" in line and line.endswith("nora (1.00)")
    cli = admin_cli(hub, "alloc-map", "--json", token=AGENT_TOKEN)
    assert cli.returncode == 1 and "HTTP 403" in cli.stderr and "admin:servers" in cli.stderr

    # Rescan from the swarm's services returns the same holdings.
    again = hub.api("POST", "/gpuspawner/rescan").json()
    assert again["gpu-b"]["MIG-aaaa-0002"]["holders"] == m["gpu-b"]["MIG-aaaa-0002"]["holders"]
    hub.stop_server("nora")


def test_an_unhealthy_gpu_leaves_the_form_at_once_and_the_map_says_why(hub):
    assert post(hub, gpu_a(*[device(i, f"GPU-gtx-a{i}", GTX, 8192) for i in range(3)])).status_code == 200
    sick = gpu_a(
        device(0, "GPU-gtx-a0", GTX, 8192, ecc_uncorrected=4), *[device(i, f"GPU-gtx-a{i}", GTX, 8192) for i in (1, 2)]
    )
    assert post(hub, sick).status_code == 200
    page = form(hub, "olga")
    assert "2 of 2 free now" in page
    m = hub.api("GET", "/gpuspawner/alloc-map").json()
    assert m["gpu-a"]["GPU-gtx-a0"]["health"] == "unhealthy"
    assert m["gpu-a"]["GPU-gtx-a0"]["problems"] == ["4 uncorrected ECC errors"]
    assert post(hub, gpu_a(*[device(i, f"GPU-gtx-a{i}", GTX, 8192) for i in range(3)])).status_code == 200
    assert "3 of 3 free now" in form(hub, "olga")


def test_the_admin_page_draws_the_map_and_is_for_admins_only(hub):
    assert post(hub, gpu_a(device(0, "GPU-gtx-a0", GTX, 8192, temperature_c=99))).status_code == 200
    page = login(hub, "admin").get(hub.url + "/hub/gpus", timeout=30)
    assert page.status_code == 200
    assert "GPU allocation" in page.text and "GPU-gtx-a0" in page.text and "temperature 99 C is above 90 C" in page.text
    assert login(hub, "peter").get(hub.url + "/hub/gpus", timeout=30).status_code == 403
    s = login(hub, "peter")
    assert s.get(hub.url + "/hub/api/gpuspawner/alloc-map", timeout=30).status_code == 403


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        st.binary(max_size=200),
        st.dictionaries(st.sampled_from(["hostname", "interval", "devices", "x"]), json_values)
        .map(json.dumps)
        .map(str.encode),
        st.lists(
            st.dictionaries(
                st.sampled_from(
                    ["index", "uuid", "name", "memory_total_mib", "lost", "mig_mode", "mig_devices", "temperature_c"]
                ),
                json_values,
            ),
            max_size=3,
        ).map(lambda ds: json.dumps(report(*ds, hostname="gpu-a")).encode()),
    )
)
def test_fuzzed_reports_only_ever_get_a_clean_answer(hub, body):
    """Guards docs/security.md, "A node's agent token": "send malformed, oversized or deeply nested
    bodies".

    Guards docs/reliability.md, "Measured on the test swarm": "never a traceback, never a service or
    a held GPU after a refusal"."""
    r = post(hub, None, raw=body)
    assert r.status_code in (200, 400), r.text
    assert set(r.json()) >= ({"status", "message"} if r.status_code == 400 else {"hostname"})


def test_a_report_naming_another_nodes_gpu_has_it_left_out_and_the_gpu_stays_on_its_node(hub, swarm):
    """One node's agent cannot move another node's GPU to itself by naming its UUID;
    the rest of its report is taken.

    Guards docs/security.md, "A node's agent token": "take another node's GPU by naming its UUID"
    and "the device is left out of its report (the rest is taken), the GPU stays put, and doctor
    lists the conflict".

    Guards docs/reliability.md, "The fault model": "A report naming another node's GPU has that
    device left out, and only that device"."""
    assert post(hub, report(device(0, "GPU-b-only-0"), hostname="gpu-b")).status_code == 200
    own = gpu_a(*[device(i, f"GPU-gtx-a{i}", GTX, 8192) for i in range(3)])
    assert post(hub, own).status_code == 200
    r = post(hub, gpu_a(*own["devices"], device(3, "GPU-b-only-0")))
    assert r.status_code == 200, r.text
    assert r.json()["left_out"] == ["GPU-b-only-0 is on gpu-b (by its agent's report), not on gpu-a"]
    findings = [f for f in hub.api("GET", "/gpuspawner/doctor").json()["findings"] if f["host"] == "gpu-a"]
    assert any("GPU-b-only-0" in f["problem"] and f["severity"] == "error" for f in findings), findings
    m = hub.api("GET", "/gpuspawner/alloc-map").json()
    assert "GPU-b-only-0" in m["gpu-b"] and "GPU-b-only-0" not in m["gpu-a"]
    spawn_ready(hub, "ursa", {"gpu_model": A100})  # the only A100: still on gpu-b, under its own id
    (service,) = swarm.client().services.list(filters={"label": "gpuspawner.user=ursa"})
    spec = service.attrs["Spec"]["TaskTemplate"]
    assert "node.hostname==gpu-b" in spec["Placement"]["Constraints"]
    assert "NVIDIA_VISIBLE_DEVICES=GPU-b-only-0" in spec["ContainerSpec"]["Env"]
    hub.stop_server("ursa")
    assert post(hub, own).status_code == 200  # a clean report from gpu-a clears the finding
    findings = [f for f in hub.api("GET", "/gpuspawner/doctor").json()["findings"] if f["host"] == "gpu-a"]
    assert not any("GPU-b-only-0" in f["problem"] for f in findings), findings


def agent_token_cli(hub, *args: str) -> subprocess.CompletedProcess:
    return admin_cli(hub, "agent-token", *args)


def test_a_nodes_own_token_cannot_report_for_another_node(hub, swarm):
    """gpu-a's token says gpu-b has no GPU: 403, gpu-b keeps its GPU, and the next
    spawn of that model lands on gpu-b.

    Guards docs/security.md, "A node's agent token": "report for another node's hostname: 403 with
    one sentence, and nothing of that node changes (its GPUs stay offered, the next spawn lands
    there)"."""
    issued = {host: agent_token_cli(hub, host) for host in ("gpu-a", "gpu-b")}
    assert all(r.returncode == 0 for r in issued.values()), {h: r.stderr for h, r in issued.items()}
    a, b = (issued[h].stdout.strip() for h in ("gpu-a", "gpu-b"))
    assert post(hub, gpu_a(*[device(i, f"GPU-gtx-a{i}", GTX, 8192) for i in range(3)]), token=a).status_code == 200
    assert post(hub, report(device(0, "GPU-b-own-0")), token=b).status_code == 200

    r = post(hub, report(hostname="gpu-b"), token=a)
    assert r.status_code == 403
    assert r.json()["message"] == "This agent token belongs to gpu-a and may report only for gpu-a, not for gpu-b."
    r = post(hub, report(device(0, "GPU-b-own-0", ecc_uncorrected=9)), token=a)
    assert r.status_code == 403  # nor mark its GPUs unhealthy
    m = hub.api("GET", "/gpuspawner/alloc-map").json()
    assert list(m["gpu-b"]) == ["GPU-b-own-0"] and m["gpu-b"]["GPU-b-own-0"]["health"] == "ok"
    spawn_ready(hub, "vera", {"gpu_model": A100})
    (service,) = swarm.client().services.list(filters={"label": "gpuspawner.user=vera"})
    spec = service.attrs["Spec"]["TaskTemplate"]
    assert "node.hostname==gpu-b" in spec["Placement"]["Constraints"]
    assert "NVIDIA_VISIBLE_DEVICES=GPU-b-own-0" in spec["ContainerSpec"]["Env"]
    hub.stop_server("vera")


def test_rotating_or_revoking_a_nodes_token_stops_the_old_one_at_once(hub):
    """Guards docs/security.md, "A node's agent token": "go on working once rotated or revoked: the old
    token gets 403 at once"."""
    old = agent_token_cli(hub, "gpu-a").stdout.strip()
    rotated = agent_token_cli(hub, "gpu-a")
    assert rotated.returncode == 0 and "Rotated: the old token stops working now" in rotated.stderr
    new = rotated.stdout.strip()
    body = gpu_a(device(0, "GPU-gtx-a0", GTX, 8192))
    assert post(hub, body, token=old).status_code == 403
    assert post(hub, body, token=new).status_code == 200
    listed = agent_token_cli(hub, "--list")
    assert listed.returncode == 0 and "gpu-a  issued " in listed.stdout and new not in listed.stdout
    revoked = agent_token_cli(hub, "--revoke", "gpu-a")
    assert revoked.returncode == 0, revoked.stderr
    assert post(hub, body, token=new).status_code == 403
    again = agent_token_cli(hub, "--revoke", "gpu-a")
    assert again.returncode == 1 and "gpu-a has no agent token" in again.stderr
