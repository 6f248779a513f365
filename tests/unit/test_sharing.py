"""Share arithmetic and the admin's sharing policy (pure)."""

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuspawner.core.sharing import ModelSharing, SharingPolicy, fmt, fmt_list, split_evenly, to_milli

A100 = "NVIDIA A100 80GB PCIe"
GTX = "NVIDIA GeForce GTX 1070"


@pytest.mark.parametrize(
    "value, milli",
    [
        (0.25, 250),
        (0.1, 100),
        (1.2, 1200),
        (1.3, 1300),
        (2, 2000),
        (0.001, 1),
        (Fraction(3, 5), 600),
        (Decimal("0.65"), 650),
        (0.7 - 0.1, 600),
        (1 - 0.4, 600),
    ],
)
def test_to_milli_is_exact(value, milli):
    assert to_milli(value) == milli


@pytest.mark.parametrize(
    "value, message",
    [
        (True, "must be a number such as 0.5, got True"),
        ("0.5", "must be a number such as 0.5, got '0.5'"),
        (None, "got None"),
        ([0.5], "got [0.5]"),
        (float("nan"), "must be a finite number, got nan"),
        (float("inf"), "must be a finite number, got inf"),
        (Decimal("NaN"), "must be a finite number"),
        (0.0005, "must be a multiple of 0.001, got 0.0005"),
        (Fraction(1, 3), "must be a multiple of 0.001"),
        (0.1 + 0.2, "must be a multiple of 0.001, got 0.30000000000000004"),
    ],
)
def test_to_milli_refuses_with_a_message(value, message):
    with pytest.raises(ValueError) as info:
        to_milli(value, "gpu_share")
    assert message in str(info.value) and str(info.value).startswith("gpu_share")


@pytest.mark.parametrize(
    "milli, text", [(600, "0.6"), (1000, "1"), (1650, "1.65"), (5, "0.005"), (0, "0"), (2050, "2.05")]
)
def test_fmt_prints_the_shortest_decimal(milli, text):
    assert fmt(milli) == text
    assert to_milli(Decimal(text)) == milli


def test_fmt_list():
    assert fmt_list([600, 600]) == "0.6,0.6"


@pytest.mark.parametrize(
    "total, n, quantum, pieces",
    [
        (1200, 2, 50, (600, 600)),  # Backend.AI's vector: 1.2 -> 0.6 + 0.6
        (1300, 2, 50, (650, 650)),  # 1.3 -> 0.65 + 0.65 with quantum 0.05
        (1300, 2, 100, (700, 600)),  # as even as the quantum allows; the sum stays exact
        (1000, 3, 50, (350, 350, 300)),
        (2000, 2, 250, (1000, 1000)),
        (1200, 1, 50, None),  # a piece would be more than a device
        (100, 3, 50, None),  # a piece would be below the quantum
    ],
)
def test_split_evenly(total, n, quantum, pieces):
    assert split_evenly(total, n, quantum) == pieces


@given(quantum=st.sampled_from([1, 10, 50, 100, 200, 250, 500, 1000]), units=st.integers(1, 80), n=st.integers(1, 8))
def test_split_evenly_properties(quantum, units, n):
    """Guards docs/sharing.md, "The rules": "pieces differ by at most one quantum; the total is always
    exactly what was asked"."""
    total = units * quantum
    pieces = split_evenly(total, n, quantum)
    if pieces is None:
        assert total > n * 1000 or units < n
        return
    assert sum(pieces) == total and len(pieces) == n
    assert all(p % quantum == 0 and 0 < p <= 1000 for p in pieces)
    assert max(pieces) - min(pieces) <= quantum and list(pieces) == sorted(pieces, reverse=True)


def test_policy_per_model_with_a_default_and_an_exception():
    policy = SharingPolicy.parse(
        {
            A100: {"quantum": 0.05, "split": True},
            "*": {"shares": [0.5, 0.25]},
            GTX: None,
        }
    )
    assert policy.enabled
    assert policy.for_model(A100) == ModelSharing(quantum=50, allowed=None, split=True)
    assert policy.for_model("NVIDIA Tesla T4") == ModelSharing(quantum=250, allowed=(250, 500), split=False)
    assert policy.for_model(GTX) is None
    assert policy.shareable([A100, GTX, "NVIDIA Tesla T4"]) == [A100, "NVIDIA Tesla T4"]


def test_default_is_whole_gpus_only():
    for policy in (SharingPolicy.parse(None), SharingPolicy.parse({}), SharingPolicy()):
        assert not policy.enabled and policy.for_model(A100) is None
    assert not SharingPolicy.parse({A100: None, "*": False}).enabled


def test_quantum_of_an_allowed_list_is_their_common_divisor():
    assert SharingPolicy.parse({"*": {"shares": [0.2, 1.2], "split": True}}).for_model(A100).quantum == 200
    assert SharingPolicy.parse({"*": {"shares": [0.3]}}).for_model(A100).quantum == 100


@pytest.mark.parametrize(
    "config, message",
    [
        ([A100], "must be a mapping of GPU model"),
        ({A100: 0.5}, f"gpu_sharing['{A100}']: expected a mapping with quantum, shares, split"),
        ({A100: {"quantum": 0.3}}, "quantum must divide 1 GPU evenly (e.g. 0.05, 0.1, 0.25, 0.5), got 0.3"),
        ({A100: {"quantum": 0}}, "quantum must divide 1 GPU evenly"),
        ({A100: {"quantum": "0.1"}}, "quantum must be a number such as 0.5, got '0.1'"),
        ({A100: {"quantum": 0.0001}}, "quantum must be a multiple of 0.001"),
        ({A100: {"quantum": 0.25, "shares": [0.3]}}, "share 0.3 is not a multiple of the quantum 0.25"),
        ({A100: {"shares": [1.5]}}, "share 1.5 is more than one GPU; it needs split: True"),
        ({A100: {"shares": []}}, "shares is empty"),
        ({A100: {"shares": "0.5"}}, "shares must be a list of numbers"),
        ({A100: {"shares": [-0.5]}}, "shares must be more than 0, got -0.5"),
        ({A100: {"split": True}}, "give a quantum (e.g. 0.25) or a list of shares"),
        ({A100: {"quantum": 0.5, "split": "yes"}}, "split must be true or false, got 'yes'"),
        ({A100: {"quantum": 0.5, "split": True, "uneven": 1}}, "uneven must be true or false, got 1"),
        ({A100: {"quantum": 0.5, "uneven": True}}, "uneven splits need split: True"),
        ({A100: {"quantum": 0.5, "split": True, "split_small": "on"}}, "split_small must be true or false, got 'on'"),
        ({A100: {"quantum": 0.5, "split_small": True}}, "split_small needs split: True"),
        ({A100: {"quantum": 0.5, "fraction": 1}}, "unknown key(s) fraction; valid keys: quantum, shares, split"),
        ({"": {"quantum": 0.5}}, "'' is not a GPU model name"),
    ],
)
def test_bad_policies_are_refused_naming_the_entry(config, message):
    with pytest.raises(ValueError) as info:
        SharingPolicy.parse(config)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "sharing, share, reason",
    [
        (ModelSharing(50), 250, None),
        (ModelSharing(50), 330, f"0.33 of a GPU is not offered for {A100}; choose a multiple of 0.05"),
        (ModelSharing(250, (250, 500)), 750, f"0.75 of a GPU is not offered for {A100}; choose one of: 0.25, 0.5"),
        (
            ModelSharing(50),
            1200,
            "shares of NVIDIA A100 80GB PCIe are at most 1 GPU (splitting over several devices is not enabled)",
        ),
        (ModelSharing(50, split=True), 1200, None),
        (ModelSharing(50), 0, "gpu_share must be more than 0"),
        (ModelSharing(50), -250, "gpu_share must be more than 0"),
    ],
)
def test_model_refusal(sharing, share, reason):
    got = sharing.refusal(share, A100)
    assert got == reason if reason is None else reason in got


def test_accepting_names_what_is_offered():
    policy = SharingPolicy.parse({A100: {"quantum": 0.25}, "NVIDIA Tesla T4": {"shares": [0.5]}})
    assert policy.accepting(500, None, [A100, GTX, "NVIDIA Tesla T4"]) == [A100, "NVIDIA Tesla T4"]
    assert policy.accepting(250, None, [A100, GTX]) == [A100]
    with pytest.raises(ValueError, match=f"{GTX} is not shared on this hub; ask for whole GPUs"):
        policy.accepting(500, GTX, [A100, GTX])
    with pytest.raises(ValueError) as info:
        policy.accepting(100, None, [A100, GTX, "NVIDIA Tesla T4"])
    assert str(info.value) == (
        f"0.1 of a GPU is not offered by any model; offered: {A100}: multiples of 0.25; NVIDIA Tesla T4: one of 0.5"
    )
    with pytest.raises(ValueError, match="GPU sharing is not enabled on this hub"):
        SharingPolicy().accepting(500, None, [A100])


def test_split_small_is_parsed_and_says_which_shares_may_span_devices():
    policy = SharingPolicy.parse({A100: {"quantum": 0.05, "split": True, "split_small": True}, "*": {"quantum": 0.05}})
    small, plain = policy.for_model(A100), policy.for_model("other")
    assert small == ModelSharing(50, split=True, split_small=True)
    assert [small.spans(m) for m in (500, 1000, 1200)] == [True, True, True]
    split = SharingPolicy.parse({A100: {"quantum": 0.05, "split": True}}).for_model(A100)
    assert [split.spans(m) for m in (500, 1000, 1200)] == [False, False, True]
    assert not plain.spans(1200)
    assert small.describe() == "multiples of 0.05, split over devices of one host (also shares of at most 1 GPU)"
