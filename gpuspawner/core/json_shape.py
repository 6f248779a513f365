"""JSON bodies from outside, checked for their shape before they are decoded.

``json.loads`` recurses once per level of nesting, so a body of a hundred thousand
``[`` ends in a RecursionError rather than a ValueError. :func:`check_shape`
refuses a body nested deeper, or with more objects and lists, than its caller
allows, from its brackets outside strings: cheap, linear in the body, and without
the recursion of decoding it. Agents' reports and admins' reservations are
checked with it (pure: no JupyterHub)."""

from __future__ import annotations

import re

__all__ = ["JSONShapeError", "check_shape"]

# A string, or an unterminated one to the end: a match from every quote, so the scan
# stays linear (needing the closing quote rescans the rest from each quote: 256 KiB
# of \"[ took seconds).
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class JSONShapeError(ValueError):
    """A body nested too deep or with too many objects and lists; the message says which."""


def check_shape(text: str, what: str, max_depth: int, max_containers: int) -> None:
    """Raise JSONShapeError, a sentence about ``what`` (e.g. "report"), when ``text``
    nests more than ``max_depth`` objects and lists or has more than ``max_containers``
    of them. A text that is not JSON is left for ``json.loads`` to say where."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    containers = brackets.count("[") + brackets.count("{")
    if containers > max_containers:
        raise JSONShapeError(f"{what} has {containers} objects and lists; the limit is {max_containers}")
    depth = 0
    for c in brackets:
        if c in "[{":
            depth += 1
            if depth > max_depth:
                raise JSONShapeError(f"{what} is nested more than {max_depth} levels deep")
        else:
            depth -= 1
            if depth < 0:
                return  # not JSON: json.loads says where
