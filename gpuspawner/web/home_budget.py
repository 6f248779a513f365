"""The home page's note on the user's weekly GPU-hours, for
``c.JupyterHub.template_vars`` (templates/gpuspawner_budget.html).

JupyterHub calls each callable template variable at every page it renders;
this one reads the ledger only when the home page shows the note, and only
for users whose rules set ``weekly_gpu_hours``.
"""

from __future__ import annotations

import functools
import logging

from gpuspawner.core.budget import WEEK, Budget, summary, weekly_budget
from gpuspawner.ledger.checks import utc_now
from gpuspawner.spawn.rules import rules_of

__all__ = ["BudgetNote", "budget_var"]

log = logging.getLogger("JupyterHub")


class BudgetNote:
    """One user's note, worked out when the template first asks."""

    def __init__(self, hub, user):
        self.hub, self.user = hub, user

    @functools.cached_property
    def budget(self) -> Budget | None:
        try:
            settings = self.hub.settings
            groups = [g.name for g in getattr(self.user, "groups", None) or ()]
            hours = rules_of(settings).effective(groups).weekly_gpu_hours
            ledger = self.hub.holdings.ledger if hours is not None else None
            if ledger is None:
                return None
            now = utc_now()
            return weekly_budget(ledger.user_spans(self.user.name, now - WEEK), hours, now)
        except Exception as exc:  # noqa: BLE001 - a page must render even when the GPU side cannot
            log.warning("The GPU budget of %s is unknown: %s", self.user.name, exc)
            return None

    @property
    def text(self) -> str:
        return summary(self.budget) if self.budget else ""

    @property
    def over(self) -> bool:
        return bool(self.budget and self.budget.over)


def budget_var(hub):
    """For ``c.JupyterHub.template_vars``: the logged-in user's BudgetNote (``hub``: the GPUHub)."""

    def note(user) -> BudgetNote | None:
        if user is None or getattr(user, "kind", "user") != "user":
            return None
        return BudgetNote(hub, user)

    return note
