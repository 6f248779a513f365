"""Fuzzing every input surface: whatever arrives, the answer is a valid result
or the surface's own error with a one-line message, never another exception.

Surfaces: REST options (parse_user_options), the form (options_from_form),
report bodies (parse_report: raw bytes, bracket soup and JSON-shaped), the
usage endpoint's times (_time_arg, and the ledger's range check), service
labels read at rebuild (parse_labels) and the config traits validate_config
checks. A few hundred examples each by default (a few seconds in all);
``GPUSPAWNER_FUZZ=long`` (``make fuzz``) runs many more.

Guards docs/reliability.md, "Fuzzing": "The fuzz tests feed each input surface with hypothesis and
check one contract" and "The unit tests run 150 examples per surface".
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tornado import web

from gpuspawner.core.labels import (
    DEVICES,
    HOST,
    MODEL,
    PORT,
    SERVER,
    SHARES,
    USER,
    Held,
    LabelError,
    parse_labels,
)
from gpuspawner.core.options import KEYS, GPURequest, OptionsError, options_from_form, parse_user_options
from gpuspawner.core.reports import NodeReport, ReportError, parse_report
from gpuspawner.hub.settings import validate_config
from gpuspawner.ledger.checks import checked_range
from gpuspawner.web.api import _time_arg

LONG = os.environ.get("GPUSPAWNER_FUZZ", "") == "long"
FUZZ = settings(
    max_examples=20_000 if LONG else 150,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the shared tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


def one_line(message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message, message


REFUSED = object()


def answer(error: type[Exception], call, *args, **kwargs):
    """What ``call`` returns, or REFUSED when it raised ``error`` with a one-line
    message; any other exception fails the test."""
    try:
        return call(*args, **kwargs)
    except error as exc:
        one_line(str(exc))
        return REFUSED


# -- values users and agents can send ----------------------------------------------

digits = st.text("0123456789", min_size=1, max_size=6000)
look_alike_digits = st.text("٠١٢٣٤٥٦٧٨٩０１２３４５６７８９߀¹²³₀", min_size=1, max_size=8)
numberish_text = st.one_of(
    digits,
    look_alike_digits,
    st.sampled_from(
        [
            "NaN",
            "nan",
            "inf",
            "-inf",
            "Infinity",
            "1e10000",
            "-1e10000",
            "0x10",
            "1_000",
            " 1 ",
            "1.",
            ".5",
            "0.0001",
            "-0",
            "+1",
            "1e-7",
            "all",
            "ALL",
            "",
            "\x00",
            "\ud800",
            "1\n2",
        ]
    ),
    st.text(max_size=30),
)
nasty_numbers = st.one_of(
    # huge ones built by map: hypothesis itself cannot repr a strategy holding 10**5000
    st.integers(),
    st.integers(4000, 6000).map(lambda k: 10**k),
    st.integers(4000, 6000).map(lambda k: -(10**k) - 1),
    st.floats(),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, 5e-324, -0.0]),
    st.decimals(),
    st.sampled_from([Decimal("1e999999"), Decimal("NaN"), Decimal("sNaN"), Decimal("-Infinity")]),
    st.fractions(),
    st.just(Fraction(1, 3)),
    st.booleans(),
)
scalars = st.one_of(st.none(), nasty_numbers, numberish_text)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
MODELS = ["NVIDIA A100 80GB PCIe", "H100"]
HOSTS = ["node1", "node2"]
POLICIES = [None, {"*": {"shares": [0.25, 0.5]}}, {"H100": {"quantum": 0.1, "split": True}}]


# -- REST options and the form -------------------------------------------------------------


def _check_options(options, max_count, allow_host_choice, sharing):
    r = answer(
        OptionsError,
        parse_user_options,
        options,
        models=MODELS,
        hosts=HOSTS,
        max_count=max_count,
        allow_host_choice=allow_host_choice,
        sharing=sharing,
    )
    if r is REFUSED:
        return
    assert isinstance(r, GPURequest)
    assert r.model is None or r.model in MODELS
    assert r.host is None or r.host in HOSTS
    assert r.count == "all" or (type(r.count) is int and 0 <= r.count <= max_count)
    assert r.milli is None or (type(r.milli) is int and 0 < r.milli <= max_count * 1000)


@FUZZ
@given(
    options=st.one_of(
        values,
        st.dictionaries(
            st.sampled_from([*KEYS, "gpu_COUNT", "_xsrf"]),
            st.one_of(scalars, st.sampled_from([*MODELS, *HOSTS, "all"])),
            max_size=4,
        ),
    ),
    max_count=st.integers(0, 8),
    allow_host_choice=st.booleans(),
    sharing=st.sampled_from(POLICIES),
)
def test_fuzz_rest_options(options, max_count, allow_host_choice, sharing):
    _check_options(options, max_count, allow_host_choice, sharing)


@FUZZ
@given(
    form=st.dictionaries(
        st.sampled_from([*KEYS, "_xsrf", "other"]) | st.text(max_size=10),
        st.lists(st.one_of(numberish_text, st.sampled_from([*MODELS, *HOSTS, "all"])), max_size=2),
        max_size=5,
    ),
    max_count=st.integers(0, 8),
    allow_host_choice=st.booleans(),
    sharing=st.sampled_from(POLICIES),
)
def test_fuzz_form(form, max_count, allow_host_choice, sharing):
    options = options_from_form(form)  # never raises
    assert isinstance(options, dict)
    _check_options(options, max_count, allow_host_choice, sharing)


# -- report bodies -------------------------------------------------------------------------


def _check_report(body):
    r = answer(ReportError, parse_report, body)
    assert r is REFUSED or isinstance(r, NodeReport)


@FUZZ
@given(st.binary(max_size=2048) | st.text(max_size=2048).map(str.encode))
def test_fuzz_report_raw_bytes(body):
    _check_report(body)


@FUZZ
@given(
    st.text('[]{}",:\\0123456789.eE-tnul ', max_size=4096),
    st.integers(0, 120_000),
    st.sampled_from(["[", '{"a":', '[{"b":[', '"[', '\\"[']),
)
def test_fuzz_report_bracket_soup(soup, depth, opener):
    """Guards docs/security.md, "A node's agent token": "send malformed, oversized or deeply nested
    bodies"."""
    closer = "".join({"[": "]", "{": "}"}.get(c, "") for c in reversed(opener))
    _check_report(opener * depth + soup + closer * depth)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**53) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=40,
)
MIG_KEYS = ["index", "uuid", "profile", "memory_total_mib", "memory_used_mib"]
DEVICE_KEYS = [
    "index",
    "uuid",
    "name",
    "memory_total_mib",
    "memory_used_mib",
    "utilization_gpu",
    "temperature_c",
    "ecc_uncorrected",
    "lost",
    "processes",
    "mig_mode",
    "mig_devices",
    "problems",
]
good_field = {
    "index": st.integers(0, 3),
    "uuid": st.sampled_from(["GPU-1", "GPU-2", "MIG-1", "MIG-2"]),
    "profile": st.sampled_from(["1g.10gb", "7g.80gb"]),
    "memory_total_mib": st.integers(1, 10**6),
    "name": st.sampled_from(MODELS),
    "lost": st.booleans(),
    "mig_mode": st.booleans(),
    "hostname": st.sampled_from(HOSTS),
    "interval": st.floats(1, 3600),
}


def _object(keys, nested=None):
    def field(key):
        good = good_field.get(key, json_values)
        if nested and key in nested:
            good = st.lists(nested[key], max_size=3)
        return st.one_of(good, json_values)

    return st.fixed_dictionaries({}, optional={k: field(k) for k in keys})


mig = _object(MIG_KEYS)
device = _object(DEVICE_KEYS, {"mig_devices": mig})
report = _object(
    ["hostname", "interval", "driver_version", "cuda_version", "agent_version", "devices", "docker_default_runtime"],
    {"devices": device},
)


@FUZZ
@given(report)
def test_fuzz_report_json_shaped(data):
    """Guards docs/security.md, "A node's agent token": "send malformed, oversized or deeply nested
    bodies"."""
    _check_report(json.dumps(data))


# -- usage times -------------------------------------------------------------------------------

offsets = st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59))
iso_times = st.builds(
    lambda t, o, sep: t.replace(tzinfo=None if o is None else timezone(o)).isoformat(sep),
    st.datetimes(),
    st.none() | offsets,
    st.sampled_from(["T", " "]),
)


@FUZZ
@given(
    st.one_of(
        iso_times,
        iso_times.map(lambda s: s.replace("+00:00", "Z")),
        st.text(max_size=40),
        st.sampled_from(["0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00", "0001-01-01", "9999-12-31"]),
    ),
    iso_times | st.none(),
)
def test_fuzz_usage_times(since_text, until_text):
    """Guards docs/security.md, "A user": "cause a 500 with out-of-range times"."""
    try:
        since = _time_arg(since_text)
        until = _time_arg(until_text or "")
    except web.HTTPError as exc:
        assert exc.status_code == 400
        one_line(exc.log_message)
        return
    assert since is None or since.tzinfo is not None
    answer(ValueError, checked_range, since, until, datetime.now(timezone.utc))  # ValueError: since after until


# -- labels read at rebuild ----------------------------------------------------------------------

label_text = st.one_of(
    st.text(max_size=40),
    st.text(max_size=400),
    numberish_text,
    st.sampled_from(
        [
            "GPU-1",
            "GPU-1,GPU-2",
            "GPU-1,,",
            "MIG-1",
            "node1",
            "H100",
            "8888",
            "0.5",
            "0.5,0.5",
            "1",
            "1.0001",
            "0",
            "65536",
            "alice",
            "",
        ]
    ),
)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from([USER, SERVER, HOST, DEVICES, MODEL, PORT, SHARES, "gpuspawner.x", "other"]),
        label_text,
        max_size=8,
    )
)
def test_fuzz_labels(labels):
    r = answer(LabelError, parse_labels, labels)
    assert r is REFUSED or r is None or isinstance(r, Held)


# -- config traits -------------------------------------------------------------------------------

_FILES = tempfile.mkdtemp(prefix="gpuspawner-fuzz-")
for _name, _text in {
    "ok.yaml": "node1:\n- {uuid: GPU-1, model: H100, memory_mib: 80000}\n",
    "bad.yaml": "node1: [",
    "list.json": "[1, 2]",
    "empty.yaml": "",
    "deep.json": "[" * 5000,
    "alias.yaml": "a: &a [*a]\n",
    "tab.yaml": "\t: x",
}.items():
    with open(os.path.join(_FILES, _name), "w") as _f:
        _f.write(_text)
inventory = st.one_of(
    values,
    st.sampled_from(
        ["ok.yaml", "bad.yaml", "list.json", "empty.yaml", "deep.json", "alias.yaml", "tab.yaml", "missing.yaml"]
    ).map(lambda n: os.path.join(_FILES, n)),
    st.just({"node1": [{"uuid": "GPU-1", "model": "H100", "memory_mib": 80000}]}),
)
db_urls = st.one_of(
    st.builds(
        lambda s, rest: s + rest,
        st.sampled_from(
            ["sqlite://", "sqlite:///", "postgresql+psycopg://", "postgresql://", "nosuch://", "mysql://", ""]
        ),
        st.text(max_size=40),
    ),
    values,
)
config_values = {
    "allocation_policy": st.sampled_from(["pack", "spread", "nope"]) | values,
    "gpu_db_url": db_urls,
    "gpu_inventory": inventory,
    "gpu_inventory_source": st.lists(st.sampled_from(["static", "agent", "local", "nvml"]), max_size=3) | values,
    "gpu_model_aliases": st.dictionaries(st.text(max_size=10), st.text(max_size=10) | values, max_size=3) | values,
    "gpu_sharing": st.sampled_from(POLICIES) | st.dictionaries(st.text(max_size=5), values, max_size=2) | values,
    "gpu_share_enforcement": st.sampled_from(["none", "hami", "mps", {"*": "hami"}]) | values,
    "max_gpus_per_user": st.integers() | values,
    "volumes": st.dictionaries(st.sampled_from(["/dev/nvidia0", "/", "//dev/../dev", "data"]) | st.text(), values)
    | values,
    "extra_resources_spec": st.dictionaries(st.sampled_from(["generic_resources", "Reservations"]), values) | values,
    "extra_container_spec": st.dictionaries(st.sampled_from(["mounts", "Mounts", "MOUNTS"]), values) | values,
}


@FUZZ
@given(
    st.sampled_from(["Spawner", "SwarmSpawner", "GPUSwarmSpawner"]), st.fixed_dictionaries({}, optional=config_values)
)
def test_fuzz_config(section, traits):
    try:
        validate_config({section: traits})
    except SystemExit as exc:
        assert str(exc.code).startswith("gpuspawner configuration error: ")
        one_line(str(exc.code))
