"""Every number the hub takes from outside has a range, and anything else is refused in
one line that says what is wrong, never an OverflowError or TypeError traceback later.

* The admin's numeric settings: every Integer and Float trait gpuspawner adds to
  ``c.GPUSwarmSpawner`` (and tuples of them), found by introspection, so a new one is
  covered without editing this file. Each has a finite range its default is in; a value
  in it is taken (and can be slept on or added to a clock); anything else (10**400,
  -10**400, NaN, the infinities, tiny floats where the range has no room for them,
  negatives, bools, text) stops the hub at start with the one-line configuration error
  naming the setting, the value and the range, and, for a hub that did not call
  ``validate_config``, is the one-line HubConfigError at first use.
* Agents' reports: a hostile number in any numeric field the parser reads (found in its
  source) is a ReportError (the endpoint's 400) naming the field.
* Users' options, by REST and the form: a hostile ``gpu_count`` or ``gpu_share`` is an
  OptionsError naming it, and at a spawn a 400 that reserves nothing.

tests/unit/test_fuzz.py throws anything at the same surfaces and checks only that each
answer is a result or a one-line refusal; these say which it must be.

Guards docs/reliability.md, "Fuzzing": "Each hostile number has the one answer it must get" and
"found by introspection, so a new one is covered".
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import math
import re
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jupyterhub.spawner import SpawnException
from traitlets import Float, Int, Tuple
from traitlets.config import Config

from devtools import configref
from gpuspawner.core import access, reports
from gpuspawner.core.options import KEYS, OptionsError, options_from_form, parse_user_options
from gpuspawner.core.reports import ReportError, parse_report
from gpuspawner.core.sharing import shown
from gpuspawner.hub.app import GPUHub, HubConfigError
from gpuspawner.hub.settings import validate_config
from gpuspawner.spawn.spawner import GPUSwarmSpawner
from tests.unit.test_holdings import World

PROPERTY = settings(
    max_examples=300,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the shared tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TEN_YEARS = 10 * 365 * 24 * 3600  # seconds: no setting goes beyond, in any unit
A100 = "NVIDIA A100 80GB PCIe"

# -- the admin's numeric settings -------------------------------------------------------------


def _numeric(trait) -> bool:
    if isinstance(trait, Tuple):
        inner = getattr(trait, "_traits", None)
        return bool(inner) and all(_numeric(t) for t in inner)
    return isinstance(trait, (Int, Float))


NUMERIC = {
    name: trait
    for cls in configref.gpuspawner_classes(GPUSwarmSpawner)
    for name, trait in cls.class_own_traits(config=True).items()
    if _numeric(trait)
}


def _leaves(trait) -> list:
    return list(trait._traits) if isinstance(trait, Tuple) else [trait]


def _plain(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


def in_range(trait, value: Any) -> bool:
    """The rule: a number (not a bool), finite, within the trait's range or its ``off``
    value, whole for an Integer; a tuple of such, in order."""
    if isinstance(trait, Tuple):
        leaves = _leaves(trait)
        return (
            isinstance(value, (tuple, list))
            and len(value) == len(leaves)
            and all(type(v) is int and in_range(t, v) for t, v in zip(leaves, value))
            and list(value) == sorted(value)
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and (not math.isfinite(value) or isinstance(trait, Int) and not value.is_integer()):
        return False
    off = getattr(trait, "off", None)
    return (off is not None and value == off) or trait.min <= value <= trait.max


def test_the_settings_the_bug_named_are_found():
    assert {"gpu_wait_timeout", "task_start_timeout", "reconcile_interval", "server_stop_timeout"} <= set(NUMERIC)
    assert {"gpu_max_temperature", "gpu_idle_timeout", "max_gpus_per_user", "host_network_ports"} <= set(NUMERIC)


@pytest.mark.parametrize("name", sorted(NUMERIC))
def test_every_numeric_setting_has_a_finite_range_that_holds_its_default(name):
    trait = NUMERIC[name]
    for leaf in _leaves(trait):
        assert leaf.min is not None and leaf.max is not None, name
        assert math.isfinite(leaf.min) and math.isfinite(leaf.max) and leaf.min <= leaf.max, name
        assert leaf.max <= TEN_YEARS, f"{name}: a value up to {leaf.max} is not a sane one in any unit"
    assert in_range(trait, trait.default()), name
    if not isinstance(trait, Tuple):  # docs/configuration.md states it (test_configref: the file is up to date)
        assert configref.bounds(trait).startswith(" ("), name


def _value_in_range(trait) -> st.SearchStrategy:
    if isinstance(trait, Tuple):
        low, high = int(_leaves(trait)[0].min), int(_leaves(trait)[0].max)
        return st.lists(st.integers(low, high), min_size=2, max_size=2).map(sorted).map(tuple)
    if isinstance(trait, Int):
        return st.integers(int(trait.min), int(trait.max))
    values = st.floats(trait.min, trait.max) | st.sampled_from([trait.min, trait.max])
    off = getattr(trait, "off", None)
    return values | st.just(off) if off is not None else values


# Built by map: hypothesis cannot show a strategy that holds 10**5000 itself.
huge = st.integers(16, 5000).map(lambda k: 10**k) | st.integers(16, 5000).map(lambda k: -(10**k))
hostile = st.one_of(
    huge,
    st.sampled_from([10**400, -(10**400), float("nan"), float("inf"), -float("inf"), 1e308, -1e308]),
    st.sampled_from([5e-324, -5e-324, 1e-300, 1e-9, -1e-9, -0.0, 0.5, -1, 0]),  # tiny, negative, fractional
    st.floats(),
    st.integers(),
    st.sampled_from([True, False, None, "", "5", "1e400", "nan", [], {}, b"5", Decimal("5"), Fraction(1, 2)]),
)


def _pairs(values: st.SearchStrategy) -> st.SearchStrategy:
    return st.tuples(values, values) | st.lists(values, max_size=3)


@PROPERTY
@given(data=st.data())
def test_a_numeric_setting_is_taken_in_its_range_and_otherwise_refused_in_one_line_naming_it(data):
    """Guards docs/reliability.md, "Fuzzing": "a value in it is taken, and anything else" and "is the
    one-line configuration error naming the setting, the value and the range"."""
    name = data.draw(st.sampled_from(sorted(NUMERIC)), label="setting")
    trait = NUMERIC[name]
    good = _value_in_range(trait)
    value = data.draw(
        good | (_pairs(hostile | good.map(lambda p: p[0])) if isinstance(trait, Tuple) else hostile),
        label="value",
    )
    c = Config()
    setattr(c.GPUSwarmSpawner, name, value)
    try:
        validate_config(c)
    except SystemExit as exc:
        message = str(exc.code)
        assert not in_range(trait, value), f"{name} = {value!r} is in its range: {message}"
        assert message.startswith(f"gpuspawner configuration error: c.GPUSwarmSpawner.{name} must be "), message
        leaf = _leaves(trait)[0]
        assert f"{_plain(leaf.min)} up to {_plain(leaf.max)}" in message and message.endswith(shown(value)), message
        assert "\n" not in message
        # A hub that did not call validate_config: the same refusal, at first use, in one line.
        with pytest.raises(HubConfigError) as first_use:
            GPUHub.from_config(c, GPUSwarmSpawner).settings  # noqa: B018 - the read is the check
        assert f"c.GPUSwarmSpawner.{name} must be " in str(first_use.value) and "\n" not in str(first_use.value)
        return
    assert in_range(trait, value), f"{name} = {value!r} was taken"
    taken = getattr(GPUHub.from_config(c, GPUSwarmSpawner).settings, name)
    assert taken == (tuple(value) if isinstance(trait, Tuple) else value)
    if not isinstance(trait, Tuple):  # what the hub does with a time: sleep on it, add it to a clock
        loop = asyncio.new_event_loop()
        try:
            loop.call_later(taken, lambda: None).cancel()
        finally:
            loop.close()
        assert math.isfinite(time.monotonic() + taken)
        assert datetime.now(timezone.utc) + timedelta(seconds=taken) > datetime(2000, 1, 1, tzinfo=timezone.utc)


REFUSALS = [
    ("gpu_wait_timeout", 10**400, "gpu_wait_timeout must be a whole number of seconds from 1 up to 2592000, got"),
    ("task_start_timeout", -(10**400), "task_start_timeout must be a whole number of seconds from 1 up to 86400"),
    ("reconcile_interval", 1e300, "reconcile_interval must be a whole number of seconds from 0 up to 86400"),
    (
        "server_stop_timeout",
        float("nan"),
        "server_stop_timeout must be a whole number of seconds from 0 up to 86400",
    ),
    ("gpu_reclaim_interval", 0, "gpu_reclaim_interval must be a number of seconds from 0.1 up to 3600, got 0"),
    ("gpu_fairshare_half_life_days", 5e-324, "must be a number of days: 0 (off), or from 0.01 up to 3650"),
    ("max_gpus_per_user", True, "max_gpus_per_user must be a whole number of GPUs from 0 up to 100000, got True"),
    ("host_network_ports", (29999, 20000), "host_network_ports must be two ports (first, last) from 1 up to 65535"),
]


@pytest.mark.parametrize("name, value, says", REFUSALS, ids=[name for name, _, _ in REFUSALS])
def test_the_refusal_names_the_setting_its_range_and_the_value(name, value, says):
    c = Config()
    setattr(c.GPUSwarmSpawner, name, value)
    with pytest.raises(SystemExit) as exc:
        validate_config(c)
    message = str(exc.value.code)
    assert message.startswith("gpuspawner configuration error: c.GPUSwarmSpawner."), message
    assert says in message and message.endswith(f", got {shown(value)}"), message


# The numbers in gpu_access's rules: every key but ``models``, each with its range.
ACCESS_NUMBERS = [k for k in access.KEYS if k != "models"]
beyond_every_range = st.one_of(
    huge,
    st.sampled_from([10**400, -(10**400), float("nan"), float("inf"), -float("inf"), 1e308, -1e308]),
    st.sampled_from([True, None, "5", [], {}, Decimal("5")]),
)


def test_every_number_of_the_access_rules_has_a_range():
    assert ACCESS_NUMBERS and set(ACCESS_NUMBERS) == set(access._RANGES)
    assert all(high <= TEN_YEARS for _, high in access._RANGES.values())


@PROPERTY
@given(data=st.data())
def test_a_number_of_the_access_rules_is_taken_in_its_range_and_otherwise_refused_in_one_line(data):
    key = data.draw(st.sampled_from(ACCESS_NUMBERS), label="key")
    low, high = access._RANGES[key]
    c = Config()
    c.GPUSwarmSpawner.gpu_access = {"g": {key: data.draw(st.integers(max(low, 1), high), label="good")}}
    validate_config(c)  # taken
    value = data.draw(beyond_every_range, label="value")
    c.GPUSwarmSpawner.gpu_access = {"g": {key: value}}
    with pytest.raises(SystemExit) as exc:
        validate_config(c)
    message = str(exc.value.code)
    assert message.startswith(f"gpuspawner configuration error: gpu_access['g']['{key}'] must be a "), message
    assert f"{low}" in message and f"{high}" in message and message.endswith(f", got {shown(value)}"), message
    assert "\n" not in message


# -- agents' reports ----------------------------------------------------------------------------

# A report with every field the parser reads: a GPU with a process, one in MIG mode, and what
# enforces shares on the node.
REPORT = {
    "hostname": "gpu-b",
    "interval": 15,
    "agent_version": "0.1.0",
    "driver_version": "550.54.15",
    "cuda_version": "12.4",
    "docker_default_runtime": "nvidia",
    "share_enforcement": {"mps_control": False, "hami_library_bytes": 1024, "hami_library": "/x.so"},
    "devices": [
        {
            "index": 0,
            "uuid": "GPU-b0",
            "name": A100,
            "memory_total_mib": 81920,
            "memory_used_mib": 1024,
            "utilization_gpu": 5,
            "temperature_c": 40.5,
            "ecc_uncorrected": 0,
            "lost": False,
            "mig_mode": False,
            "problems": [],
            "processes": [{"pid": 42, "used_mib": 1000, "holder": {"service": "jupyter-alice"}}],
            "mig_devices": [],
        },
        {
            "index": 1,
            "uuid": "GPU-b1",
            "name": A100,
            "memory_total_mib": 81920,
            "lost": False,
            "mig_mode": True,
            "mig_devices": [
                {"index": 0, "uuid": "MIG-b1-0", "profile": "3g.40gb", "memory_total_mib": 40192, "memory_used_mib": 0}
            ],
        },
    ],
}


def _numeric_paths(data: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _numeric_paths(v, (*path, k))]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in _numeric_paths(v, (*path, i))]
    return [path] if isinstance(data, (int, float)) and not isinstance(data, bool) else []


REPORT_PATHS = _numeric_paths(REPORT)


def test_the_sample_report_is_good_and_has_every_numeric_field_the_parser_reads():
    read = set(re.findall(r'\.(?:integer|number)\(\s*"(\w+)"', inspect.getsource(reports)))
    assert read and {p[-1] for p in REPORT_PATHS} == read, "a numeric report field missing from REPORT"
    parse_report(json.dumps(REPORT))


# JSON text: NaN and Infinity are what Python's json reads (and other agents may send); an
# integer of more than 4,300 digits is not even decoded.
hostile_json = st.one_of(
    st.integers(16, 5000).map(lambda k: "1" + "0" * k),
    st.integers(16, 5000).map(lambda k: "-1" + "0" * k),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e308", "-1e308"]),
    st.sampled_from(["true", "false", '"15"', "[]", "{}", '{"a": 1}']),
)


@PROPERTY
@given(path=st.sampled_from(REPORT_PATHS), token=hostile_json)
def test_a_hostile_number_in_any_numeric_report_field_is_a_bad_report_naming_it(path, token):
    """Guards docs/reliability.md, "Fuzzing": "Such a number in any numeric field of an agent's report
    is a 400 naming the field"."""
    body = copy.deepcopy(REPORT)
    holder = body
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = "@HOSTILE@"
    text = json.dumps(body).replace('"@HOSTILE@"', token)
    with pytest.raises(ReportError) as exc:
        parse_report(text)
    message = str(exc.value)
    assert "\n" not in message
    undecodable = token.lstrip("-").isdigit() and len(token) > 4300
    assert f".{path[-1]}: expected " in message or (undecodable and "not valid JSON" in message), message


# -- users' options, by REST and by the form ------------------------------------------------------

NUMERIC_OPTIONS = ("gpu_count", "gpu_share")


def test_every_option_is_known_to_be_a_number_or_not():
    """A new option must be sorted here, so that a numeric one gets the test below."""
    assert set(KEYS) == {*NUMERIC_OPTIONS, "gpu_model", "gpu_host", "gpu_wait"}


hostile_option = st.one_of(
    huge,
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -1e308, -1, True, None, "1e400", "nan"]),
    st.sampled_from([Decimal("1e999999"), Decimal("NaN"), Decimal("-Infinity"), Fraction(10**400, 3)]),
)
form_text = st.one_of(
    st.integers(13, 5000).map(lambda k: "9" * k),
    st.sampled_from(["1e400", "-1", "nan", "NaN", "inf", "-inf", "Infinity", "0x10", "1_000", "١", "2²"]),
)
SHARING = {"*": {"quantum": 0.25, "split": True}}


def _parsed(options):
    return parse_user_options(
        options, models=[A100], hosts=["gpu-b"], max_count=2, allow_host_choice=False, sharing=SHARING
    )


@PROPERTY
@given(key=st.sampled_from(NUMERIC_OPTIONS), value=hostile_option)
def test_a_hostile_number_in_a_numeric_option_is_refused_naming_it(key, value):
    """Guards docs/reliability.md, "Fuzzing": "in gpu_count or gpu_share (REST or the form) a 400
    naming the option"."""
    with pytest.raises(OptionsError) as exc:
        _parsed({"gpu_model": A100, key: value})
    assert key in str(exc.value) and "\n" not in str(exc.value), exc.value


@PROPERTY
@given(key=st.sampled_from(NUMERIC_OPTIONS), text=form_text)
def test_a_hostile_number_typed_in_the_form_is_refused_naming_it(key, text):
    options = options_from_form({"gpu_model": [A100], key: [text]})
    with pytest.raises(OptionsError) as exc:
        _parsed(options)
    assert key in str(exc.value) and "\n" not in str(exc.value), exc.value


@pytest.mark.parametrize("key", NUMERIC_OPTIONS)
@pytest.mark.parametrize(
    "value",
    [10**400, -(10**400), 10**5000, float("nan"), float("inf"), -float("inf")],
    ids=["10**400", "-10**400", "10**5000", "nan", "inf", "-inf"],
)
async def test_a_hostile_number_at_a_rest_spawn_is_a_400_naming_it_and_reserves_nothing(tmp_path, key, value):
    w = World(tmp_path, max_gpus_per_user=2, gpu_sharing=SHARING)
    spawner = w.spawner("carol", {"gpu_model": A100, key: value})
    with pytest.raises(SpawnException) as exc:
        await w.started(spawner)
    assert exc.value.status_code == 400, exc.value
    assert key in exc.value.jupyterhub_message
    assert "\n" not in exc.value.jupyterhub_message
    assert w.owner.allocator.milli_held_by("carol") == 0 and spawner.service_name not in w.fake.service_names()
