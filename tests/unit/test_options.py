"""user_options validation and the form's conversion (pure, no I/O)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuspawner.options import GPURequest, OptionsError, options_from_form, parse_user_options

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


@given(st.dictionaries(st.text(max_size=12), st.one_of(st.none(), st.integers(), st.text(max_size=20), st.floats(), st.lists(st.integers(), max_size=2)), max_size=4))
def test_anything_is_either_a_valid_request_or_a_clear_refusal(options):
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
