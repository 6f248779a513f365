"""The access rules at a spawn: the user's JupyterHub groups as the hub has
them now (an authenticator's included), so a change applies at the next
spawn, and the weekly GPU-hour budget from the ledger."""

from __future__ import annotations

from collections.abc import Callable

from ..core.access import Access, AccessRules
from ..core.budget import WEEK, Budget, weekly_budget
from ..ledger.checks import utc_now
from ..ledger.ledger import LedgerError

__all__ = ["access_of", "budget_for_form", "budget_of", "groups_of", "rules_of"]


def rules_of(spawner) -> AccessRules:
    """``gpu_access`` of ``spawner``'s settings, checked (ValueError if bad)."""
    return AccessRules.parse(
        spawner.gpu_access, default_max_gpus=spawner.max_gpus_per_user, aliases=spawner.gpu_model_aliases
    )


def groups_of(spawner) -> list[str]:
    """The names of ``spawner``'s user's JupyterHub groups, as the hub has them now."""
    return [g.name for g in getattr(spawner.user, "groups", None) or ()]


def access_of(spawner) -> Access:
    """What ``spawner``'s user may have, from the groups JupyterHub has for them now."""
    return rules_of(spawner).effective(groups_of(spawner))


async def budget_of(holdings, user: str, access: Access, committed: Callable[[], float] = lambda: 0.0) -> Budget | None:
    """``user``'s weekly budget as the ledger has it now (None: no budget, or
    no ledger), with ``committed()`` GPU-hours that their running servers may
    still use (asked after the ledger's answer). Raises LedgerError."""
    if access.weekly_gpu_hours is None:
        return None
    now = utc_now()
    spans = await holdings.ledger_call(lambda db: db.user_spans(user, now - WEEK))
    if spans is None:
        return None
    return weekly_budget(spans, access.weekly_gpu_hours, now, committed=committed())


async def budget_for_form(spawner, holdings, access: Access) -> Budget | None:
    """The budget the form shows; None when the ledger cannot say (the form still works)."""
    try:
        return await budget_of(holdings, spawner.user.name, access, spawner.budget_committed)
    except LedgerError as exc:
        spawner.log.warning("The GPU budget of %s is unknown: %s", spawner.user.name, exc)
        return None
