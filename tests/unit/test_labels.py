"""Service labels: what the hub writes reads back as written, and what anyone
else may have written is refused with one short line, quickly (pure)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.core.inventory import HOSTNAME_RE, MODEL_RE, UUID_RE
from gpuspawner.core.labels import MAX_DEVICES, MAX_NAME, Held, LabelError, parse_labels, parse_share, to_labels

A100 = "NVIDIA A100 80GB PCIe"
SHARED = Held(user="bob", server="", host="gpu-a", uuids=("GPU-1", "GPU-2"), model=A100, port=20001, milli=(600, 600))
LABELS = to_labels(SHARED)
MB = 2**20


def test_the_labels_of_a_shared_holding():
    assert LABELS == {
        "gpuspawner.user": "bob",
        "gpuspawner.server": "",
        "gpuspawner.host": "gpu-a",
        "gpuspawner.devices": "GPU-1,GPU-2",
        "gpuspawner.model": A100,
        "gpuspawner.port": "20001",
        "gpuspawner.shares": "0.6,0.6",
    }
    assert parse_labels(LABELS) == SHARED and SHARED.shared


def test_whole_holdings_and_older_services_have_no_shares_label():
    whole = Held(user="ann", server="gpu", host="gpu-b", uuids=("GPU-3",), model=A100, port=None)
    assert "gpuspawner.shares" not in to_labels(whole) and "gpuspawner.port" not in to_labels(whole)
    old = {
        "gpuspawner.user": "ann",
        "gpuspawner.devices": "GPU-1",
        "gpuspawner.host": "gpu-a",
        "gpuspawner.model": A100,
    }
    assert parse_labels(old).milli == (1000,) * len(parse_labels(old).uuids) and not parse_labels(old).shared


def test_whole_pieces_are_not_shared():
    assert not Held("a", "", "h", ("GPU-1", "GPU-2"), A100, None, milli=(1000, 1000)).shared
    assert Held("a", "", "h", ("GPU-1", "GPU-2"), A100, None, milli=(1000, 500)).shared


def test_cpu_only_servers_may_be_pinned_or_not():
    for host in ("", "gpu-a"):
        cpu = Held(user="ann", server="", host=host, uuids=(), model="", port=None)
        assert to_labels(cpu)["gpuspawner.devices"] == "" and parse_labels(to_labels(cpu)) == cpu


def test_not_ours_and_unknown_labels():
    assert parse_labels({}) is None
    assert parse_labels({"gpuspawner.user": "bob", "team": "ml"}) is None  # no gpuspawner.devices
    assert parse_labels({**LABELS, "gpuspawner.future": "x" * MB, "team": "ml"}) == SHARED


def test_user_and_server_names_may_be_unicode():
    s = Held(user="jürgen-名前", server="ñ ü", host="", uuids=(), model="", port=None)
    assert parse_labels(to_labels(s)) == s


@pytest.mark.parametrize("text, milli", [("0.6", 600), ("1", 1000), ("0.125", 125), ("1.000", 1000), ("00.5", 500)])
def test_parse_share(text, milli):
    assert parse_share(text) == milli


@pytest.mark.parametrize("text", ["3/5", "0", "1.5", "0.0001", "", None, "1e0", "0.5 "])
def test_parse_share_refuses(text):
    with pytest.raises(LabelError, match="gpuspawner.shares"):
        parse_share(text)


@pytest.mark.parametrize(
    "bad",
    [
        Held("bob", "", "gpu-a", ("GPU-1",), A100, None, milli=(0,)),
        Held("bob", "", "gpu-a", ("GPU-1",), A100, None, milli=(1500,)),
        Held("bob", "", "gpu-a", ("GPU-1", "GPU-2"), A100, None, milli=(500,)),
        Held("bob", "", "gpu-a", ("GPU-1,GPU-2",), A100, None),  # would read back as two devices
        Held("bob", "", "gpu-a", ("GPU-1",), A100, 0),
        Held("bob\n", "", "", (), "", None),
    ],
)
def test_the_hub_never_writes_labels_it_would_refuse(bad):
    with pytest.raises(LabelError):
        to_labels(bad)


# --------------------------------------------------------------------------
# Round trip: every valid holding
# --------------------------------------------------------------------------

names = st.characters(blacklist_categories=("Cc", "Cs"))  # Cc: C0, DEL and C1 controls; Cs: surrogates


@st.composite
def server_labels(draw) -> Held:
    uuids = tuple(draw(st.lists(st.from_regex(UUID_RE, fullmatch=True), max_size=MAX_DEVICES, unique=True)))
    pinned = st.from_regex(HOSTNAME_RE, fullmatch=True)
    model = st.from_regex(MODEL_RE, fullmatch=True)
    milli = st.just(())  # left out: every device whole
    if uuids:
        milli = milli | st.lists(st.integers(1, 1000), min_size=len(uuids), max_size=len(uuids)).map(tuple)
    return Held(
        user=draw(st.text(names, min_size=1, max_size=MAX_NAME)),
        server=draw(st.text(names, max_size=MAX_NAME)),
        host=draw(pinned if uuids else st.just("") | pinned),
        uuids=uuids,
        model=draw(model if uuids else st.just("") | model),
        port=draw(st.none() | st.integers(1, 65535)),
        milli=draw(milli),
    )


@settings(max_examples=200, deadline=None, database=None)
@given(server_labels())
def test_any_valid_holding_reads_back_as_written(s):
    assert parse_labels(to_labels(s)) == s


# --------------------------------------------------------------------------
# Hostile labels: each refused, naming the label, in one short line
# --------------------------------------------------------------------------

DROP = object()  # the label is absent

HOSTILE = [
    # shares
    ("gpuspawner.shares", "inf,inf"),
    ("gpuspawner.shares", "nan,nan"),
    ("gpuspawner.shares", "1e10000000,1e10000000"),
    ("gpuspawner.shares", "-0.5,0.5"),
    ("gpuspawner.shares", "+0.5,0.5"),
    ("gpuspawner.shares", "0,0.5"),
    ("gpuspawner.shares", "1.5,0.5"),
    ("gpuspawner.shares", "0.0001,0.5"),
    ("gpuspawner.shares", "0.6,lots"),
    ("gpuspawner.shares", "0.6"),  # one share for two devices
    ("gpuspawner.shares", "0.6,0.6,0.6"),
    ("gpuspawner.shares", ""),
    ("gpuspawner.shares", " 0.6,0.6"),
    ("gpuspawner.shares", ".5,0.5"),
    ("gpuspawner.shares", "0.5_0,0.5"),
    ("gpuspawner.shares", "٠.٥,0.5"),  # Arabic-Indic digits
    ("gpuspawner.shares", "0." + "0" * 300 + "1,0.5"),
    ("gpuspawner.shares", "0.5," * (MB // 4)),
    # port
    ("gpuspawner.port", "٨٠٨٠"),  # Arabic-Indic digits: str.isdigit() says yes
    ("gpuspawner.port", "８０８０"),  # fullwidth digits
    ("gpuspawner.port", "0"),
    ("gpuspawner.port", "65536"),
    ("gpuspawner.port", "+80"),
    ("gpuspawner.port", "-80"),
    ("gpuspawner.port", " 80"),
    ("gpuspawner.port", "80\n"),
    ("gpuspawner.port", "1e3"),
    ("gpuspawner.port", "0x50"),
    ("gpuspawner.port", ""),
    ("gpuspawner.port", "1" * 100),
    ("gpuspawner.port", 8080),  # not text
    # user and server
    ("gpuspawner.user", DROP),
    ("gpuspawner.user", ""),
    ("gpuspawner.user", "bo\x00b"),
    ("gpuspawner.user", "bob\n"),
    ("gpuspawner.user", "bob\x85"),  # C1 control
    ("gpuspawner.user", "bob\x7f"),
    ("gpuspawner.user", "bob\ud800"),  # a lone surrogate
    ("gpuspawner.user", "b" * (MAX_NAME + 1)),
    ("gpuspawner.user", "b" * MB),
    ("gpuspawner.user", None),
    ("gpuspawner.server", "lab\r"),
    ("gpuspawner.server", "s" * MB),
    # devices
    ("gpuspawner.devices", "GPU-1,GPU-1"),
    ("gpuspawner.devices", "GPU-1,not-a-uuid"),
    ("gpuspawner.devices", "GPU-1,"),
    ("gpuspawner.devices", "GPU-1, GPU-2"),
    ("gpuspawner.devices", "GPU-1\n,GPU-2"),
    ("gpuspawner.devices", ",".join(f"GPU-{i}" for i in range(MAX_DEVICES + 1))),
    ("gpuspawner.devices", "GPU-" + "a" * MB),
    ("gpuspawner.devices", "," * MB),
    # host and model
    ("gpuspawner.host", DROP),
    ("gpuspawner.host", ""),
    ("gpuspawner.host", "-gpu"),
    ("gpuspawner.host", "gpu a"),
    ("gpuspawner.host", "h" * MB),
    ("gpuspawner.model", DROP),
    ("gpuspawner.model", "A100\nGPU"),
    ("gpuspawner.model", "A100, T4"),
    ("gpuspawner.model", "m" * MB),
]


def hostile(label, value) -> dict:
    labels = dict(LABELS)
    if value is DROP:
        del labels[label]
    else:
        labels[label] = value
    return labels


def refusal(labels) -> str:
    with pytest.raises(LabelError) as info:
        parse_labels(labels)
    return str(info.value)


@pytest.mark.parametrize("label, value", HOSTILE, ids=lambda v: repr(v)[:30] if isinstance(v, str) else None)
def test_hostile_labels_are_refused_naming_the_label_in_one_short_line(label, value):
    """Guards docs/security.md, "Anyone with access to the swarm manager's API": "write hostile
    labels"."""
    message = refusal(hostile(label, value))
    assert label in message
    assert "\n" not in message and "\r" not in message and len(message) < 300


def test_shares_without_devices_are_refused():
    cpu = to_labels(Held(user="bob", server="", host="", uuids=(), model="", port=None))
    assert "gpuspawner.shares" in refusal({**cpu, "gpuspawner.shares": "1"})


def test_an_empty_devices_label_is_not_a_share_of_nothing():
    assert "gpuspawner.shares" in refusal({**LABELS, "gpuspawner.devices": "", "gpuspawner.host": ""})


def test_parsing_hostile_labels_never_hangs():
    """A hang guard, not a speed test: megabytes of hostile labels, each read
    in bounded work (the old reader spent seconds on a share of 1e10000000).

    Guards docs/security.md, "Anyone with access to the swarm manager's API": "stop or stall the
    hub's rebuild"."""
    heavy = [hostile(label, value) for label, value in HOSTILE]
    heavy += [{key: value * (MB // len(value) + 1) for key in LABELS} for value in ("9", "1e9", "GPU-1,", "\x00")]
    heavy.append({**LABELS, "gpuspawner.port": "٨" * MB})
    started = time.perf_counter()
    for labels in heavy:
        with pytest.raises(LabelError):
            parse_labels(labels)
    assert time.perf_counter() - started < 1.0
