"""What a server holds, and the labels of its swarm service that write it down and read it back.

The hub writes these labels when it creates a server's service, and rebuilds
who holds which GPU from them after a restart and at every reconciliation. A
label is a claim, not a fact: anyone who can update a service can write one.
:func:`parse_labels` therefore accepts only what :func:`to_labels` could have
written, and does a bounded amount of work for any input: every value's length
is checked before any other work on it, numbers are read from ASCII digits
only, and a share is never handed to ``Decimal`` or ``float`` unchecked.

Importing it pulls in neither docker nor jupyterhub.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from .inventory import HOSTNAME_RE, MODEL_RE, UUID_RE
from .sharing import UNIT, fmt_list

__all__ = [
    "LABEL",
    "MAX_DEVICES",
    "MAX_NAME",
    "Held",
    "LabelError",
    "parse_labels",
    "parse_share",
    "to_labels",
]

LABEL = "gpuspawner"  # label prefix; a service with f"{LABEL}.devices" is one of ours (or claims to be)
MAX_NAME = 255  # a user or server name, in characters (JupyterHub's own column size)
MAX_DEVICES = 64  # devices one server may hold

USER, SERVER, HOST, DEVICES, MODEL, PORT, SHARES = (
    f"{LABEL}.{key}" for key in ("user", "server", "host", "devices", "model", "port", "shares")
)

_UUID_LONGEST = 124  # UUID_RE: "GPU-" or "MIG-" and at most 120 more
_SHARE_LONGEST = len("1.000")  # the longest share fmt() writes
_SHARE_READ = 16  # the longest share text parse_share() looks at
# The longest value each label may have, checked before anything else is done
# with it (a list: its longest items, comma-separated).
_LONGEST = {
    USER: MAX_NAME,
    SERVER: MAX_NAME,
    HOST: 253,  # HOSTNAME_RE
    DEVICES: MAX_DEVICES * (_UUID_LONGEST + 1) - 1,
    MODEL: 120,  # MODEL_RE
    PORT: len("65535"),
    SHARES: MAX_DEVICES * (_SHARE_LONGEST + 1) - 1,
}

_PORT_RE = re.compile(r"[0-9]{1,5}")  # not \d or str.isdigit(): both accept other scripts' digits
_SHARE_RE = re.compile(r"([0-9]+)(?:\.([0-9]{1,3}))?")  # no sign, exponent, inf or nan; thousandths at most
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")  # C0, DEL, C1 and lone surrogates


class LabelError(ValueError):
    """A service's labels say it is ours, but one is malformed. The message
    names the label and what is wrong with it, on one line."""


@dataclass(frozen=True)
class Held:
    """What a server holds: its user and server name, the host, the devices with
    each one's share, and its port. The hub keeps one per holding; its service's
    labels write it down (:func:`to_labels`) and read it back, validated
    (:func:`parse_labels`)."""

    user: str
    server: str  # "" for the default server
    host: str  # "" when not pinned (CPU-only)
    uuids: tuple[str, ...]
    model: str
    port: int | None
    # Each device's share in thousandths, aligned with ``uuids``: 1000 held
    # whole. Left out, every device is held whole.
    milli: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.milli and self.uuids:
            object.__setattr__(self, "milli", (UNIT,) * len(self.uuids))

    @property
    def shared(self) -> bool:
        """Some device is held in part (the labels then carry every device's share)."""
        return min(self.milli, default=UNIT) < UNIT


def to_labels(s: Held) -> dict[str, str]:
    """The labels for the service of ``s``. LabelError when they would not
    read back as ``s``: the hub never writes labels its own rebuild refuses."""
    labels = {USER: s.user, SERVER: s.server, HOST: s.host, DEVICES: ",".join(s.uuids), MODEL: s.model}
    if s.port is not None:
        labels[PORT] = str(s.port)
    if s.shared:
        labels[SHARES] = fmt_list(s.milli)
    if parse_labels(labels) != s:
        raise LabelError(f"labels {LABEL}.*: {_shown(repr(s))} does not read back as written")
    return labels


def parse_labels(labels: Mapping[str, str]) -> Held | None:
    """What a service's labels say it holds. None when it is not ours (no
    ``gpuspawner.devices`` label); LabelError when it is but a label is
    malformed. Unknown ``gpuspawner.*`` labels are ignored."""
    if DEVICES not in labels:
        return None
    value = _reader(labels)
    uuids = _uuids(value(DEVICES))
    return Held(
        user=_name(USER, value(USER), required=True),
        server=_name(SERVER, value(SERVER), required=False),
        host=_matching(HOST, value(HOST), HOSTNAME_RE, "a hostname", required=bool(uuids)),
        uuids=uuids,
        model=_matching(MODEL, value(MODEL), MODEL_RE, "a GPU model name", required=bool(uuids)),
        port=_port(value(PORT)),
        milli=_shares(value(SHARES), len(uuids)),
    )


def parse_share(text: str, label: str = SHARES) -> int:
    """One share as :func:`~gpuspawner.core.sharing.fmt` writes it ('0.6', '1'),
    in thousandths: more than 0 and at most 1. LabelError otherwise."""
    if not isinstance(text, str):
        _fail(label, text, "has a share that is not text")
    if len(text) > _SHARE_READ:
        _fail(label, text, f"has a share longer than {_SHARE_READ} characters")
    match = _SHARE_RE.fullmatch(text)
    if match is None:
        _fail(label, text, "has a share that is not a decimal such as 0.25 (at most 3 decimal places)")
    whole, part = match.groups()
    milli = int(whole) * UNIT + int((part or "").ljust(3, "0"))  # short ASCII digits: bounded work
    if not 0 < milli <= UNIT:
        _fail(label, text, "has a share that is not more than 0 and at most 1")
    return milli


# -- one label each ----------------------------------------------------------


def _reader(labels: Mapping[str, str]) -> Callable[[str], str | None]:
    """The value of a label (None when absent), after its type and length are checked."""

    def value(label: str) -> str | None:
        text = labels.get(label)
        if text is None:
            return None
        if not isinstance(text, str):
            _fail(label, text, "must be text")
        if len(text) > _LONGEST[label]:
            _fail(label, text, f"is {len(text)} characters, more than {_LONGEST[label]}")
        return text

    return value


def _name(label: str, text: str | None, *, required: bool) -> str:
    text = text or ""
    if required and not text:
        _fail(label, text, "is missing or empty")
    if _CONTROL_RE.search(text):
        _fail(label, text, "must not contain control characters")
    return text


def _matching(label: str, text: str | None, pattern: re.Pattern, what: str, *, required: bool) -> str:
    text = text or ""
    if not text:
        if required:
            _fail(label, text, "is missing or empty, but the service holds devices")
        return text
    if not pattern.fullmatch(text):
        _fail(label, text, f"is not {what}")
    return text


def _uuids(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()  # a CPU-only server
    uuids = text.split(",")
    if len(uuids) > MAX_DEVICES:
        _fail(DEVICES, text, f"lists {len(uuids)} devices, more than {MAX_DEVICES}")
    for uuid in uuids:
        if not UUID_RE.fullmatch(uuid):
            _fail(DEVICES, uuid, "lists a device that is not a GPU-… or MIG-… UUID")
    if len(set(uuids)) != len(uuids):
        _fail(DEVICES, text, "lists a device twice")
    return tuple(uuids)


def _port(text: str | None) -> int | None:
    if text is None:
        return None
    if not _PORT_RE.fullmatch(text) or not 1 <= int(text) <= 65535:
        _fail(PORT, text, "must be a port number from 1 to 65535 in ASCII digits")
    return int(text)


def _shares(text: str | None, devices: int) -> tuple[int, ...]:
    if text is None:
        return (UNIT,) * devices  # whole devices (also every service made before shares)
    if not devices:
        _fail(SHARES, text, f"is set, but {DEVICES} lists no device")
    pieces = text.split(",")
    if len(pieces) != devices:
        _fail(SHARES, text, f"has {len(pieces)} shares for {devices} devices")
    return tuple(parse_share(piece) for piece in pieces)


def _fail(label: str, value: object, problem: str) -> NoReturn:
    raise LabelError(f"label {label} {problem}, got {_shown(value)}")


def _shown(value: object, most: int = 40) -> str:
    """A value for a message: cut short before it is quoted, so a 1 MB label
    costs no more than a short one, and quoted, so it stays on one line."""
    if not isinstance(value, str):
        return f"a value of type {type(value).__name__}"
    return repr(value[:most]) + (f" (and {len(value) - most} more characters)" if len(value) > most else "")
