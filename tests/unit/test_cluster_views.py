"""The admin views of the cluster (allocation map, its JSON, the GPU page's host
cards, the metrics) are made per host and kept: what changes shows in the next
request, what did not change is not made again (pure: reports go in as the
hub's endpoint hands them over)."""

from __future__ import annotations

import asyncio
import json
import os

import jinja2
from tornado.escape import json_encode

from gpuspawner import metrics
from gpuspawner.allocator.allocator import Request
from gpuspawner.cluster import host_views as views
from gpuspawner.cluster.cluster import GPUCluster, InventorySettings
from gpuspawner.cluster.host_views import batches, host_json, join_json
from gpuspawner.core.reports import parse_report
from gpuspawner.web.api import gpu_page
from tests.unit.test_form_template import Node, _TreeBuilder
from tests.unit.test_reports import A100, device, report

GTX = "NVIDIA GeForce GTX 1070"
HOSTS = ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
SHARING = {"*": {"quantum": 0.05, "split": True}}
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(metrics.__file__)), "templates")


def devices_of(host: str, sick: int | None = None, n: int = 2, **extra) -> list[dict]:
    return [device(i, f"GPU-{host}-{i}", ecc_uncorrected=3 if i == sick else 0, **extra) for i in range(n)]


def send(cluster: GPUCluster, host: str, devices: list[dict], now: float = 0.0) -> None:
    cluster.receive(parse_report(json.dumps(report(*devices, hostname=host))), now=now)


def named_holders(c: GPUCluster, names: dict[str, tuple[str, str]]):
    """Holders named by user and server, as the hub's holdings name them (a
    small stand-in: here the names are a dict the test writes)."""

    def holders_of(uuid: str) -> list[dict]:
        booked = c.allocator.booked_on(uuid)
        return [{"user": names[h][0], "server": names[h][1], "share": m / 1000} for h, m in booked.items()]

    return holders_of


def served_map(c: GPUCluster) -> dict:
    """The allocation map as the hub serves it: its JSON, read back (outside an event loop)."""
    return json.loads(asyncio.run(c.views.alloc_map_json()))


def map_afresh(c: GPUCluster, holders_of) -> dict:
    """The whole map made afresh from the cluster's device states: what the kept parts must add up to."""
    return {
        host: views.host_entries(states.values(), {u: holders_of(u) for u in states}, c.stale.get(host))
        for host, states in sorted(c.states.items())
        if states
    }


def fleet(**settings) -> GPUCluster:
    c = GPUCluster(InventorySettings(sources=("agent",), **settings))
    c.allocator.set_sharing(SHARING)
    c.servers = {}  # holder -> (user, server), for named_holders
    c.views.holders_of = named_holders(c, c.servers)
    for host in HOSTS:
        send(c, host, devices_of(host))
    return c


def parse(html: str) -> Node:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    assert builder.current is builder.root, "an element was left open"
    return builder.root


def book(c: GPUCluster, holder: str, request: Request) -> None:
    """As the spawner books: the allocation, then the holder's user and server."""
    c.allocator.allocate(holder, request)
    c.servers[holder] = (request.owner, "lab")


def gauges(c: GPUCluster) -> dict[tuple[str, str, str], float]:
    collector = metrics.DeviceGauges(lambda: c, per_host=lambda: True)
    return {(f.name, s.labels["host"], s.labels["model"]): s.value for f in collector.collect() for s in f.samples}


async def test_the_json_is_byte_for_byte_what_tornado_makes_of_the_map():
    c = fleet(stale_intervals=3)
    book(c, "jupyter-ann", Request(model=A100, count=2, host="gpu-a", owner="ann"))
    book(c, "jupyter-bob", Request(milli=250, host="gpu-b", owner="bob"))
    book(c, "jupyter-cy", Request(milli=500, host="gpu-b", owner="cy"))
    send(c, "gpu-c", devices_of("gpu-c", sick=1) + [{"index": 2, "uuid": None, "lost": True}], now=0)
    send(c, "gpu-d", devices_of("gpu-d"), now=-100)
    c.apply(now=0)  # gpu-d is late
    assert set(c.stale) == {"gpu-d"}
    expected = json_encode(map_afresh(c, c.views.holders_of)).encode()
    assert await c.views.alloc_map_json() == expected
    assert (
        await c.views.alloc_map_json(holders_of=lambda uuid: []) == json_encode(map_afresh(c, lambda uuid: [])).encode()
    )
    m = json.loads(expected)
    assert m["gpu-a"]["GPU-gpu-a-0"]["holders"] == [{"user": "ann", "server": "lab", "share": 1.0}]
    assert m["gpu-b"]["GPU-gpu-b-0"]["allocated"] == 0.75
    assert [h["user"] for h in m["gpu-b"]["GPU-gpu-b-0"]["holders"]] == ["bob", "cy"]
    assert m["gpu-c"]["GPU-gpu-c-1"]["health"] == "unhealthy"
    assert m["gpu-d"]["GPU-gpu-d-0"]["health"] == "stale"
    assert await GPUCluster(InventorySettings(sources=("agent",))).views.alloc_map_json() == b"{}"


def test_json_parts_escape_as_tornado_does_and_batches_keep_every_byte():
    entries = {"GPU-x": {"problems": ["</script>"], "holders": []}}
    assert join_json([host_json("h</", entries)]) == json_encode({"h</": entries}).encode()
    chunks = [bytes([i % 256]) * (i * 37) for i in range(200)]
    pieces = list(batches(chunks, size=4096))
    assert b"".join(pieces) == b"".join(chunks) and max(len(p) for p in pieces[:-1]) < 4096 + 200 * 37


def test_the_metrics_count_what_the_map_shows():
    c = fleet(stale_intervals=3)
    book(c, "jupyter-ann", Request(model=A100, count=2, host="gpu-a", owner="ann"))
    book(c, "jupyter-bob", Request(milli=350, host="gpu-b", owner="bob"))
    send(c, "gpu-c", devices_of("gpu-c", sick=1), now=0)
    send(c, "gpu-d", devices_of("gpu-d"), now=-100)
    c.apply(now=0)
    expected = {}
    for host, devices in served_map(c).items():
        for d in devices.values():
            labels = (host, d["model"])
            for name, value in (
                ("gpuspawner_devices", 1),
                ("gpuspawner_devices_unhealthy", d["health"] != "ok"),
                ("gpuspawner_devices_free", d["health"] == "ok" and not d["holders"]),
                ("gpuspawner_allocated_share", d["allocated"]),
            ):
                expected[(name, *labels)] = expected.get((name, *labels), 0) + value
    assert gauges(c) == expected
    # By default one series per model: the same counts, summed over the hosts.
    per_model: dict[tuple[str, str], float] = {}
    for (name, _host, model), value in expected.items():
        per_model[(name, model)] = per_model.get((name, model), 0) + value
    families = list(metrics.DeviceGauges(lambda: c).collect())
    assert {(f.name, s.labels["model"]): s.value for f in families for s in f.samples} == per_model
    assert all(set(s.labels) == {"model"} for f in families for s in f.samples)
    assert len({model for _, model in per_model}) < len({host for _, host, _ in expected})  # fewer series


async def test_a_report_that_changes_health_shows_in_the_next_map_and_metrics():
    c = fleet()
    await c.views.alloc_map_json()
    assert gauges(c)[("gpuspawner_devices_unhealthy", "gpu-b", A100)] == 0
    send(c, "gpu-b", devices_of("gpu-b", sick=0))
    m = json.loads(await c.views.alloc_map_json())
    assert m["gpu-b"]["GPU-gpu-b-0"]["problems"] == ["3 uncorrected ECC errors"]
    g = gauges(c)
    assert g[("gpuspawner_devices_unhealthy", "gpu-b", A100)] == 1
    assert g[("gpuspawner_devices_free", "gpu-b", A100)] == 1
    assert sum(v for (name, _, model), v in g.items() if name == "gpuspawner_devices_unhealthy" and model == A100) == 1
    send(c, "gpu-b", devices_of("gpu-b"))
    assert json.loads(await c.views.alloc_map_json())["gpu-b"]["GPU-gpu-b-0"]["health"] == "ok"
    g = gauges(c)
    assert not any(v for (name, *_), v in g.items() if name == "gpuspawner_devices_unhealthy")


async def test_an_allocation_or_release_on_a_host_shows_in_the_next_map_and_metrics():
    c = fleet()
    await c.views.alloc_map_json()
    gauges(c)
    book(c, "jupyter-ann", Request(model=A100, count=1, host="gpu-c", owner="ann"))
    book(c, "jupyter-bob", Request(milli=300, host="gpu-c", owner="bob"))
    m = json.loads(await c.views.alloc_map_json())["gpu-c"]
    assert m["GPU-gpu-c-0"]["holders"] == [{"user": "ann", "server": "lab", "share": 1.0}]
    assert m["GPU-gpu-c-1"]["allocated"] == 0.3
    g = gauges(c)
    assert g[("gpuspawner_devices_free", "gpu-c", A100)] == 0
    assert g[("gpuspawner_allocated_share", "gpu-c", A100)] == 1.3
    c.allocator.release("jupyter-ann")
    assert json.loads(await c.views.alloc_map_json())["gpu-c"]["GPU-gpu-c-0"]["holders"] == []
    assert gauges(c)[("gpuspawner_devices_free", "gpu-c", A100)] == 1


async def test_only_the_hosts_that_changed_are_made_again():
    c = fleet()
    made: list[str] = []

    def card(host, entries, stale):
        made.append(host)
        return host

    def counts_made() -> int:
        c.views.device_counts()
        return c.views.caches["counts"].made

    assert await c.views.host_views("cards", card) == HOSTS and sorted(made) == HOSTS
    await c.views.alloc_map_json()
    assert counts_made() == 4 and c.views.caches["json"].made == 4
    made.clear()

    await c.views.host_views("cards", card)
    await c.views.alloc_map_json()
    assert made == [] and c.views.caches["json"].made == 4 and counts_made() == 4  # nothing changed

    send(c, "gpu-a", devices_of("gpu-a", temperature_c=60))  # new readings only
    await c.views.host_views("cards", card)
    await c.views.alloc_map_json()
    assert made == ["gpu-a"] and c.views.caches["json"].made == 5
    assert counts_made() == 4  # the metrics do not show readings

    send(c, "gpu-a", devices_of("gpu-a", sick=1, temperature_c=60))  # health
    assert counts_made() == 5
    await c.views.host_views("cards", card)

    book(c, "jupyter-ann", Request(model=A100, host="gpu-b", owner="ann"))  # a holding
    made.clear()
    await c.views.host_views("cards", card)
    assert made == ["gpu-b"] and counts_made() == 6

    c.allocator.release("jupyter-ann")
    made.clear()
    await c.views.host_views("cards", card)
    assert made == ["gpu-b"] and counts_made() == 7

    c._schedulable = set(HOSTS) - {"gpu-d"}  # the swarm drains gpu-d: its free count changes, not its map
    c._update_availability()
    made.clear()
    await c.views.host_views("cards", card)
    assert made == [] and counts_made() == 8
    assert gauges(c)[("gpuspawner_devices_free", "gpu-d", A100)] == 0


async def test_a_late_node_shows_stale_and_is_made_again_when_it_reports():
    c = fleet(stale_intervals=3)
    for host in HOSTS:
        send(c, host, devices_of(host), now=100)
    await c.views.alloc_map_json()
    before = c.views.caches["json"].made
    c.apply(now=150)  # every node is late
    m = json.loads(await c.views.alloc_map_json())
    assert {d["health"] for devices in m.values() for d in devices.values()} == {"stale"}
    assert m["gpu-a"]["GPU-gpu-a-0"]["problems"] == ["no report from its agent for 50 s"]
    assert gauges(c)[("gpuspawner_devices_unhealthy", "gpu-a", A100)] == 2
    send(c, "gpu-a", devices_of("gpu-a"), now=151)
    m = json.loads(await c.views.alloc_map_json())
    assert m["gpu-a"]["GPU-gpu-a-0"]["health"] == "ok" and m["gpu-b"]["GPU-gpu-b-0"]["health"] == "stale"
    assert c.views.caches["json"].made == before + 4 + 4  # the late seconds are in every late host's problems


async def test_holders_are_an_input_with_a_change_signal():
    c = fleet()
    book(c, "jupyter-ann", Request(model=A100, host="gpu-a", owner="ann"))
    await c.views.alloc_map_json()
    c.servers["jupyter-ann"] = ("ann", "renamed")  # not a booking: the allocator cannot tell
    assert "renamed" not in (await c.views.alloc_map_json()).decode()
    c.views.holders_changed("gpu-a")
    assert "renamed" in (await c.views.alloc_map_json()).decode() and c.views.caches["json"].made == 5

    names = {"GPU-gpu-c-1": [{"user": "x", "server": "", "share": 0.5}]}

    def holders(uuid):
        return names.get(uuid, [])

    m = json.loads(await c.views.alloc_map_json(holders))  # another source: every host afresh
    assert c.views.caches["json"].made == 9
    assert m["gpu-c"]["GPU-gpu-c-1"]["holders"] == names["GPU-gpu-c-1"] and m["gpu-a"]["GPU-gpu-a-0"]["holders"] == []
    await c.views.alloc_map_json(holders)
    assert c.views.caches["json"].made == 9
    names["GPU-gpu-c-1"][0]["user"] = "y"
    c.views.holders_changed()
    assert json.loads(await c.views.alloc_map_json(holders))["gpu-c"]["GPU-gpu-c-1"]["holders"][0]["user"] == "y"
    assert gauges(c)[("gpuspawner_allocated_share", "gpu-a", A100)] == 1  # the metrics' own source: the cluster's


async def test_parts_made_in_a_thread_are_the_parts_made_inline():
    c = fleet()
    book(c, "jupyter-ann", Request(milli=500, host="gpu-a", owner="ann"))
    threaded = await c.views.host_views("t", host_json, inline=0)
    inline = await c.views.host_views("i", host_json, inline=100)
    assert threaded == inline and join_json(threaded) == await c.views.alloc_map_json()


async def test_the_gpu_page_shows_each_host_card_and_what_changed():
    loader = jinja2.ChoiceLoader(
        [
            jinja2.DictLoader({"page.html": "<html><body><main>{% block main %}{% endblock %}</main></body></html>"}),
            jinja2.FileSystemLoader(TEMPLATES),
        ]
    )
    page_env = jinja2.Environment(loader=loader, autoescape=True, enable_async=True)
    card = jinja2.Environment(loader=loader, autoescape=True).get_template("gpus_host.html")

    async def render(c):
        def render_page(**ns):
            return page_env.get_template("gpus.html").render_async(base_url="/hub/", **ns)

        head, cards, tail = await gpu_page(c, render_page, card)
        return parse(b"".join([head.encode(), *cards, tail.encode()]).decode())

    empty = await render(GPUCluster(InventorySettings(sources=("agent",))))
    assert "No GPUs are known" in empty.text

    c = fleet(stale_intervals=3)
    book(c, "jupyter-ann", Request(model=A100, host="gpu-a", owner="ann"))
    page = await render(c)
    assert "No GPUs are known" not in page.text
    assert [n.attrs["data-uuid"] for n in page.find_all("li")] == [f"GPU-{h}-{i}" for h in HOSTS for i in (0, 1)]
    assert [n.attrs["id"] for n in page.find_all("h2")] == [f"host-{h}" for h in HOSTS]
    assert "ann/lab (1.00)" in page.find_all("li")[0].text
    send(c, "gpu-d", devices_of("gpu-d", sick=1), now=-100)
    c.apply(now=0)
    page = await render(c)
    assert "no report from its agent for 100 s" in page.find_all("h2")[3].text
    assert "unhealthy: 3 uncorrected ECC errors; no report from its agent for 100 s" in page.find_all("li")[7].text


async def test_warm_counts_makes_every_hosts_counts_giving_way_so_the_first_scrape_makes_none(monkeypatch):
    from gpuspawner.cluster import views as cluster_views
    from gpuspawner.core.inventory import GPU

    hosts = [f"n{i:03}" for i in range(2 * cluster_views.HOSTS_PER_STEP + 10)]
    c = GPUCluster(InventorySettings(static=tuple(GPU(h, f"GPU-{h}", A100, 81920, 0) for h in hosts)))
    seen = []

    async def other_work():
        await asyncio.sleep(0)
        seen.append(warming.done())

    warming = asyncio.ensure_future(c.views.warm_counts())
    await asyncio.gather(warming, other_work())
    assert seen == [False]  # other work ran while the hosts were counted

    def made_again(*args):
        raise AssertionError("a host's counts were made again")

    monkeypatch.setattr(views, "host_counts", made_again)
    families = list(metrics.DeviceGauges(lambda: c).collect())
    assert {(f.name, s.value) for f in families for s in f.samples if f.name == "gpuspawner_devices"} == {
        ("gpuspawner_devices", len(hosts))
    }
