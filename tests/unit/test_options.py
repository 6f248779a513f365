"""user_options validation and the form's conversion (pure, no I/O)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuspawner.core.options import GPURequest, OptionsError, options_from_form, parse_user_options

A100 = "NVIDIA A100 80GB PCIe"
GTX = "NVIDIA GeForce GTX 1070"
MODELS = [A100, GTX]
HOSTS = ["gpu-a", "gpu-b"]


def parse(options, allow_host_choice=False, max_count=2):
    return parse_user_options(
        options, models=MODELS, hosts=HOSTS, max_count=max_count, allow_host_choice=allow_host_choice
    )


@pytest.mark.parametrize(
    "options, expected",
    [
        ({}, GPURequest(model=None, count=0, host=None)),
        (None, GPURequest(model=None, count=0, host=None)),
        ({"gpu_count": 0}, GPURequest(model=None, count=0, host=None)),
        ({"gpu_model": A100}, GPURequest(model=A100, count=1, host=None)),
        ({"gpu_model": GTX, "gpu_count": 2}, GPURequest(model=GTX, count=2, host=None)),
        ({"gpu_count": 1}, GPURequest(model=None, count=1, host=None)),  # any model
        ({"gpu_model": GTX, "gpu_count": "all"}, GPURequest(model=GTX, count="all", host=None)),
    ],
)
def test_valid_options(options, expected):
    assert parse(options) == expected


def test_host_choice_only_when_allowed():
    with pytest.raises(OptionsError, match=r"not enabled on this hub"):
        parse({"gpu_model": A100, "gpu_host": "gpu-b"})
    assert parse({"gpu_model": A100, "gpu_host": "gpu-b"}, allow_host_choice=True).host == "gpu-b"
    with pytest.raises(OptionsError, match=r"Unknown host 'gpu-z'; choose one of: gpu-a, gpu-b"):
        parse({"gpu_model": A100, "gpu_host": "gpu-z"}, allow_host_choice=True)


@pytest.mark.parametrize(
    "options, message",
    [
        ([1, 2], "must be a JSON object"),
        ({"gpu_model": "H100"}, f"Unknown GPU model 'H100'; choose one of: {A100}, {GTX}"),
        ({"gpu_model": 3}, "Unknown GPU model 3"),
        ({"gpu_model": A100, "gpu_count": -1}, "from 0 (CPU-only) to 2"),
        ({"gpu_model": A100, "gpu_count": 1.0}, "got 1.0"),
        ({"gpu_model": A100, "gpu_count": True}, "got True"),
        ({"gpu_model": A100, "gpu_count": "2"}, "got '2'"),
        ({"gpu_model": A100, "gpu_count": 3}, "the limit is 2 per user"),
        ({"gpu_model": A100, "gpu_count": 0}, "gpu_count 0 means CPU-only"),
        ({"gpu_model": A100, "extra": 1}, "Unknown option(s) 'extra'; valid options: gpu_model, gpu_count, gpu_host"),
        ({"gpu_model": "x" * 500}, "..."),  # long values are cut short in the message
    ],
)
def test_invalid_options_name_the_valid_choices(options, message):
    with pytest.raises(OptionsError) as info:
        parse(options)
    assert message in str(info.value)
    assert len(str(info.value)) < 300


@given(
    st.dictionaries(
        st.text(max_size=12),
        st.one_of(st.none(), st.integers(), st.text(max_size=20), st.floats(), st.lists(st.integers(), max_size=2)),
        max_size=4,
    )
)
def test_anything_is_either_a_valid_request_or_a_clear_refusal(options):
    """Guards docs/security.md, "A user": "every key and value validated; unknown keys refused"."""
    try:
        request = parse(options)
    except OptionsError as exc:
        assert str(exc)
        return
    # Whatever passes holds only values from the allowed sets.
    assert request.model in (None, *MODELS)
    assert request.count == "all" or 0 <= request.count <= 2
    assert request.host is None


def test_form_conversion():
    assert options_from_form({"gpu_model": [GTX], "gpu_count": ["2"], "_xsrf": ["t"]}) == {
        "gpu_model": GTX,
        "gpu_count": 2,
    }
    # The CPU-only choice sends an empty model: no GPU, whatever the count says.
    assert options_from_form({"gpu_model": [""], "gpu_count": ["1"]}) == {"gpu_count": 0}
    assert options_from_form({}) == {"gpu_count": 0}
    # Values it can't convert pass through, to be refused with a message at start.
    assert options_from_form({"gpu_model": [GTX], "gpu_count": ["two"]})["gpu_count"] == "two"
    assert options_from_form({"gpu_model": [GTX], "gpu_count": ["²"]})["gpu_count"] == "²"
    assert options_from_form({"gpu_model": [GTX], "gpu_host": [""]}) == {"gpu_model": GTX}


# --------------------------------------------------------------------------
# gpu_share
# --------------------------------------------------------------------------

SHARING = {A100: {"quantum": 0.05, "split": True}, GTX: {"shares": [0.25, 0.5]}}


def parse_share(options, max_count=2, sharing=SHARING, **kw):
    return parse_user_options(
        options,
        models=MODELS,
        hosts=HOSTS,
        max_count=max_count,
        allow_host_choice=kw.get("allow_host_choice", False),
        sharing=sharing,
    )


@pytest.mark.parametrize(
    "options, share",
    [
        ({"gpu_model": A100, "gpu_share": 0.25}, 250),
        ({"gpu_model": A100, "gpu_share": 1.2}, 1200),
        ({"gpu_model": A100, "gpu_share": 1.3}, 1300),
        ({"gpu_model": A100, "gpu_share": 2}, 2000),
        ({"gpu_model": GTX, "gpu_share": 0.5}, 500),
        ({"gpu_share": 0.25}, 250),  # any model that offers it
    ],
)
def test_valid_shares(options, share):
    got = parse_share(options)
    assert got == GPURequest(model=options.get("gpu_model"), count=1, host=None, milli=share)
    assert not got.cpu_only


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"gpu_model": A100, "gpu_share": 0.5, "gpu_count": 1},
            "Give either gpu_count (whole GPUs) or gpu_share (a share of a GPU), not both",
        ),
        ({"gpu_model": A100, "gpu_share": 0.33}, f"0.33 of a GPU is not offered for {A100}; choose a multiple of 0.05"),
        ({"gpu_model": GTX, "gpu_share": 0.75}, f"0.75 of a GPU is not offered for {GTX}; choose one of: 0.25, 0.5"),
        ({"gpu_model": GTX, "gpu_share": 1.5}, f"1.5 of a GPU is not offered for {GTX}"),
        ({"gpu_model": A100, "gpu_share": 0}, "gpu_share must be more than 0"),
        ({"gpu_model": A100, "gpu_share": -0.5}, "gpu_share must be more than 0"),
        ({"gpu_model": A100, "gpu_share": float("nan")}, "gpu_share must be a finite number, got nan"),
        ({"gpu_model": A100, "gpu_share": float("inf")}, "gpu_share must be a finite number, got inf"),
        ({"gpu_model": A100, "gpu_share": True}, "gpu_share must be a number such as 0.5, got True"),
        ({"gpu_model": A100, "gpu_share": "0.5"}, "gpu_share must be a number such as 0.5, got '0.5'"),
        ({"gpu_model": A100, "gpu_share": None}, "gpu_share must be a number such as 0.5, got None"),
        ({"gpu_model": A100, "gpu_share": 0.0001}, "gpu_share must be a multiple of 0.001, got 0.0001"),
        ({"gpu_model": A100, "gpu_share": 2.5}, "2.5 of a GPU requested; the limit is 2 per user"),
        ({"gpu_share": 0.33}, f"0.33 of a GPU is not offered by any model; offered: {A100}: multiples of 0.05, split"),
        ({"gpu_model": "H100", "gpu_share": 0.5}, "Unknown GPU model 'H100'"),
        ({"gpu_model": A100, "gpu_share": 0.5, "gpu_host": "gpu-a"}, "Choosing a host (gpu_host) is not enabled"),
    ],
)
def test_invalid_shares_are_refused_with_a_message(options, message):
    with pytest.raises(OptionsError) as info:
        parse_share(options)
    assert message in str(info.value)


def test_share_needs_sharing_enabled():
    with pytest.raises(OptionsError, match="GPU sharing is not enabled on this hub; ask for whole GPUs"):
        parse_share({"gpu_share": 0.5}, sharing=None)
    with pytest.raises(OptionsError, match=f"{GTX} is not shared on this hub"):
        parse_share({"gpu_model": GTX, "gpu_share": 0.5}, sharing={A100: {"quantum": 0.5}})
    with pytest.raises(OptionsError, match="splitting over several devices is not enabled"):
        parse_share({"gpu_model": A100, "gpu_share": 1.5}, sharing={A100: {"quantum": 0.5}})


def test_valid_options_are_named_by_what_the_hub_offers():
    with pytest.raises(OptionsError, match="valid options: gpu_model, gpu_count, gpu_host, gpu_share, gpu_wait$"):
        parse_share({"extra": 1})
    with pytest.raises(OptionsError, match="valid options: gpu_model, gpu_count, gpu_host, gpu_wait$"):
        parse_share({"extra": 1}, sharing=None)


def test_pinned_share():
    got = parse_share({"gpu_model": A100, "gpu_share": 0.5, "gpu_host": "gpu-b"}, allow_host_choice=True)
    assert got.host == "gpu-b" and got.milli == 500


def test_form_conversion_of_a_share():
    # The form sends its count field too: a chosen share replaces it.
    assert options_from_form({"gpu_model": [A100], "gpu_count": ["1"], "gpu_share": ["0.25"]}) == {
        "gpu_model": A100,
        "gpu_share": 0.25,
    }
    # An empty share choice means whole GPUs.
    assert options_from_form({"gpu_model": [A100], "gpu_count": ["2"], "gpu_share": [""]}) == {
        "gpu_model": A100,
        "gpu_count": 2,
    }
    # The CPU-only choice wins over a share.
    assert options_from_form({"gpu_model": [""], "gpu_share": ["0.5"]}) == {"gpu_count": 0}
    # What it can't read passes through, to be refused with a message.
    assert options_from_form({"gpu_model": [A100], "gpu_share": ["half"]})["gpu_share"] == "half"
    assert options_from_form({"gpu_model": [A100], "gpu_share": ["nan"]})["gpu_share"] == "nan"
    form = options_from_form({"gpu_model": [A100], "gpu_share": ["1.3"]})
    assert parse_share(form).milli == 1300


@given(
    st.dictionaries(
        st.sampled_from(["gpu_model", "gpu_count", "gpu_host", "gpu_share", "x"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-2, 3),
            st.floats(),
            st.text(max_size=8),
            st.sampled_from([A100, GTX, 0.25, 0.5, 1.2, 0.05]),
        ),
        max_size=4,
    )
)
def test_anything_with_shares_is_either_valid_or_a_clear_refusal(options):
    try:
        request = parse_share(options)
    except OptionsError as exc:
        assert str(exc) and len(str(exc)) < 300
        return
    assert request.model in (None, *MODELS) and request.host is None
    if request.milli is not None:
        assert type(request.milli) is int and 0 < request.milli <= 2000  # whole thousandths
        assert "gpu_count" not in options


# -- gpu_wait ---------------------------------------------------------------------


def test_gpu_wait_is_read_for_whole_gpus_and_shares():
    assert parse({"gpu_model": A100, "gpu_count": 2, "gpu_wait": True}).wait is True
    assert parse({"gpu_model": A100}).wait is False
    assert parse_share({"gpu_model": A100, "gpu_share": 0.5, "gpu_wait": True}).wait is True
    # CPU-only never waits: the checkbox ticked with "No GPU" changes nothing.
    assert parse({"gpu_count": 0, "gpu_wait": True}).wait is False


@pytest.mark.parametrize(
    "options, message",
    [
        ({"gpu_model": A100, "gpu_wait": "yes"}, "gpu_wait must be true or false; got 'yes'"),
        ({"gpu_model": A100, "gpu_wait": 1}, "gpu_wait must be true or false; got 1"),
        ({"gpu_count": 1, "gpu_wait": True}, "gpu_wait needs gpu_model: a line is per GPU model"),
    ],
)
def test_bad_gpu_wait_is_refused_with_a_clear_message(options, message):
    with pytest.raises(OptionsError) as exc:
        parse(options)
    assert str(exc.value) == message


def test_the_forms_wait_checkbox_becomes_a_boolean():
    assert options_from_form({"gpu_model": [A100], "gpu_count": ["1"], "gpu_wait": ["on"]})["gpu_wait"] is True
    assert "gpu_wait" not in options_from_form({"gpu_model": [A100], "gpu_count": ["1"]})


def by_form(wait: str) -> dict:
    return options_from_form({"gpu_model": [A100], "gpu_count": ["1"], "gpu_wait": [wait]})


@pytest.mark.parametrize("bad", ["maybe", "yes", "1", "", "True", "ON", "on on"])
def test_the_form_and_the_rest_api_refuse_the_same_bad_gpu_wait_with_the_same_message(bad):
    """The form's text goes through the REST API's one check: not taken as "do not wait"."""
    with pytest.raises(OptionsError) as rest:
        parse({"gpu_model": A100, "gpu_count": 1, "gpu_wait": bad})
    with pytest.raises(OptionsError) as form:
        parse(by_form(bad))
    assert str(form.value) == str(rest.value) == f"gpu_wait must be true or false; got {bad!r}"


@pytest.mark.parametrize("text, value", [("on", True), ("true", True), ("false", False), (" on ", True)])
def test_the_form_and_the_rest_api_accept_the_same_good_gpu_wait(text, value):
    assert parse(by_form(text)) == parse({"gpu_model": A100, "gpu_count": 1, "gpu_wait": value})
    assert parse(by_form(text)).wait is value
