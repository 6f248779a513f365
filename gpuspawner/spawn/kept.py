"""What a request must leave free for others at a spawn: the open windows of
reservations it is not a member of (docs/reservations.md) and the quotas of groups it
is not in (docs/quotas.md), as one keep per model, with why a request is refused for
them; and whether a request goes first (the GPUs kept are its own to take)."""

from __future__ import annotations

from collections.abc import Callable, Collection

from ..core.requests import ALL, Request
from ..core.sharing import UNIT
from ..plan.reservations import Keep

__all__ = ["asked", "goes_first", "keep_for", "why_kept"]


def asked(request: Request | None) -> int:
    """The thousandths ``request`` takes (0: none, or not known before it is placed: ALL)."""
    if request is None:
        return 0
    if request.milli is not None:
        return request.milli
    return 0 if request.count == ALL else int(request.count) * UNIT


def goes_first(hub, groups: Collection[str], request: Request | None) -> bool:
    """Whether ``request`` is not held back by its model's line: its user is a member of a
    reservation of the model whose window is open, or it is within their group's quota."""
    if request is None or request.model is None:
        return False
    return hub.reservations.open_for(groups, request.model) or hub.quotas.within(groups, request.model, asked(request))


def keep_for(hub, groups: Collection[str], request: Request | None, service: str | None = None) -> dict[str, Keep]:
    """Per model, what ``request`` (of the server ``service``) must leave free (and,
    beyond its quota, its borrowing limit)."""
    kept = dict(hub.reservations.keep_free(groups))
    milli = asked(request)  # (0: all of a host's GPUs, its size not known before it is placed)
    models: tuple[str, ...] = ()
    if request is not None and (request.milli is not None or request.count != 0):
        models = request.models or ((request.model,) if request.model else tuple(hub.quotas.models()))
    for model, k in hub.quotas.keep_free(groups, {m: milli for m in models} or None, service).items():
        kept[model] = kept.get(model, Keep()) + k
    return kept


def why_kept(hub, groups: Collection[str], request: Request | None) -> Callable[[str], str]:
    """Why ``request`` is refused a model its keep holds back: the reservations' reason
    where an open window keeps the model from it, else the quotas'."""
    reservations, quotas = hub.reservations, hub.quotas

    def why(model: str) -> str:
        if model not in reservations.keep_free(groups):
            found = quotas.refusal(model, groups, asked(request))
            if found:
                return found
        return reservations.refusal(model, groups)

    return why
