"""The home page's note on the user's weekly GPU-hours, for
``c.JupyterHub.template_vars`` (templates/gpuspawner_budget.html).

JupyterHub calls each callable template variable at every page it renders; the
note reads the ledger only when the home page asks for it (``load()``, which
JupyterHub's asynchronous templates await: the read runs in the ledger's
executor, off the event loop), and only for users whose rules set
``weekly_gpu_hours``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..core.budget import summary
from ..spawn.rules import budget_of, rules_of

__all__ = ["BudgetNote", "budget_var"]

log = logging.getLogger("JupyterHub")


@dataclass(frozen=True)
class Shown:
    text: str
    over: bool


class BudgetNote:
    """One user's note; ``await load()`` works it out."""

    def __init__(self, hub, user):
        self.hub, self.user = hub, user

    async def load(self) -> Shown | None:
        """The note as the page shows it, or None (no budget, or the GPU side cannot say)."""
        try:
            groups = [g.name for g in getattr(self.user, "groups", None) or ()]
            access = rules_of(self.hub.settings).effective(groups)
            name = self.user.name
            budget = await budget_of(self.hub.holdings, name, access, lambda: self.hub.reclaimer.may_still_use(name))
        except Exception as exc:  # noqa: BLE001 - a page must render even when the GPU side cannot
            log.warning("The GPU budget of %s is unknown: %s", self.user.name, exc)
            return None
        return Shown(summary(budget), budget.over) if budget else None


def budget_var(hub):
    """For ``c.JupyterHub.template_vars``: the logged-in user's BudgetNote (``hub``: the GPUHub)."""

    def note(user) -> BudgetNote | None:
        if user is None or getattr(user, "kind", "user") != "user":
            return None
        return BudgetNote(hub, user)

    return note
