"""user_options: what a user may ask for, from the form or the REST API.

The same keys arrive from both (``POST /hub/api/users/NAME/server`` takes them
as its JSON body), and stored options are reused on later spawns, so
:func:`parse_user_options` runs at every start, not only when the form is sent.
Only values that pass it ever reach service env, constraints or labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .allocator import ALL

__all__ = ["KEYS", "GPURequest", "OptionsError", "options_from_form", "parse_user_options"]

KEYS = ("gpu_model", "gpu_count", "gpu_host")


class OptionsError(ValueError):
    """The user's choice is not valid; the message names the valid choices."""


@dataclass(frozen=True)
class GPURequest:
    model: str | None  # None: any model
    count: int | str  # 0: CPU-only; ALL: every GPU of one host
    host: str | None

    @property
    def cpu_only(self) -> bool:
        return self.count == 0


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
            options[key] = int(value) if value.isascii() and value.isdigit() else value
        elif value or key not in ("gpu_model", "gpu_host"):
            options[key] = value
    if "gpu_model" not in options:
        # The form's CPU-only choice sends an empty model: whatever the count
        # field says, that means no GPU.
        options["gpu_count"] = 0
    return options


def parse_user_options(
    options: Any,
    *,
    models: list[str],
    hosts: list[str],
    max_count: int,
    allow_host_choice: bool,
) -> GPURequest:
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise OptionsError("Server options must be a JSON object with keys: " + ", ".join(KEYS))
    unknown = sorted(str(k) for k in options if k not in KEYS)
    if unknown:
        raise OptionsError(f"Unknown option(s) {', '.join(map(repr, unknown))}; valid options: {', '.join(KEYS)}")

    model = options.get("gpu_model")
    if model is not None and (not isinstance(model, str) or model not in models):
        raise OptionsError(
            f"Unknown GPU model {_show(model)}; choose one of: {', '.join(models) or '(none configured)'}"
        )

    count = options.get("gpu_count", 0 if model is None else 1)
    if count == ALL:
        pass
    elif isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise OptionsError(
            f"gpu_count must be a whole number from 0 (CPU-only) to {max_count}, or {ALL!r}; got {_show(count)}"
        )
    elif count > max_count:
        raise OptionsError(f"{count} GPUs requested; the limit is {max_count} per user (0 for CPU-only)")
    if count == 0 and model is not None:
        raise OptionsError("gpu_count 0 means CPU-only: leave gpu_model out, or ask for at least 1 GPU")

    host = options.get("gpu_host")
    if host is not None:
        if not allow_host_choice:
            raise OptionsError("Choosing a host (gpu_host) is not enabled on this hub; leave it out")
        if not isinstance(host, str) or host not in hosts:
            raise OptionsError(f"Unknown host {_show(host)}; choose one of: {', '.join(hosts)}")
    return GPURequest(model=model, count=count, host=host)


def _show(value: Any) -> str:
    """A user's value, quoted and cut short for an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
