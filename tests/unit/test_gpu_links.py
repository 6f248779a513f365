"""How the GPUs of a multi-GPU server are linked, as users and admins read it
(cluster/gpu_links.py): on the home page's "Your GPUs" (the real spawner, holdings and
allocator over the in-process Docker fake), in the servers API and on the admin's
/hub/gpus page (the host cards over a cluster fed with agents' reports)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jinja2

from gpuspawner.allocator.allocator import Request
from gpuspawner.cluster.cluster import GPUCluster, InventorySettings
from gpuspawner.cluster.gpu_links import holder_links, links_of, offer_words
from gpuspawner.core.reports import parse_report
from gpuspawner.core.topology import Link, Path, Topology
from gpuspawner.spawn.form import _templates
from gpuspawner.web.api import HostCard, gpu_page
from gpuspawner.web.home_gpus import server_rows, servers_var
from tests.unit.test_cluster_views import TEMPLATES, parse
from tests.unit.test_holdings import A100, World
from tests.unit.test_reports import device, report

THREE = {"gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920, "index": i} for i in range(3)]}
# GPU-b0 and GPU-b1 share two NVLinks on one CPU; GPU-b2 is on the other CPU.
BRIDGED = Topology(
    {
        frozenset(("GPU-b0", "GPU-b1")): Link(Path.CPU, 2),
        frozenset(("GPU-b0", "GPU-b2")): Link(Path.CROSS_CPU, 0),
        frozenset(("GPU-b1", "GPU-b2")): Link(Path.CROSS_CPU, 0),
    }
)


def test_a_servers_links_read_as_its_farthest_pair_with_each_pair_in_the_detail():
    """Guards docs/topology.md, "Where you see it": "how they are linked, by their farthest pair" and
    "with each pair in a detail under it"."""
    gpus = list(enumerate(["GPU-b0", "GPU-b1", "GPU-b2"]))
    three = links_of(BRIDGED, gpus)
    assert three == {
        "summary": "Links: at worst across CPUs (GPU 0–2)",
        "detail": "GPU 0–1: 2 NVLinks, 0–2: across CPUs, 1–2: across CPUs",
        "pairs": [
            {"gpus": [0, 1], "link": "2 NVLinks"},
            {"gpus": [0, 2], "link": "across CPUs"},
            {"gpus": [1, 2], "link": "across CPUs"},
        ],
        "worst": "across CPUs",
    }
    pair = links_of(BRIDGED, gpus[:2])
    assert (pair["summary"], pair["detail"], pair["worst"]) == ("Links: 2 NVLinks (GPU 0–1)", "", "2 NVLinks")
    switch = Topology({frozenset(p): Link(None, 12) for p in [("a", "b"), ("a", "c"), ("b", "c")]})
    alike = links_of(switch, list(enumerate("abc")))
    assert (alike["summary"], alike["detail"]) == ("Links: 12 NVLinks between each pair", "")
    assert links_of(BRIDGED, gpus[:1]) is None and links_of(None, gpus[:1]) is None  # one GPU: no pairs


def test_links_the_node_did_not_report_are_not_known_never_no_link():
    """Guards docs/topology.md, "Where you see it": "Where the node did not report its links, the row
    says" and "never that there is no link"."""
    gpus = list(enumerate(["GPU-b0", "GPU-b1", "GPU-b2"]))
    unreported = links_of(None, gpus)
    assert unreported["summary"] == "Links not known (the node did not report them)"
    assert unreported["worst"] is None and unreported["pairs"] == []
    partly = Topology({frozenset(("GPU-b0", "GPU-b1")): Link(Path.CPU, 2)})  # the other pairs: not found out
    some = links_of(partly, gpus)
    assert some["summary"] == "Links: not known for GPU 0–2" and some["worst"] is None
    assert some["detail"] == "GPU 0–1: 2 NVLinks, 0–2: not known, 1–2: not known"
    assert links_of(Topology(), gpus[:2])["summary"] == "Links not known"
    for found in (unreported, some):
        assert "no link" not in json.dumps(found).lower()


def shown(world, user: str) -> str:
    person = SimpleNamespace(name=user, kind="user")
    page = _templates(()).get_template("gpuspawner_servers.html")
    return " ".join(page.render(gpuspawner_servers=servers_var(world.hub)(person), user=person).split())


async def test_your_gpus_shows_the_links_among_a_servers_gpus_numbered_as_the_server_sees_them(tmp_path):
    """Guards docs/topology.md, "Where you see it": "Your GPUs on the home page, for a server with 2 or
    more GPUs" and "The GPUs are numbered as the server sees them: in the order of its
    NVIDIA_VISIBLE_DEVICES, from 0"."""
    world = World(tmp_path, inventory=THREE, max_gpus_per_user=4)
    world.hub.holdings.allocator.set_host_topology("gpu-b", BRIDGED)
    await world.started(world.spawner("ann", {"gpu_model": A100, "gpu_count": 2}))
    await world.started(world.spawner("bob", {"gpu_model": A100, "gpu_count": 1}))
    [ann] = server_rows(world.hub, "ann")
    assert [d["uuid"] for d in ann["devices"]] == ["GPU-b0", "GPU-b1"]  # the NVLink pair
    assert ann["links"]["summary"] == "Links: 2 NVLinks (GPU 0–1)"
    assert '<div class="small gpu-links">Links: 2 NVLinks (GPU 0–1)</div>' in shown(world, "ann")
    [bob] = server_rows(world.hub, "bob")
    assert bob["links"] is None and "gpu-links" not in shown(world, "bob")  # one GPU: nothing to link

    world.hub.holdings.allocator.set_host_topology("gpu-b", None)  # an agent that no longer says
    assert server_rows(world.hub, "ann")[0]["links"]["summary"] == "Links not known (the node did not report them)"


async def test_a_scattered_server_shows_its_farthest_pair_and_each_pair_in_a_detail(tmp_path):
    world = World(tmp_path, inventory=THREE, max_gpus_per_user=4)
    world.hub.holdings.allocator.set_host_topology("gpu-b", BRIDGED)
    await world.started(world.spawner("ann", {"gpu_model": A100, "gpu_count": 3}))
    html = shown(world, "ann")
    assert (
        '<details class="small gpu-links"><summary>Links: at worst across CPUs (GPU 0–2)</summary> '
        "GPU 0–1: 2 NVLinks, 0–2: across CPUs, 1–2: across CPUs</details>"
    ) in html


async def test_an_admins_card_names_each_holder_of_several_gpus_with_their_links():
    """Guards docs/topology.md, "Where you see it": "The admin's GPU page (/hub/gpus) says the same under
    each host's card for each holder of several of its GPUs, numbered there by their index on the node"."""
    c = GPUCluster(InventorySettings(sources=("agent",)))
    devices = [device(i, f"GPU-a{i}") for i in range(4)]
    pairs = [("GPU-a1", "GPU-a2", 40, 2), ("GPU-a1", "GPU-a3", 50, 0), ("GPU-a2", "GPU-a3", 50, 0)]
    topology = {"links": [{"a": a, "b": b, "path": p, "nvlinks": n} for a, b, p, n in pairs], "numa": {}}
    c.receive(parse_report(json.dumps({**report(*devices, hostname="gpu-a"), "topology": topology})), now=0.0)
    c.allocator.allocate("jupyter-ann", Request(model=A100, count=1, host="gpu-a", owner="ann"))
    c.allocator.allocate("jupyter-bob", Request(model=A100, count=3, host="gpu-a", owner="<b>ob"))

    card = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True).get_template("gpus_host.html")
    page = jinja2.Environment(loader=jinja2.DictLoader({"p": "{{ hosts }}"}), autoescape=True, enable_async=True)
    _, cards, _ = await gpu_page(c, lambda **ns: page.get_template("p").render_async(**ns), card)
    html = b"".join(cards).decode()
    [holder] = parse(html).find_all("div", class_="gpu-holder-links")
    assert holder.attrs["data-user"] == "<b>ob"  # ann holds one GPU: nothing to link
    assert "<b>ob" not in html and "&lt;b&gt;ob, GPUs #1, #2, #3:" in html  # the name escaped
    assert holder.text == (
        "<b>ob, GPUs #1, #2, #3: Links: at worst across CPUs (GPU 1–3)"
        " GPU 1–2: 2 NVLinks, 1–3: across CPUs, 2–3: across CPUs"
    )
    entries = json.loads(await c.views.alloc_map_json())["gpu-a"]  # what the card is made from
    assert [g["gpus"] for g in holder_links(entries, c.allocator.topology("gpu-a"))] == [[1, 2, 3]]
    assert HostCard(card, c.allocator.topology) == HostCard(card, c.allocator.topology)  # cards are kept

    c.receive(parse_report(json.dumps(report(*devices, hostname="gpu-a"))), now=1.0)  # its agent no longer says
    _, cards, _ = await gpu_page(c, lambda **ns: page.get_template("p").render_async(**ns), card)
    [holder] = parse(b"".join(cards).decode()).find_all("div", class_="gpu-holder-links")
    assert holder.text == "<b>ob, GPUs #1, #2, #3: Links not known (the node did not report them)"


def test_what_a_count_gets_now_is_said_by_the_host_and_the_link_of_its_farthest_pair():
    a100 = "NVIDIA A100 80GB PCIe"
    assert offer_words(a100, 2, "gpu-7", Link(Path.CPU, 2)) == f"2 × {a100}: an NVLink pair free on gpu-7 (2 NVLinks)"
    assert offer_words("V100", 4, "gpu-a", Link(Path.CROSS_CPU, 1)) == (
        "4 × V100: 4 all joined by NVLink free on gpu-a (at least 1 NVLink between each pair)"
    )
    assert offer_words("A6000", 2, "gpu-b", Link(Path.CROSS_CPU, 0)) == (
        "2 × A6000: a pair free on gpu-b, across CPUs, without NVLink"
    )
    assert offer_words("A6000", 4, "gpu-b", Link(Path.CROSS_CPU, 0)) == (
        "4 × A6000: 4 free on gpu-b, not all joined by NVLink: at worst across CPUs"
    )
    assert offer_words("A6000", 2, "gpu-b", Link(Path.SWITCH, None)) == (
        "2 × A6000: a pair free on gpu-b, behind one PCIe switch (NVLinks not known)"
    )
    for link in (None, Link(), Link(None, 0)):  # not reported, or not found out: never "no link"
        assert offer_words("A6000", 2, "gpu-b", link) == "2 × A6000: 2 free on gpu-b, links not known"


async def test_the_form_says_what_each_count_of_a_model_gets_now(tmp_path):
    """Guards docs/topology.md, "Where you see it": "The spawn form says, for the model and the count of 2
    or more chosen, what such a request gets now" and "shown with the page for the choice it starts
    with, and for each choice made"."""
    four = {"gpu-b": [{"uuid": f"GPU-b{i}", "model": A100, "memory_mib": 81920, "index": i} for i in range(4)]}
    bridged = Topology(
        {
            frozenset((f"GPU-b{a}", f"GPU-b{b}")): Link(Path.CPU, 2)
            if {a, b} in ({0, 2}, {1, 3})
            else Link(Path.CROSS_CPU, 0)
            for a in range(4)
            for b in range(a + 1, 4)
        }
    )
    world = World(tmp_path, inventory=four, max_gpus_per_user=3)
    world.hub.holdings.allocator.set_host_topology("gpu-b", bridged)
    html = await world.spawner("ann", {"gpu_model": A100, "gpu_count": 2})._render_options_form()
    form = parse(html)
    [a100] = form.find_all("input", name="gpu_model", value=A100)
    assert json.loads(a100.attrs["data-offers"]) == {  # counts up to her limit of 3
        "2": f"2 × {A100}: an NVLink pair free on gpu-b (2 NVLinks)",
        "3": f"3 × {A100}: 3 free on gpu-b, not all joined by NVLink: at worst across CPUs",
    }
    offer = form.by_id("gpu-offer")  # her last choice, 2 of them: its line, without the script
    assert "hidden" not in offer.attrs and offer.text == f"2 × {A100}: an NVLink pair free on gpu-b (2 NVLinks)"
    assert "hidden" in parse(await world.spawner("bob")._render_options_form()).by_id("gpu-offer").attrs

    await world.started(world.spawner("cy", {"gpu_model": A100, "gpu_count": 1}))  # GPU-b0: the pair 0–2 is broken
    [a100] = parse(await world.spawner("ann")._render_options_form()).find_all("input", name="gpu_model", value=A100)
    assert json.loads(a100.attrs["data-offers"])["2"] == f"2 × {A100}: an NVLink pair free on gpu-b (2 NVLinks)"
    await world.started(world.spawner("dee", {"gpu_model": A100, "gpu_count": 1}))  # and GPU-b1: b2 and b3 are left
    [a100] = parse(await world.spawner("ann")._render_options_form()).find_all("input", name="gpu_model", value=A100)
    assert json.loads(a100.attrs["data-offers"]) == {
        "2": f"2 × {A100}: a pair free on gpu-b, across CPUs, without NVLink"
    }

    world.hub.holdings.allocator.set_host_topology("gpu-b", None)
    [a100] = parse(await world.spawner("ann")._render_options_form()).find_all("input", name="gpu_model", value=A100)
    assert json.loads(a100.attrs["data-offers"]) == {"2": f"2 × {A100}: 2 free on gpu-b, links not known"}
