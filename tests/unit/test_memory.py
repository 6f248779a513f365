"""A share's GPU memory (gpuspawner/core/memory.py, pure, with a fake clock), and its
policing by the hub's reclaimer over the real spawner, holdings and SQLite ledger on
the in-process Docker fake (reports as a node agent sends them)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import jinja2
import pytest
from prometheus_client import REGISTRY

from gpuspawner.cli import format_alloc_map, format_usage
from gpuspawner.core.memory import DeviceMemory, MemoryPolicy, MemoryWatch, over
from gpuspawner.core.reports import parse_report
from gpuspawner.core.sharing import SharingPolicy, entitled_mib
from gpuspawner.ledger.ledger import Ledger
from gpuspawner.web.api import HostCard
from gpuspawner.web.home_gpus import server_rows, servers_var
from tests.unit.test_cluster_views import TEMPLATES
from tests.unit.test_holdings import A100, World, driven
from tests.unit.test_hubconfig import hub  # noqa: F401 - a fixture: the hub, as configure(c) makes it
from tests.unit.test_reclaim import TWO_GPUS, Clock, two_servers, uuid_of
from tests.unit.test_reports import device, report

GIB = 1024
STOP = MemoryPolicy("stop", tolerance=0.05, grace=120)


def test_a_share_comes_with_its_part_of_the_devices_memory():
    assert entitled_mib(81920, 1000) == 81920
    assert entitled_mib(81920, 250) == 20480
    assert entitled_mib(16160, 333) == 5381  # rounded down: never more than the share


def test_over_means_above_the_entitlement_by_more_than_the_tolerance_and_unknown_use_is_not_over():
    at = DeviceMemory("GPU-0", 20480, 20480)
    within = DeviceMemory("GPU-0", 21504, 20480)  # exactly 5 % above
    above = DeviceMemory("GPU-0", 21505, 20480)
    unknown = DeviceMemory("GPU-0", None, 20480)
    assert over([at, within, unknown], 0.05) == []
    assert over([at, within, above], 0.05) == [above]
    assert over([within], 0.0) == [within]
    # A holder spanning two devices: over on the one where it uses more than its piece there.
    spans = [DeviceMemory("GPU-0", 10 * GIB, 40 * GIB), DeviceMemory("GPU-1", 41 * GIB, 40 * GIB)]
    assert [d.uuid for d in over(spans, 0.0)] == ["GPU-1"]


def test_a_stop_is_due_only_after_the_grace_period_on_a_fresh_reading_and_going_under_resets_it():
    clock = Clock()
    watch = MemoryWatch(clock, stale=60)
    big = [DeviceMemory("GPU-0", 30 * GIB, 20 * GIB)]
    watch.observe("a", big, STOP)
    assert watch.stop_at("a", STOP) == clock.now + 120 and not watch.due("a", STOP)
    clock.now += 119
    watch.observe("a", big, STOP)
    assert not watch.due("a", STOP)
    clock.now += 1
    assert watch.due("a", STOP)
    assert not watch.due("a", MemoryPolicy("warn")) and watch.stop_at("a", MemoryPolicy("warn")) is None
    clock.now += 61  # the last reading is stale: nothing is stopped on it
    assert not watch.due("a", STOP)
    watch.observe("a", [DeviceMemory("GPU-0", 19 * GIB, 20 * GIB)], STOP)  # under again
    assert watch.stop_at("a", STOP) is None and watch.over_devices("a") == ()
    watch.observe("a", big, STOP)  # over again: the grace starts anew
    assert watch.stop_at("a", STOP) == clock.now + 120


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"memory": "kill"}, "memory must be one of 'report', 'warn', 'stop', got 'kill'"),
        ({"memory_tolerance": -0.1}, "memory_tolerance must be a fraction from 0 to 1"),
        ({"memory_tolerance": "5%"}, "memory_tolerance must be a fraction from 0 to 1"),
        ({"memory_grace": 10**400}, "memory_grace must be seconds from 0 to 604800"),
        ({"memory_grace": float("nan")}, "memory_grace must be seconds from 0 to 604800"),
    ],
)
def test_bad_memory_settings_are_refused_naming_the_model_and_key(entry, message):
    with pytest.raises(ValueError) as exc:
        SharingPolicy.parse({"A100": {"quantum": 0.25, **entry}})
    assert str(exc.value).startswith("gpu_sharing['A100']: ") and message in str(exc.value)


def test_the_defaults_report_only():
    assert SharingPolicy.parse({"A100": {"quantum": 0.25}}).for_model("A100").memory == MemoryPolicy(
        "report", 0.05, 300
    )


# -- the hub's reclaimer: two holders of halves of one A100 (40 GiB each) -------------


def on_gpu_b0(processes: list[tuple[str | None, int | None]]):
    """A report of gpu-b where GPU-b0 runs these (service, MiB) processes (None: not traced)."""
    procs = [
        {"pid": 100 + n, "used_mib": mib, "holder": {"service": s} if s else None}
        for n, (s, mib) in enumerate(processes)
    ]
    devices = [device(0, "GPU-b0", utilization_gpu=50, processes=procs), device(1, "GPU-b1")]
    return parse_report(json.dumps(report(*devices)))


async def test_the_holder_above_its_share_is_told_at_once_and_stopped_after_the_grace_its_neighbour_never(tmp_path):
    world, owner, found, clock, stopped = await two_servers(
        tmp_path, shares=0.5, memory={"memory": "stop", "memory_grace": 120}
    )
    a_name, a_gpu = uuid_of(owner, "alice")
    b_name, b_gpu = uuid_of(owner, "bob")
    assert a_gpu == b_gpu == "GPU-b0"
    load = [(a_name, 50 * GIB), (b_name, 10 * GIB), (None, 15 * GIB)]  # and a process nobody holds
    found.observe(on_gpu_b0(load))
    await found.check()
    [notice] = found.notices_for("alice")
    assert notice["reason"] == "memory" and notice["seconds_left"] == 120
    assert notice["message"] == (
        "Your default server uses more GPU memory than its share: 50.0 GiB on GPU-b0, where its share "
        "comes with 40.0 GiB. It will be stopped at 2023-11-14T23:38:40Z unless it uses less by then."
    )
    assert found.notices_for("bob") == []  # within its share, whatever its neighbour does
    # Her home page (and JupyterLab's status bar) lists what would stop the server, soonest first.
    assert server_rows(world.hub, "alice")[0]["stops"] == [
        "memory limit in 2 min unless it uses less GPU memory",
        "idle limit: after 60 s without GPU use",
    ]
    assert REGISTRY.get_sample_value("gpuspawner_holders_over_memory", {"model": A100}) == 1
    alloc_map = json.loads(await owner.cluster.views.alloc_map_json())  # as GET /alloc-map answers
    [holders] = [d["holders"] for d in alloc_map["gpu-b"].values() if d["holders"]]
    mine = {h["user"]: (h["used_mib"], h["entitled_mib"], h["memory_over"]) for h in holders}
    assert mine == {"alice": (50 * GIB, 40 * GIB, True), "bob": (10 * GIB, 40 * GIB, False)}
    table = format_alloc_map(alloc_map)  # gpuspawner alloc-map
    assert "alice (0.50) 50.0/40.0 GiB OVER, bob (0.50) 10.0/40.0 GiB" in table
    card = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True).get_template("gpus_host.html")
    (html,) = await owner.cluster.views.host_views("html", HostCard(card))  # the /hub/gpus page
    badges = re.findall(r'(\w+) \(0\.50\) <span class="badge ([\w-]+)"[^>]*>([^<]*)</span>', html.decode())
    assert badges == [
        ("alice", "text-bg-danger", "50.0 / 40.0 GiB over its share"),
        ("bob", "text-bg-light", "10.0 / 40.0 GiB"),
    ]
    for _ in range(11):  # 110 s, still over: not yet
        clock.now += 10
        found.observe(on_gpu_b0(load))
        await found.check()
    assert stopped == []
    clock.now += 10
    found.observe(on_gpu_b0(load))
    await found.check()
    assert stopped == [("alice", "memory")] and owner.get(b_name) is not None
    [closed] = Ledger(world.db_url).history(user="alice")
    assert closed.end_reason == "memory"


async def test_using_less_within_the_grace_cancels_the_stop_and_a_stale_reading_stops_nothing(tmp_path):
    world, owner, found, clock, stopped = await two_servers(
        tmp_path, shares=0.5, memory={"memory": "stop", "memory_grace": 60}
    )
    a_name, _ = uuid_of(owner, "alice")
    found.observe(on_gpu_b0([(a_name, 45 * GIB)]))
    await found.check()
    assert found.notices_for("alice")
    clock.now += 30
    found.observe(on_gpu_b0([(a_name, 41 * GIB)]))  # 2.5 % above: within the tolerance
    await found.check()
    assert found.notices_for("alice") == []
    found.observe(on_gpu_b0([(a_name, 45 * GIB)]))
    clock.now += 200  # over since then, but no report since: nothing is stopped on old news
    await found.check()
    assert stopped == [] and found.notices_for("alice")[0]["seconds_left"] == 0


async def test_under_warn_the_holder_is_told_and_never_stopped_and_report_only_shows_the_figures(tmp_path):
    world, owner, found, clock, stopped = await two_servers(tmp_path, shares=0.5, memory={"memory": "warn"})
    a_name, _ = uuid_of(owner, "alice")
    b_name, _ = uuid_of(owner, "bob")
    for _ in range(60):
        clock.now += 10
        found.observe(on_gpu_b0([(a_name, 60 * GIB), (b_name, GIB)]))
        await found.check()
    [notice] = found.notices_for("alice")
    assert notice["stop_at"] is None and notice["message"].endswith(
        "Other holders of the GPU may run out of memory; please use less."
    )
    assert stopped == []
    found.memory_policy = lambda h: MemoryPolicy("report")
    assert found.notices_for("alice") == []


async def test_each_holdings_peak_memory_goes_to_the_ledger_and_its_usage(tmp_path):
    world, owner, found, clock, stopped = await two_servers(tmp_path, shares=0.5)
    a_name, _ = uuid_of(owner, "alice")
    b_name, _ = uuid_of(owner, "bob")
    for a, b in [(10 * GIB, GIB), (30 * GIB, GIB), (20 * GIB, 2 * GIB)]:
        clock.now += 10
        found.observe(on_gpu_b0([(a_name, a), (b_name, b)]))
        await found.check()
    peaks = {r.user: r.peak_memory_mib for r in Ledger(world.db_url).open_allocations()}
    assert peaks == {"alice": 30 * GIB, "bob": 2 * GIB}
    usage = Ledger(world.db_url).usage()
    assert {u.key: u.peak_memory_mib for u in usage} == peaks
    shown = {"by": "user", "since": None, "until": None, "usage": [u._asdict() for u in usage]}
    lines = format_usage(shown).splitlines()
    assert lines[1].split() == ["USER", "GPU-HOURS", "PEAK", "GPU", "MEMORY"]
    assert lines[2].split()[0] == "alice" and lines[2].endswith("30.0 GiB")  # gpuspawner usage


async def test_a_peak_seen_before_a_server_started_again_under_its_name_is_not_the_new_ones(tmp_path):
    world, owner, found, clock, stopped = await two_servers(tmp_path, shares=0.5)
    a_name, _ = uuid_of(owner, "alice")
    found.observe(on_gpu_b0([(a_name, 30 * GIB)]))  # pending until the next check
    alice = world.spawner("alice", {"gpu_model": A100, "gpu_share": 0.5})
    await driven(alice.stop(), world.fake.exit_all)
    await world.started(world.spawner("alice", {"gpu_model": A100, "gpu_share": 0.5}))  # the same name again
    await found.check()
    rows = {(r.user, r.ended_at is None): r.peak_memory_mib for r in Ledger(world.db_url).history(user="alice")}
    assert rows == {("alice", False): None, ("alice", True): None}
    found.observe(on_gpu_b0([(a_name, 12)]))  # the new server's own, however small
    await found.check()
    assert {r.user: r.peak_memory_mib for r in Ledger(world.db_url).open_allocations()}.get("alice") == 12


async def test_a_peak_the_ledger_could_not_take_is_written_at_a_later_check(tmp_path, monkeypatch):
    from tests.unit.test_holdings import ledger_down  # noqa: PLC0415

    world, owner, found, clock, stopped = await two_servers(tmp_path, shares=0.5)
    a_name, _ = uuid_of(owner, "alice")
    found.observe(on_gpu_b0([(a_name, 30 * GIB)]))
    with monkeypatch.context() as m:
        m.setattr(Ledger, "note_peak_memory", ledger_down)
        await found.check()  # the database is down for a moment: logged, kept
    assert {r.user: r.peak_memory_mib for r in Ledger(world.db_url).open_allocations()}["alice"] is None
    await found.check()
    assert {r.user: r.peak_memory_mib for r in Ledger(world.db_url).open_allocations()}["alice"] == 30 * GIB


async def test_the_spawn_page_shows_a_share_holder_its_servers_gpu_memory_in_use_and_entitlement(tmp_path, hub):  # noqa: F811
    """Opening the spawn page (here for another named server), a holder of a share sees
    what its running server uses against what its share comes with, as on its home page:
    the hub's own spawn.html, with the template variables configure(c) gives the hub."""
    world, owner, found, clock, stopped = await two_servers(tmp_path, shares=0.5)
    a_name, a_gpu = uuid_of(owner, "alice")
    world.hub.holdings.cluster.receive(on_gpu_b0([(a_name, 30 * GIB)]))  # the node's latest report
    alice = SimpleNamespace(
        name="alice", kind="user", json_escaped_name="alice", spawner=SimpleNamespace(options_form="")
    )
    assert {"gpuspawner_notices", "gpuspawner_servers"} <= set(hub.template_vars)  # what configure(c) gives
    values = {  # this world's hub's, as JupyterHub's handlers fill them in: called with the user
        "gpuspawner_notices": world.hub.notices_for(alice),
        "gpuspawner_servers": servers_var(world.hub)(alice),
    }
    env = hub.tornado_application.settings["jinja2_env"]
    page = await env.get_template("spawn.html").render_async(
        **values,
        user=alice,
        static_url=lambda *a, **kw: "/hub/static/",
        base_url="/hub/",
        url="/hub/spawn/alice/second",
        spawner_options_form='<select name="gpu_model"></select>',
        parsed_scopes=set(),
    )
    html = " ".join(page.split())
    assert "Your GPUs" in html and "Default server" in html and f"{A100} on gpu-b" in html
    assert f'<code class="user-select-all">{a_gpu}</code>: 0.5 of the GPU, 40 GiB of memory' in html
    assert "in use by this server: 30 GiB" in html
    assert html.index("Your GPUs") < html.index('id="spawn_form"')  # above JupyterHub's form, which still renders
    assert '<select name="gpu_model"></select>' in html


async def test_a_holder_spanning_two_devices_is_told_only_of_the_one_it_is_over_on_and_its_peak_is_its_total(tmp_path):
    """1.2 of an A100 split 0.6 + 0.6 (48 GiB on each device): 10 GiB on GPU-b0 and
    55 GiB on GPU-b1 is over on GPU-b1 only, though the 65 GiB in all is within the
    96 GiB the whole share comes with: a piece's memory is that device's."""
    clock = Clock()
    world = World(
        tmp_path,
        inventory=TWO_GPUS,
        clocks=dict(clock=clock, wall=lambda: 1_700_000_000.0 + clock.now),
        gpu_sharing={A100: {"quantum": 0.05, "split": True, "memory": "warn"}},
        max_gpus_per_user=2,
    )
    await world.started(world.spawner("dana", {"gpu_model": A100, "gpu_share": 1.2}))
    [(name, h)] = world.owner.all().items()
    assert (h.held.uuids, h.held.milli) == (("GPU-b0", "GPU-b1"), (600, 600))
    found = world.hub.reclaimer
    procs = [{"pid": 100, "used_mib": 10 * GIB, "holder": {"service": name}}]
    on_b1 = [{"pid": 101, "used_mib": 40 * GIB, "holder": {"service": name}}]
    on_b1.append({"pid": 102, "used_mib": 15 * GIB, "holder": {"service": name}})  # its own two processes there
    reading = parse_report(
        json.dumps(
            report(
                device(0, "GPU-b0", utilization_gpu=50, processes=procs),
                device(1, "GPU-b1", utilization_gpu=50, processes=on_b1),
            )
        )
    )
    world.hub.holdings.cluster.receive(reading)
    found.observe(reading)
    await found.check()
    [notice] = found.notices_for("dana")
    assert notice["reason"] == "memory" and notice["stop_at"] is None
    assert notice["message"].startswith(
        "Your default server uses more GPU memory than its share: 55.0 GiB on GPU-b1, where its share "
        "comes with 48.0 GiB."
    )
    assert "GPU-b0" not in notice["message"]
    [row] = server_rows(world.hub, "dana")  # the home and spawn pages: each device its own figures
    assert [(d["uuid"], d["used_mib"], d["entitled_mib"]) for d in row["devices"]] == [
        ("GPU-b0", 10 * GIB, 48 * GIB),
        ("GPU-b1", 55 * GIB, 48 * GIB),
    ]
    alloc_map = json.loads(await world.owner.cluster.views.alloc_map_json())
    over_on = {uuid: [h["memory_over"] for h in d["holders"]] for uuid, d in alloc_map["gpu-b"].items()}
    assert over_on == {"GPU-b0": [False], "GPU-b1": [True]}
    assert REGISTRY.get_sample_value("gpuspawner_holders_over_memory", {"model": A100}) == 1  # one holder, not two
    [row] = Ledger(world.db_url).open_allocations()
    assert row.peak_memory_mib == 65 * GIB  # its processes on both devices together


async def test_with_gpu_metrics_per_holder_each_holders_memory_used_and_entitled_is_a_gauge_per_device(tmp_path):
    world, owner, found, clock, stopped = await two_servers(tmp_path, shares=0.5)
    a_name, a_gpu = uuid_of(owner, "alice")
    b_name, _ = uuid_of(owner, "bob")
    found.observe(on_gpu_b0([(a_name, 50 * GIB), (b_name, None), (None, 15 * GIB)]))  # bob's use: not known
    await found.check()

    def samples(gpu_hub) -> dict:
        return {
            (s.name, s.labels["user"]): s.value
            for family in gpu_hub.holder_gauges().collect()  # as the hub's /metrics reads them at a scrape
            for s in family.samples
        }

    assert samples(world.hub) == {}  # off by default: no series per server
    world.hub.settings.gpu_metrics_per_holder = True  # read at each scrape
    assert samples(world.hub) == {
        ("gpuspawner_holder_memory_used_bytes", "alice"): 50 * 2**30,
        ("gpuspawner_holder_memory_entitled_bytes", "alice"): 40 * 2**30,
        ("gpuspawner_holder_memory_entitled_bytes", "bob"): 40 * 2**30,  # and no used figure it could not read
    }
    [family] = [f for f in world.hub.holder_gauges().collect() if f.name.endswith("used_bytes")]
    labels = {"user": "alice", "server": "", "model": A100, "host": "gpu-b", "uuid": a_gpu}
    assert family.samples[0].labels == labels
    world.hub.show_metrics()  # what the hub shows at /metrics from its start
    try:
        assert REGISTRY.get_sample_value("gpuspawner_holder_memory_used_bytes", labels) == 50 * 2**30
    finally:
        await world.hub.stop()
    assert REGISTRY.get_sample_value("gpuspawner_holder_memory_used_bytes", labels) is None  # and no more once stopped
    clock.now += 10
    await found.stop(owner.get(a_name), "memory")  # alice's server ends, through her spawner
    await found.check()
    assert {user for _, user in samples(world.hub)} == {"bob"}  # an ended server leaves no series behind
