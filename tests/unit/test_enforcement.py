"""Whether a node has what its gpu_share_enforcement mode needs: what the agent looks
at (real files and a real FIFO in a temporary folder), how the report carries it, and
what doctor and the /hub/gpus page say (pure, from parsed reports)."""

from __future__ import annotations

import json
import os

import pytest

from gpuspawner.agent.report import encode_report
from gpuspawner.cluster.doctor import diagnose, enforcement_gaps
from gpuspawner.core.enforcement import Seen, look, missing
from gpuspawner.core.reports import ReportError, parse_report
from tests.unit.test_reports import device, report


def test_the_agent_finds_the_mps_control_pipe_and_the_hami_library_or_says_they_are_not_there(tmp_path):
    pipes, lib = tmp_path / "nvidia-mps", tmp_path / "libvgpu.so"
    pipes.mkdir()
    assert look(str(pipes), str(lib)) == {
        "mps_pipe_dir": str(pipes),
        "mps_control": False,
        "hami_library": str(lib),
        "hami_library_bytes": 0,
    }
    (pipes / "control").write_text("")  # a file, not the daemon's pipe
    assert look(str(pipes), str(lib))["mps_control"] is False
    (pipes / "control").unlink()
    os.mkfifo(pipes / "control")
    lib.write_bytes(b"\x7fELF" + bytes(1020))
    seen = look(str(pipes), str(lib))
    assert seen["mps_control"] is True and seen["hami_library_bytes"] == 1024
    # Folders the agent cannot see (not mounted into its container): not judged.
    unseen = look(str(tmp_path / "not-mounted"), str(tmp_path / "nor-this" / "libvgpu.so"))
    assert (unseen["mps_control"], unseen["hami_library_bytes"]) == (None, None)
    assert missing("mps", Seen(mps_control=None)) is None and missing("hami", Seen(hami_library_bytes=None)) is None


def test_the_report_carries_what_the_agent_saw_and_the_hub_reads_it_strictly(tmp_path):
    body = encode_report(report(device(0, "GPU-b0")), "gpu-b", 15, None, (str(tmp_path), str(tmp_path / "lib.so")))
    parsed = parse_report(body)
    assert parsed.enforcement == Seen(False, 0, str(tmp_path), str(tmp_path / "lib.so"))  # both folders there
    assert parse_report(encode_report(report(device(0, "GPU-b0")), "gpu-b", 15)).enforcement is None  # did not look
    bad = dict(json.loads(body), share_enforcement={"mps_control": "yes"})
    with pytest.raises(ReportError, match=r"share_enforcement.mps_control: expected true or false"):
        parse_report(json.dumps(bad))


def test_a_node_lacking_what_its_mode_needs_is_named_and_nothing_is_judged_without_a_look():
    assert missing("mps", Seen(mps_control=False, mps_pipe_dir="/tmp/nvidia-mps")) == (
        "its MPS control daemon is not running (no control pipe in /tmp/nvidia-mps)"
    )
    assert missing("hami", Seen(hami_library_bytes=0, hami_library="/usr/local/vgpu/libvgpu.so")) == (
        "HAMi-core's library is not at /usr/local/vgpu/libvgpu.so"
    )
    assert missing("hami", Seen(hami_library_bytes=2_000_000)) is None
    assert missing("none", Seen(mps_control=False, hami_library_bytes=0)) is None
    assert missing("mps", None) is None


def test_doctor_and_the_gpu_page_name_the_node_whose_enforcement_is_missing():
    def node(host, **seen):
        body = json.loads(encode_report(report(device(0, f"GPU-{host}"), hostname=host), host, 15))
        body["share_enforcement"] = {"mps_control": False, "hami_library_bytes": 0, **seen}
        return host, parse_report(json.dumps(body))

    reports = dict([node("gpu-a"), node("gpu-b", hami_library="/opt/libvgpu.so"), node("gpu-c", mps_control=True)])
    setting = {"gpu-b": "hami", "gpu-c": "mps", "*": "none"}
    gaps = enforcement_gaps(setting, reports)
    assert gaps == {
        "gpu-b": "shares are set to be enforced with hami, but HAMi-core's library is not at /opt/libvgpu.so"
    }
    [finding] = [f for f in diagnose([], [], reports, {}, ["agent"], enforcement=setting) if "enforced" in f.problem]
    assert (finding.severity, finding.host) == ("error", "gpu-b")
    assert finding.problem.endswith("a share there is a booking only, and one process can take the whole GPU")
    assert enforcement_gaps("none", reports) == {}


async def test_the_gpu_page_says_which_node_cannot_enforce_its_shares():
    import jinja2  # noqa: PLC0415

    from gpuspawner.web.api import gpu_page  # noqa: PLC0415
    from tests.unit.test_cluster_views import TEMPLATES, devices_of, fleet, parse  # noqa: PLC0415

    c = fleet()
    body = report(*devices_of("gpu-b"), hostname="gpu-b")
    body["share_enforcement"] = {"mps_control": False, "mps_pipe_dir": "/tmp/nvidia-mps"}
    c.receive(parse_report(json.dumps(body)), now=0)
    loader = jinja2.ChoiceLoader(
        [
            jinja2.DictLoader({"page.html": "<html><body><main>{% block main %}{% endblock %}</main></body></html>"}),
            jinja2.FileSystemLoader(TEMPLATES),
        ]
    )
    env = jinja2.Environment(loader=loader, autoescape=True, enable_async=True)
    card = jinja2.Environment(loader=loader, autoescape=True).get_template("gpus_host.html")

    def render(**ns):
        return env.get_template("gpus.html").render_async(base_url="/hub/", **ns)

    head, _, _ = await gpu_page(c, render, card, {"gpu-b": "mps", "*": "none"})
    [alert] = [
        n
        for n in parse(head + "</div></main></body></html>").find_all("div")
        if "gpu-enforcement" in n.attrs.get("class", "")
    ]
    assert alert.attrs["data-host"] == "gpu-b"
    assert "gpu-b: shares are set to be enforced with mps, but its MPS control daemon is not running" in alert.text
    head, _, _ = await gpu_page(c, render, card, "none")
    assert "gpu-enforcement" not in head


def test_the_agent_looks_where_the_hub_points_servers_by_default():
    from gpuspawner.agent.command import build_parser  # noqa: PLC0415
    from gpuspawner.hub.settings import GPUSettings  # noqa: PLC0415

    args = build_parser().parse_args(["run", "--hub-url", "http://hub:8000"])
    hub = GPUSettings()
    assert (args.mps_pipe_dir, args.hami_library) == (hub.gpu_share_mps_pipe_dir, hub.gpu_share_hami_library)
    args = build_parser().parse_args(["run", "--hub-url", "http://hub:8000", "--mps-pipe-dir", "/host/tmp/nvidia-mps"])
    assert args.mps_pipe_dir == "/host/tmp/nvidia-mps"


# -- under gpu_share_enforcement_missing = "refuse" ----------------------------------


def test_no_share_goes_to_a_node_that_cannot_enforce_it_while_whole_gpus_still_do():
    from gpuspawner.allocator.allocator import AllocationRefused, Allocator, Request  # noqa: PLC0415
    from gpuspawner.core.inventory import GPU  # noqa: PLC0415

    a100 = "NVIDIA A100 80GB PCIe"
    gpus = [GPU("gpu-a", 0, "GPU-a0", a100, 81920), GPU("gpu-b", 0, "GPU-b0", a100, 81920)]
    allocator = Allocator(gpus, sharing={a100: {"quantum": 0.25}})
    allocator.allocate("first", Request(model=a100, milli=500, owner="ann"))  # on gpu-a (pack: by name)
    why = "its MPS control daemon is not running (no control pipe in /tmp/nvidia-mps)"
    allocator.set_unenforced("gpu-a", why)
    assert allocator.allocate("next", Request(model=a100, milli=250, owner="bob")).host == "gpu-b"
    with pytest.raises(AllocationRefused) as refused:
        allocator.allocate("pinned", Request(model=a100, milli=250, owner="cy", host="gpu-a"))
    assert refused.value.status == 409 and refused.value.reason.value == "shares_unenforced"
    assert refused.value.message == (
        f"No {a100} has room for 0.25 of a GPU on a node that enforces shares: gpu-a has, but {why}. "
        "Try again later, or ask for a whole GPU."
    )
    allocator.allocate("big", Request(model=a100, milli=750, owner="dee"))  # gpu-b is full now
    with pytest.raises(AllocationRefused, match="gpu-a has, but its MPS control daemon is not running"):
        allocator.allocate("more", Request(model=a100, milli=250, owner="eve"))
    allocator.release("first")
    assert allocator.allocate("whole", Request(model=a100, count=1, owner="fay")).host == "gpu-a"  # whole: as before
    allocator.set_unenforced("gpu-a", None)
    allocator.release("whole")
    assert allocator.allocate("again", Request(model=a100, milli=250, owner="gus")).host == "gpu-a"


async def test_the_hub_refuses_shares_on_a_node_its_agent_found_lacking_only_when_told_to(tmp_path):
    from jupyterhub.spawner import SpawnException  # noqa: PLC0415

    from tests.unit.test_holdings import A100, World  # noqa: PLC0415

    def world(when_missing: str) -> World:
        return World(
            tmp_path,
            gpu_sharing={A100: {"quantum": 0.25}},
            gpu_share_enforcement={"gpu-b": "hami", "*": "none"},
            gpu_share_enforcement_missing=when_missing,
        )

    body = report(device(0, "GPU-b0", name=A100), hostname="gpu-b")
    body["share_enforcement"] = {"hami_library": "/usr/local/vgpu/libvgpu.so", "hami_library_bytes": 0}
    for when_missing in ("police", "refuse"):
        w = world(when_missing)
        seen = parse_report(json.dumps(body))
        w.hub.holdings.cluster.receive(seen)  # as the report endpoint takes it
        w.hub.enforcement_seen(seen)
        share = w.spawner("ann", {"gpu_model": A100, "gpu_share": 0.25})
        if when_missing == "police":
            await w.started(share)  # placed, and held to its memory as gpu_sharing says
            assert w.owner.get(share.service_name).held.host == "gpu-b"
            continue
        with pytest.raises(SpawnException) as refused:
            await w.started(share)
        assert refused.value.status_code == 409
        assert refused.value.message == (
            f"No {A100} has room for 0.25 of a GPU on a node that enforces shares: gpu-b has, "
            "but HAMi-core's library is not at /usr/local/vgpu/libvgpu.so. Try again later, or ask for a whole GPU."
        )
        assert w.owner.get(share.service_name) is None and w.fake.service_names() == []
        # Refused at once also with gpu_wait: only an admin can mend the node, and a waiter
        # at the head of the line would hold up every request for the model meanwhile.
        patient = w.spawner("cy", {"gpu_model": A100, "gpu_share": 0.25, "gpu_wait": True})
        with pytest.raises(SpawnException) as refused:
            await w.started(patient)
        assert refused.value.status_code == 409 and "HAMi-core's library is not at" in refused.value.message
        assert w.hub.line.place(patient.service_name) is None and w.owner.get(patient.service_name) is None
        await w.started(w.spawner("bob", {"gpu_model": A100}))  # a whole GPU: as before


def test_the_agent_benchmarks_busier_node_has_the_processes_it_says_on_gpus_that_run_them():
    from benchmarks.bench_agent import node_with  # noqa: PLC0415
    from devtools.fakenvml.nodes import MIXED_NODE  # noqa: PLC0415

    assert node_with(None) is MIXED_NODE
    node = node_with(32)
    assert sum(len(d["processes"]) for d in node) == 32
    assert all(not d["processes"] for d in node if d.get("lost") or d.get("mig"))
    assert len({p["pid"] for d in node for p in d["processes"]}) == 32
    assert sum(len(d.get("processes", [])) for d in MIXED_NODE) == 6  # the node itself is left as it was
