"""Hostile numbers (an integer beyond a float's range, NaN, infinity, bools) in agents'
reports and in the admin's config are refused like any bad value: a 400 or the one-line
configuration error, never an OverflowError traceback. Pure unit tests, no fakes."""

from __future__ import annotations

import json

import pytest
from traitlets.config import Config

from gpuspawner.core.numbers import finite
from gpuspawner.core.reports import ReportError, parse_report
from gpuspawner.hub.settings import validate_config
from tests.unit.test_reports import device, report

HUGE = 10**400
INVENTORY = {"gpu-b": [{"uuid": "GPU-b0", "model": "NVIDIA A100 80GB PCIe", "memory_mib": 81920}]}


@pytest.mark.parametrize("value", [HUGE, -HUGE, float("nan"), float("inf"), True, "1", None])
def test_only_finite_numbers_are_numbers(value):
    assert finite(value) is None


def test_finite_numbers_come_back_as_floats():
    assert finite(3) == 3.0 and finite(2.5) == 2.5 and finite(10**300) == float(10**300)


@pytest.mark.parametrize("field", ["interval", "temperature_c"])
def test_a_report_with_a_huge_integer_is_refused_as_a_bad_report(field):
    body = report(device(0, "GPU-b0"))
    if field == "interval":
        body["interval"] = HUGE
    else:
        body["devices"][0]["temperature_c"] = HUGE
    with pytest.raises(ReportError, match=field):
        parse_report(json.dumps(body))


@pytest.mark.parametrize(
    "setting, value, says",
    [
        ("gpu_access", {"students": {"max_hours": HUGE}}, "gpu_access['students']['max_hours'] must be a number"),
        ("gpu_idle_timeout", HUGE, "gpu_idle_timeout"),
        ("gpu_max_hours", HUGE, "gpu_max_hours"),
        ("gpu_idle_threshold", {"utilization": HUGE}, "gpu_idle_threshold['utilization'] must be a number"),
        ("gpu_max_temperature", HUGE, "gpu_max_temperature must be a temperature in °C from 0 up to 500, got a number"),
        (
            "gpu_max_temperature",
            float("nan"),
            "gpu_max_temperature must be a temperature in °C from 0 up to 500, got nan",
        ),
        (
            "agent_stale_intervals",
            float("inf"),
            "agent_stale_intervals must be a number of intervals from 1 up to 1000",
        ),
    ],
)
def test_a_huge_number_in_the_config_is_the_one_line_configuration_error(setting, value, says):
    c = Config()
    c.GPUSwarmSpawner.gpu_inventory = INVENTORY
    setattr(c.GPUSwarmSpawner, setting, value)
    with pytest.raises(SystemExit) as exc:
        validate_config(c)
    assert str(exc.value).startswith("gpuspawner configuration error") and says in str(exc.value), exc.value
