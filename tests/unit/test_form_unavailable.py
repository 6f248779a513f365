"""What the spawn form says of GPUs it cannot offer now, by why their host is unavailable:
the swarm's node is down, drained or paused; its agent is late; or its agent reports and
the hub refuses the reports (a rotated token whose node's file is not written yet).

The refusal is seen where it happens: a real JupyterHub served on loopback (the hub of
tests/unit/test_agent_token_api.py, its swarm the in-process fake) refuses an agent's
report made with a token an admin has just replaced."""

from __future__ import annotations

import json
import time

from gpuspawner.cluster.cluster import GPUCluster, InventorySettings
from gpuspawner.core.reports import parse_report
from gpuspawner.hub.app import KEY
from gpuspawner.spawn.form import unavailable_why
from tests.unit.test_agent_token_api import ADMIN, hub, hub_config  # noqa: F401 - hub: the fixture
from tests.unit.test_form_template import A100, help_of, radio, render
from tests.unit.test_reports import device, report

MODEL = "NVIDIA A100 80GB PCIe"
REFUSED = "on hosts whose agents' reports are refused (a new agent token not installed yet)"


def agents(*hosts: str, now: float = 0.0) -> GPUCluster:
    """A cluster whose inventory is its agents' reports: one A100 per host, reported at ``now``."""
    cluster = GPUCluster(InventorySettings(sources=("agent",), stale_intervals=3))
    for i, host in enumerate(hosts):
        body = report(device(0, f"GPU-{host}"), hostname=host, interval=15)
        cluster.receive(parse_report(json.dumps(body)), now=now + i * 0.001)
    return cluster


def test_each_unavailable_host_is_named_by_its_cause():
    cluster = agents("gpu-a", "gpu-b", "gpu-c", "gpu-d")
    cluster._schedulable = {"gpu-b", "gpu-c", "gpu-d"}  # the swarm drained gpu-a
    cluster.report_refused("gpu-c", now=10.0)  # its agent's token was replaced
    cluster.apply(now=100.0)  # 100 s later: no accepted report from gpu-b, gpu-c or gpu-d since
    body = report(device(0, "GPU-gpu-d"), hostname="gpu-d", interval=15)
    cluster.receive(parse_report(json.dumps(body)), now=100.0)  # gpu-d reports again
    assert {h: cluster.why_unavailable(h) for h in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")} == {
        "gpu-a": "swarm",
        "gpu-b": "late",
        "gpu-c": "refused",
        "gpu-d": "",
    }
    summary = cluster.allocator.summary()
    assert unavailable_why(cluster, cluster.allocator, summary) == {
        MODEL: "1 on hosts that are down, drained or paused; "
        f"1 {REFUSED}; "
        "1 on hosts whose agents have not reported lately"
    }


def test_a_refusal_older_than_the_last_accepted_report_is_not_the_cause():
    cluster = agents("gpu-c", now=0.0)
    cluster.report_refused("gpu-c", now=5.0)
    body = report(device(0, "GPU-gpu-c"), hostname="gpu-c", interval=15)
    cluster.receive(parse_report(json.dumps(body)), now=6.0)  # the new token works
    cluster.apply(now=100.0)  # and then the agent went quiet
    assert cluster.why_unavailable("gpu-c") == "late"


def test_the_form_says_the_cause_and_a_template_without_it_says_what_it_said():
    """Guards docs/agent.md, "Running, failing, stopping": "the form says its GPUs are on
    hosts whose agents' reports are refused"."""
    why = {A100.model: f"2 {REFUSED}"}
    form = render(unavailable_why=why)
    assert help_of(form, radio(form, A100.model)).endswith(f"free now, up to 2 on one host (2 {REFUSED})")
    form = render()  # an admin's template context without it, or a model not in it
    assert help_of(form, radio(form, A100.model)).endswith("(2 on hosts that are down, drained or paused)")


async def test_a_report_refused_for_a_replaced_token_names_its_node_until_the_new_token_works(hub, tmp_path):  # noqa: F811
    config = hub_config(tmp_path)
    api = await hub(config)
    old = await api.issue("gpu-b")
    assert (await api.report(old, "gpu-b", device(0, "GPU-b0")))[0] == 200
    _, answer = await api("POST", "agent-tokens/gpu-b", ADMIN)  # rotated; the node's file not written yet
    cluster = config.JupyterHub.tornado_settings.get_value({})[KEY].holdings.cluster
    assert "gpu-b" not in cluster.refused
    assert (await api.report(old, "gpu-b", device(0, "GPU-b0")))[0] == 403
    assert "gpu-b" in cluster.refused
    cluster.apply(now=time.monotonic() + 3 * 15 + 1)  # its GPUs are not offered any more
    assert cluster.why_unavailable("gpu-b") == "refused"
    # A refused report naming a host that is not a node changes nothing.
    assert (await api.report(old, "not-a-node", device(0, "GPU-x0")))[0] == 403
    assert "not-a-node" not in cluster.refused
    # The new token in the node's file: its next report is taken, and the refusal forgotten.
    assert (await api.report(answer["token"], "gpu-b", device(0, "GPU-b0")))[0] == 200
    assert "gpu-b" not in cluster.refused and cluster.why_unavailable("gpu-b") == ""
