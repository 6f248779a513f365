"""Bad input found by review: each answers with its module's error and one sentence.

Guards docs/reliability.md, "Fuzzing": "all fixed first and each pinned by a test"."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from tornado import web

from gpuspawner.core.reports import MAX_CONTAINERS, MAX_DEPTH, ReportError, parse_report
from gpuspawner.ledger.ledger import Ledger
from gpuspawner.web.api import _time_arg

REPORT = {
    "hostname": "node1",
    "interval": 10,
    "devices": [
        {
            "index": 0,
            "uuid": "GPU-1",
            "name": "NVIDIA A100",
            "memory_total_mib": 81920,
            "mig_mode": True,
            "processes": [{"pid": 1, "used_mib": 2}],
            "mig_devices": [{"index": 0, "uuid": "MIG-1", "profile": "1g.10gb", "memory_total_mib": 9728}],
        }
    ],
}


def test_a_full_report_fits_the_depth_limit():
    assert parse_report(json.dumps(REPORT)).devices[0].mig_devices[0].profile == "1g.10gb"


@pytest.mark.parametrize(
    "body",
    [
        "[" * 100_000 + "]" * 100_000,  # 200 KB: under the size limit
        b'{"a":' * 40_000 + b"1" + b"}" * 40_000,
        "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
        "[" + "[]," * MAX_CONTAINERS + "[]]",
    ],
)
def test_deep_or_crowded_reports_are_refused_before_decoding(body):
    """Guards docs/security.md, "A node's agent token": "size, depth and count limits checked before
    decoding"."""
    with pytest.raises(ReportError, match="nested more than|objects and lists") as err:
        parse_report(body)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("unit", ['\\"[', '"[', '"\\', "\\\\", '{"a":', "["])
def test_the_shape_check_is_linear_for_a_full_body_of_anything(unit):
    import time

    from gpuspawner.core.reports import MAX_REPORT_BYTES

    body = unit * (MAX_REPORT_BYTES // len(unit))
    start = time.perf_counter()
    with pytest.raises(ReportError):
        parse_report(body)
    assert time.perf_counter() - start < 0.5  # quadratic rescans took seconds


def test_brackets_inside_strings_do_not_count():
    report = dict(REPORT, driver_version="[[[[[[[[[[{{{{{{{{{{")
    assert parse_report(json.dumps(report)).driver_version.startswith("[[[")


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xfe\xfa",
        '{"hostname": "node1", "interval": 1' + "0" * 5000 + "}",
        json.dumps(dict(REPORT, driver_version="\ud800")),
        json.dumps(dict(REPORT, agent_version="a\nb")),
    ],
)
def test_undecodable_huge_or_unprintable_values_are_refused(body):
    with pytest.raises(ReportError):
        parse_report(body)


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00"])
def test_usage_times_outside_utc_years_are_400(text):
    """Guards docs/security.md, "A user": "cause a 500 with out-of-range times" and "api._time_arg (400
    with a sentence)"."""
    with pytest.raises(web.HTTPError) as err:
        _time_arg(text)
    assert err.value.status_code == 400 and "out of range" in err.value.log_message


def test_usage_times_at_the_edges_are_taken():
    assert _time_arg("0001-01-01T00:00:00Z").year == 1
    assert _time_arg("9999-12-31T23:59:59").tzinfo is timezone.utc


def test_the_ledger_refuses_times_outside_utc_years(tmp_path):
    db = Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    since = datetime.fromisoformat("0001-01-01T00:00:00+05:00")
    with pytest.raises(ValueError, match="out of range"):
        db.usage(since, None, "user")


# -- options -------------------------------------------------------------------

from decimal import Decimal  # noqa: E402

from gpuspawner.core.options import OptionsError, options_from_form, parse_user_options  # noqa: E402
from gpuspawner.core.sharing import shown  # noqa: E402

SHARED = {"*": {"shares": [0.25, 0.5]}}


@pytest.mark.parametrize("field", ["gpu_count", "gpu_share"])
def test_a_form_number_of_5000_digits_is_passed_on_as_text(field):
    options = options_from_form({"gpu_model": ["A100"], field: ["1" * 5000]})
    assert options[field] == "1" * 5000
    with pytest.raises(OptionsError, match=f"^{field} must be"):
        parse_user_options(options, models=["A100"], hosts=[], max_count=2, allow_host_choice=False, sharing=SHARED)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"gpu_count": 10**5000}, "gpu_count a number of about 5000 digits requested; the limit is 2"),
        ({"gpu_share": 10**5000}, "gpu_share must be at most"),
        ({"gpu_share": Decimal("1e999999")}, "gpu_share must be at most"),
        ({"gpu_share": float("1e308")}, "gpu_share must be at most"),
        ({"gpu_share": float("nan")}, "gpu_share must be a finite number"),
        ({"gpu_share": float("-inf")}, "gpu_share must be a finite number"),
        ({"gpu_count": "١"}, "gpu_count must be a whole number"),  # an Arabic-Indic one
    ],
)
def test_huge_or_odd_numbers_in_rest_options_are_refused(options, message):
    with pytest.raises(OptionsError, match=message):
        parse_user_options(options, models=["A100"], hosts=[], max_count=2, allow_host_choice=False, sharing=SHARED)


def test_shown_never_raises():
    assert shown(10**5000) == "a number of about 5000 digits"
    assert shown(12) == "12"


# -- database URLs in messages ---------------------------------------------------------

from gpuspawner.hub.settings import validate_config  # noqa: E402
from gpuspawner.ledger.ledger import LedgerError  # noqa: E402
from gpuspawner.ledger.url import safe_url  # noqa: E402


@pytest.mark.parametrize(
    "url, shown_as",
    [
        ("postgresql+psycopg://u@h/db?password=secret", "postgresql+psycopg://u@h/db?password=***"),
        ("postgresql+psycopg://u:secret@h/db", "postgresql+psycopg://u:***@h/db"),
        (
            "postgresql://u:secret@h/db?PASSWD=secret&pwd=secret;sslpassword=secret&sslmode=require",
            "postgresql://u:***@h/db?PASSWD=***&pwd=***;sslpassword=***&sslmode=require",
        ),
        (
            "postgresql://h/db?Token=secret&client_secret=secret&pass%77ord=secret",
            "postgresql://h/db?Token=***&client_secret=***&pass%77ord=***",
        ),
        ("postgresql://u:sec@ret@h/db", "postgresql://u:***@h/db"),  # an unescaped @: hidden whole
        ("postgresql://u:secret@h:port/db", "postgresql://u:***@h:port/db"),  # SQLAlchemy cannot parse it
        ("sqlite:////srv/hub/gpuspawner.sqlite", "sqlite:////srv/hub/gpuspawner.sqlite"),
    ],
)
def test_safe_url_hides_passwords_wherever_they_sit(url, shown_as):
    """Guards docs/security.md, "An admin (of JupyterHub, or its configuration)": "it is masked in
    userinfo and in query parameters"."""
    assert safe_url(url) == shown_as


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://u@h:port/db?password=secret",
        "nosuchdialect://u:secret@h/db",
        "postgresql+nosuchdriver://u@h/db?sslpassword=secret",
    ],
)
def test_ledger_and_config_errors_never_show_the_password(url):
    """Guards docs/security.md, "An admin (of JupyterHub, or its configuration)": "see that password in
    a log line or an error message"."""
    with pytest.raises(LedgerError) as err:
        Ledger(url)
    assert "secret" not in str(err.value) and "***" in str(err.value)
    with pytest.raises(SystemExit) as exit_:
        validate_config({"GPUSwarmSpawner": {"gpu_db_url": url}})
    assert "secret" not in str(exit_.value)


@pytest.mark.filterwarnings("ignore:Query string argument")
def test_a_failing_database_names_itself_without_the_password(tmp_path):
    missing = tmp_path / "no" / "such" / "dir" / "l.sqlite"
    db = Ledger(f"sqlite:///{missing}?password=secret")
    with pytest.raises(LedgerError) as err:
        db.usage(None, None, "user")
    assert "secret" not in str(err.value) and "password=***" in str(err.value)


@pytest.mark.parametrize(
    "traits, message",
    [
        ({"gpu_inventory": 1}, "gpu_inventory must be a dict or the path"),
        ({"gpu_inventory": [1]}, "gpu_inventory must be a dict or the path"),
        ({"gpu_model_aliases": None}, "gpu_model_aliases must be a mapping"),
        ({"allocation_policy": []}, "Unknown allocation_policy"),
    ],
)
def test_config_of_the_wrong_type_stops_the_hub_with_one_line(traits, message):
    with pytest.raises(SystemExit, match=message) as exit_:
        validate_config({"GPUSwarmSpawner": traits})
    assert "\n" not in str(exit_.value)
