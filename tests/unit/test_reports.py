"""Agent reports: validation (clear 400 messages) and the GPUs they describe (pure)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.core.reports import MAX_REPORT_BYTES, ReportError, device_problems, gpus_of, parse_report

A100 = "NVIDIA A100 80GB PCIe"


def device(index, uuid, name=A100, memory=81920, **extra):
    d = {
        "index": index,
        "uuid": uuid,
        "name": name,
        "memory_total_mib": memory,
        "memory_used_mib": 0,
        "utilization_gpu": 0,
        "temperature_c": 40,
        "ecc_uncorrected": 0,
        "lost": False,
        "processes": [],
        "mig_mode": False,
        "healthy": True,
        "problems": [],
        "mig_devices": [],
    }
    d.update(extra)
    return d


def report(*devices, hostname="gpu-b", interval=15):
    return {
        "hostname": hostname,
        "interval": interval,
        "agent_version": "0.1.0",
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
        "device_count": len(devices),
        "healthy": True,
        "devices": list(devices),
    }


MIG = device(
    1,
    "GPU-a100-mig",
    mig_mode=True,
    mig_devices=[
        {
            "index": 0,
            "uuid": "MIG-aaaa-0001",
            "profile": "3g.40gb",
            "name": A100 + " MIG 3g.40gb",
            "memory_total_mib": 40192,
            "memory_used_mib": 0,
        },
        {
            "index": 1,
            "uuid": "MIG-aaaa-0002",
            "profile": "1g.10gb",
            "name": A100 + " MIG 1g.10gb",
            "memory_total_mib": 9856,
            "memory_used_mib": 0,
        },
    ],
)


def test_a_good_report_gives_its_devices_and_mig_slices_as_models_of_their_own():
    r = parse_report(json.dumps(report(device(0, "GPU-a100-0"), MIG)))
    assert r.hostname == "gpu-b" and r.interval == 15 and r.driver_version == "550.54.15"
    gpus = [g for g, _ in gpus_of(r)]
    assert [(g.uuid, g.model, g.memory_mib) for g in gpus] == [
        ("GPU-a100-0", A100, 81920),
        ("MIG-aaaa-0001", A100 + " · MIG 3g.40gb", 40192),
        ("MIG-aaaa-0002", A100 + " · MIG 1g.10gb", 9856),
    ]  # the MIG-enabled GPU itself is not offered: only its slices are


def test_aliases_rename_models_and_mig_slices_follow_their_gpu_unless_named_themselves():
    r = parse_report(json.dumps(report(device(0, "GPU-a100-0"), MIG)))
    aliases = {A100: "A100", A100 + " · MIG 1g.10gb": "A100 tenth"}
    assert [g.model for g, _ in gpus_of(r, aliases)] == ["A100", "A100 · MIG 3g.40gb", "A100 tenth"]


def test_a_lost_gpu_may_come_without_uuid_and_is_never_offered():
    lost = {"index": 2, "uuid": None, "name": None, "memory_total_mib": None, "lost": True, "problems": []}
    r = parse_report(json.dumps(report(device(0, "GPU-a100-0"), lost)))
    assert r.devices[1].lost and r.devices[1].uuid is None
    assert [g.uuid for g, _ in gpus_of(r)] == ["GPU-a100-0"]


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda r: r.update(hostname="gpu b; rm -rf"), "hostname"),
        (lambda r: r.update(hostname=None), "hostname"),
        (lambda r: r.update(interval=0), "interval"),
        (lambda r: r.update(interval=float("nan")), "interval"),
        (lambda r: r.update(interval="15"), "interval"),
        (lambda r: r.update(devices={"0": {}}), "devices"),
        (lambda r: r["devices"][0].update(uuid="GPU-x,GPU-y"), "devices[0].uuid"),
        (lambda r: r["devices"][0].update(uuid="all"), "devices[0].uuid"),
        (lambda r: r["devices"][0].update(name="A100\nnode.role==manager"), "devices[0].name"),
        (lambda r: r["devices"][0].update(memory_total_mib=-1), "devices[0].memory_total_mib"),
        (lambda r: r["devices"][0].update(memory_total_mib=True), "devices[0].memory_total_mib"),
        (lambda r: r["devices"][0].update(index=1.5), "devices[0].index"),
        (lambda r: r["devices"][0].update(lost="no"), "devices[0].lost"),
        (lambda r: r["devices"][0].update(temperature_c=1e9), "devices[0].temperature_c"),
        (lambda r: r["devices"][0].update(problems=[{"x": 1}]), "devices[0].problems[0]"),
        (lambda r: r["devices"][1]["mig_devices"][0].update(profile="1g 10gb"), "devices[1].mig_devices[0].profile"),
        (lambda r: r["devices"][1]["mig_devices"][0].update(uuid="GPU-not-a-mig"), "devices[1].mig_devices[0].uuid"),
        (lambda r: r["devices"][1].update(uuid="GPU-a100-0"), "listed twice"),
        (lambda r: r["devices"][1].update(index=0), "listed twice"),
        (lambda r: r["devices"].extend([device(i + 10, f"GPU-{i}") for i in range(64)]), "devices"),
    ],
)
def test_a_bad_field_is_refused_with_a_message_that_names_it(change, field):
    body = report(device(0, "GPU-a100-0"), copy.deepcopy(MIG))
    change(body)
    with pytest.raises(ReportError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_report(json.dumps(body))


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"hostname": "gpu-b"}'])
def test_what_is_not_a_report_is_refused(body):
    with pytest.raises(ReportError):
        parse_report(body)


def test_an_oversized_body_is_refused_before_it_is_parsed():
    with pytest.raises(ReportError, match="limit"):
        parse_report(b" " * (MAX_REPORT_BYTES + 1))


def test_health_rules():
    assert device_problems(False, 0, 89.0, 90) == []
    assert device_problems(False, None, None, 90) == []
    assert device_problems(True, None, None, 90) == ["GPU is lost (NVML_ERROR_GPU_IS_LOST)"]
    assert device_problems(False, 3, 95.0, 90) == ["3 uncorrected ECC errors", "temperature 95 C is above 90 C"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["hostname", "interval", "devices", "driver_version", "x"]), json_values, max_size=5
    )
)
def test_fuzz_only_report_errors_come_out(data):
    try:
        parse_report(json.dumps(data))
    except ReportError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(
                [
                    "index",
                    "uuid",
                    "name",
                    "memory_total_mib",
                    "lost",
                    "mig_mode",
                    "mig_devices",
                    "temperature_c",
                    "ecc_uncorrected",
                    "problems",
                    "processes",
                ]
            ),
            json_values,
            max_size=11,
        ),
        max_size=3,
    )
)
def test_fuzz_devices_only_report_errors_come_out(devices):
    try:
        r = parse_report(json.dumps(report(*devices)))
    except ReportError:
        return
    for gpu, _ in gpus_of(r):  # whatever passed is safe to put in labels and env
        assert gpu.uuid.startswith(("GPU-", "MIG-")) and "," not in gpu.uuid
