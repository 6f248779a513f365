"""Numbers from outside (agents' reports, admins' config), checked as numbers: an
integer too large for a float (``10**400``) is refused like any other bad value, never
an OverflowError from ``float()`` or ``math.isfinite``."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> float | None:
    """``value`` as a finite float; None when it is not a number (bools are not), NaN,
    infinite, or an integer beyond a float's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
