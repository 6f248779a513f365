"""user_options: what a user may ask for, from the form or the REST API.

The same keys arrive from both (``POST /hub/api/users/NAME/server`` takes them
as its JSON body), and stored options are reused on later spawns, so
:func:`parse_user_options` runs at every start, not only when the form is sent.
Only values that pass it ever reach service env, constraints or labels.

``gpu_share`` asks for a share of a GPU (0.25, or 1.2 split over devices of
one host) instead of ``gpu_count`` whole ones, where the admin's sharing
policy offers it; it counts against the per-user limit as what it is (a
user with a limit of 2 may hold 1.2 and 0.8).

``gpu_wait`` (true or false): when none of the chosen model is free, wait in
its line instead of failing (docs/line.md). It needs ``gpu_model``. The form
sends its checkbox's "on" (or "true", "false"); any other text is refused as
the REST API refuses it, by the same check.

``gpu_model`` may also name several models: a list (REST), or one of the
admin's ``gpu_model_classes`` by its name ("any 80 GB GPU"). The server then
gets any one of them (all its devices of that one model); such a request does
not wait in line (a line is per model).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .requests import ALL
from .sharing import UNIT, SharingPolicy, fmt, shown, to_milli

__all__ = ["KEYS", "GPURequest", "OptionsError", "options_from_form", "parse_user_options"]

KEYS = ("gpu_model", "gpu_count", "gpu_host", "gpu_share", "gpu_wait")
_WHOLE_KEYS = ("gpu_model", "gpu_count", "gpu_host", "gpu_wait")  # what is offered while no model is shared
_DECIMAL_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+")
_NUMBER_CHARS = 12  # longer numbers are passed on as text (int() refuses 4,300 digits; float() overflows)
# The form's texts for the REST API's true and false: the checkbox's value, and JSON's words.
_FORM_WAIT = {"on": True, "true": True, "false": False}


class OptionsError(ValueError):
    """The user's choice is not valid; the message names the valid choices."""


@dataclass(frozen=True)
class GPURequest:
    model: str | None  # None: any model
    count: int | str  # 0: CPU-only; ALL: every GPU of one host; 1 with a share
    host: str | None
    milli: int | None = None  # a share of a GPU in thousandths (250: a quarter); None: ``count`` whole GPUs
    wait: bool = False  # wait in line when none is free
    models: tuple[str, ...] | None = None  # any of these (a list or a class); ``model`` is then None

    @property
    def cpu_only(self) -> bool:
        return self.count == 0 and self.milli is None


def options_from_form(formdata: Mapping[str, list[str]]) -> dict[str, Any]:
    """Form fields (lists of strings) -> user_options with the REST API's types.

    Never raises: a value it can't convert is passed on as given, and
    :func:`parse_user_options` then refuses it with a clear message."""
    options: dict[str, Any] = {}
    for key, values in formdata.items():
        if not values or key.startswith("_"):  # e.g. _xsrf
            continue
        value = values[0].strip()
        if key == "gpu_count":
            number = len(value) <= _NUMBER_CHARS and value.isascii() and value.isdigit()
            options[key] = int(value) if number else value
        elif key == "gpu_wait":  # a checkbox: sent ("on") only when ticked
            options[key] = _FORM_WAIT.get(value, value)  # anything else: _wait refuses it as for REST
        elif key == "gpu_share":
            if value:  # empty: whole GPUs
                number = len(value) <= _NUMBER_CHARS and _DECIMAL_RE.fullmatch(value) is not None
                options[key] = float(value) if number else value
        elif value or key not in ("gpu_model", "gpu_host"):
            options[key] = value
    if "gpu_share" in options:
        # The form always sends its count field; a chosen share replaces it.
        options.pop("gpu_count", None)
    if "gpu_model" not in options:
        # The form's CPU-only choice sends an empty model: whatever the count
        # or share fields say, that means no GPU.
        options.pop("gpu_share", None)
        options["gpu_count"] = 0
    return options


def parse_user_options(
    options: Any,
    *,
    models: list[str],
    hosts: list[str],
    max_count: int,
    allow_host_choice: bool,
    sharing: SharingPolicy | Mapping | None = None,
    classes: Mapping[str, Sequence[str]] | None = None,
) -> GPURequest:
    """``max_count``: the per-user limit (shares count as such);
    ``sharing``: the admin's policy (None: whole GPUs only); ``classes``: the
    admin's named groups of models (``gpu_model_classes``)."""
    sharing = SharingPolicy.parse(sharing)
    offered = KEYS if sharing.enabled else _WHOLE_KEYS
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise OptionsError("Server options must be a JSON object with keys: " + ", ".join(offered))
    unknown = sorted(str(k) for k in options if k not in KEYS)
    if unknown:
        raise OptionsError(f"Unknown option(s) {', '.join(map(repr, unknown))}; valid options: {', '.join(offered)}")

    model, several = _models(options.get("gpu_model"), models, classes or {})
    host = _host(options, hosts, allow_host_choice)
    wait = _wait(options, model if several is None else "several")
    if wait and several is not None:
        raise OptionsError("gpu_wait needs one GPU model, not several: a line is per model")
    if "gpu_share" in options:
        share = _share(options, model, list(several or models), max_count, sharing)
        return GPURequest(model=model, count=1, host=host, milli=share, wait=wait, models=several)

    count = options.get("gpu_count", 0 if model is None and several is None else 1)
    if count == ALL:
        pass
    elif isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise OptionsError(
            f"gpu_count must be a whole number from 0 (CPU-only) to {max_count}, or {ALL!r}; got {shown(count)}"
        )
    elif count > max_count:
        asked = f"{count} GPUs" if count < 10**9 else f"gpu_count {shown(count)}"  # str() refuses 4,300 digits
        raise OptionsError(f"{asked} requested; the limit is {max_count} per user (0 for CPU-only)")
    if count == 0 and (model is not None or several is not None):
        raise OptionsError("gpu_count 0 means CPU-only: leave gpu_model out, or ask for at least 1 GPU")
    return GPURequest(model=model, count=count, host=host, wait=wait and count != 0, models=several)


def _models(
    asked: Any, models: list[str], classes: Mapping[str, Sequence[str]]
) -> tuple[str | None, tuple[str, ...] | None]:
    """(one model, or None) and (several models, or None) from ``gpu_model``."""
    unknown = f"choose one of: {', '.join([*models, *classes]) or '(none configured)'}"
    if asked is None or isinstance(asked, str) and asked in models:
        return asked, None
    if isinstance(asked, str) and asked in classes:
        offered = tuple(m for m in dict.fromkeys(classes[asked]) if m in models)
        if not offered:
            raise OptionsError(f"No GPU model of {asked!r} is offered to you right now; {unknown}")
    elif isinstance(asked, list) and asked and all(isinstance(m, str) and m in models for m in asked):
        offered = tuple(dict.fromkeys(asked))
    elif isinstance(asked, list) and not asked:
        raise OptionsError(f"gpu_model's list is empty; {unknown}")
    elif isinstance(asked, list):
        bad = next(m for m in asked if not isinstance(m, str) or m not in models)
        raise OptionsError(f"Unknown GPU model {shown(bad)} in gpu_model's list; {unknown}")
    else:
        raise OptionsError(f"Unknown GPU model {shown(asked)}; {unknown}")
    return None, offered  # even one: asked for as "any of", it does not wait in line


def _wait(options: Mapping, model: str | None) -> bool:
    wait = options.get("gpu_wait", False)
    if not isinstance(wait, bool):
        raise OptionsError(f"gpu_wait must be true or false; got {shown(wait)}")
    if wait and model is None and (options.get("gpu_count", 0) != 0 or "gpu_share" in options):
        raise OptionsError("gpu_wait needs gpu_model: a line is per GPU model")
    return wait


def _host(options: Mapping, hosts: list[str], allow_host_choice: bool) -> str | None:
    host = options.get("gpu_host")
    if host is not None:
        if not allow_host_choice:
            raise OptionsError("Choosing a host (gpu_host) is not enabled on this hub; leave it out")
        if not isinstance(host, str) or host not in hosts:
            raise OptionsError(f"Unknown host {shown(host)}; choose one of: {', '.join(hosts)}")
    return host


def _share(options: Mapping, model: str | None, models: list[str], max_count: int, sharing: SharingPolicy) -> int:
    if "gpu_count" in options:
        raise OptionsError("Give either gpu_count (whole GPUs) or gpu_share (a share of a GPU), not both")
    try:
        share = to_milli(options["gpu_share"], "gpu_share")
        sharing.accepting(share, model, models)
    except ValueError as exc:
        raise OptionsError(str(exc)) from None
    if share > max_count * UNIT:
        raise OptionsError(f"{fmt(share)} of a GPU requested; the limit is {max_count} per user")
    return share
