"""Which nodes a service's placement constraints allow (pure).

The swarm's own syntax (``node.role == worker``, ``node.labels.gpu != false``),
judged on what the node list carries: ``node.id``, ``node.hostname``,
``node.role``, ``node.labels.*``, ``node.platform.os`` and ``.arch``. A
constraint on anything else (``engine.labels.*``, ...) cannot be judged here:
it leaves every node in (the swarm still applies it to the service).
"""

from __future__ import annotations

from collections.abc import Iterable

from .swarm import Node

__all__ = ["allows", "eligible"]


def allows(constraint: str, node: Node) -> bool | None:
    """Whether ``node`` meets ``constraint``; None when it cannot be told."""
    for op in ("==", "!="):
        if op in constraint:
            key, value = (part.strip() for part in constraint.split(op, 1))
            break
    else:
        return None
    actual = _attribute(key, node)
    if actual is None:
        return None
    return (actual.lower() == value.lower()) == (op == "==")  # the swarm compares ignoring case


def _attribute(key: str, node: Node) -> str | None:
    lowered = key.lower()
    if lowered.startswith("node.labels."):
        wanted = key[len("node.labels.") :].lower()
        return next((v for k, v in node.labels if k.lower() == wanted), "")  # a label it lacks: ""
    return {
        "node.id": node.id,
        "node.hostname": node.hostname,
        "node.role": node.role,
        "node.platform.os": node.os,
        "node.platform.arch": node.arch,
    }.get(lowered)


def eligible(constraints: Iterable[str], nodes: Iterable[Node]) -> frozenset[str]:
    """The hostnames of the nodes that no constraint rules out."""
    constraints = list(constraints)
    return frozenset(n.hostname for n in nodes if all(allows(c, n) is not False for c in constraints))
