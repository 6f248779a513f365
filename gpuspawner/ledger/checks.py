"""The checks on the ledger's arguments: bad ones raise ValueError, before anything is written."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone

from ..core.sharing import UNIT
from .schema import NAME_MAX

TASK_ID = re.compile(r"[A-Za-z0-9]{1,64}")  # a swarm task id (25 lowercase letters and digits)
MODELS_MAX = 256  # models recorded as accepted by one request


def aware_utc(value: datetime | None, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValueError(f"{name} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc)), got {value}")
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError(
            f"{name} {value.isoformat()} is out of range: in UTC it falls outside years 1 to 9999"
        ) from None


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def checked_name(value: str, what: str, *, required: bool) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, not {type(value).__name__}")
    if required and not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > NAME_MAX:
        raise ValueError(f"{what} is longer than {NAME_MAX} characters: {value[:40]}...")
    return value


def checked_reserved(value: int | None, what: str) -> int | None:
    """A whole number ≥ 0 below 2**31 (what an Integer column holds everywhere), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise ValueError(f"{what} must be a whole number from 0 to {2**31 - 1}, or None, got {value!r}")
    return value


def checked_models(models: Iterable[str] | None) -> tuple[str, ...] | None:
    """The models a request accepted, sorted without repeats (() any model), or None."""
    if models is None:
        return None
    if isinstance(models, str):
        raise ValueError("accepts must be a list of model names, not one string")
    found = sorted({checked_name(m, "an accepted model", required=True) for m in models})
    if len(found) > MODELS_MAX:
        raise ValueError(f"accepts names {len(found)} models; at most {MODELS_MAX} are recorded")
    return tuple(found)


def checked_shares(devices: Sequence[str], milli: Sequence[int]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if isinstance(devices, str):
        raise ValueError("devices must be a list of device UUIDs, not one string")
    devices = tuple(checked_name(d, "a device UUID", required=True) for d in devices)
    milli = tuple(milli)
    if len(devices) != len(milli):
        raise ValueError(f"{len(devices)} devices but {len(milli)} shares: give one share per device")
    if len(set(devices)) != len(devices):
        raise ValueError(f"a device is listed twice: {', '.join(devices)}")
    for uuid, share in zip(devices, milli):
        if isinstance(share, bool) or not isinstance(share, int) or not 0 < share <= UNIT:
            raise ValueError(
                f"the share of {uuid} must be an integer number of thousandths in 1..{UNIT} "
                f"({UNIT}: the whole device), got {share!r}"
            )
    return devices, tuple(int(m) for m in milli)


def checked_task_ids(task_ids: Iterable[str]) -> tuple[str, ...]:
    if isinstance(task_ids, str):
        raise ValueError("task_ids must be a collection of swarm task ids, not one string")
    task_ids = tuple(task_ids)
    for task in task_ids:
        if not isinstance(task, str) or not TASK_ID.fullmatch(task):
            raise ValueError(f"a swarm task id is 1 to 64 letters and digits, got {task!r}")
    return task_ids


def checked_range(
    since: datetime | None, until: datetime | None, until_default: datetime | None
) -> tuple[datetime | None, datetime | None]:
    since, until = aware_utc(since, "since"), aware_utc(until, "until") or until_default
    if since is not None and until is not None and since > until:
        raise ValueError(f"since ({since.isoformat()}) is after until ({until.isoformat()})")
    return since, until
