"""Node agents' tokens: one per node, bound to that node's hostname (pure).

A token is :data:`PREFIX` followed by 32 random bytes in URL-safe base64. The hub
keeps only its SHA-256 (the token has 256 bits of entropy, so a plain hash cannot be
guessed back; no salt or slow hash is needed) and compares digests with
:func:`hmac.compare_digest`. A report made with a node's token may name only that
node: :func:`refusal` says so in one sentence otherwise.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from .inventory import HOSTNAME_RE

__all__ = [
    "PREFIX",
    "SHARED_TOKEN_REFUSED",
    "checked_host",
    "digest",
    "is_node_token",
    "matches",
    "new_token",
    "refusal",
]

PREFIX = "gpuspawner-node-"  # tells a node token from JupyterHub's own at a glance
RANDOM_BYTES = 32
TOKEN_LENGTH = len(PREFIX) + len(secrets.token_urlsafe(RANDOM_BYTES))

SHARED_TOKEN_REFUSED = (
    "The shared agent token is no longer accepted: issue this node a token of its own "
    "with `gpuspawner agent-token HOST`, or set c.GPUSwarmSpawner.agent_shared_token = True while you move."
)


def new_token() -> str:
    """A fresh node token; shown once to the admin, never stored."""
    return PREFIX + secrets.token_urlsafe(RANDOM_BYTES)


def digest(token: str) -> str:
    """What the hub stores of a token: its SHA-256, in hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def is_node_token(token: str | None) -> bool:
    """True when ``token`` has a node token's shape (it may still be unknown)."""
    return isinstance(token, str) and token.startswith(PREFIX) and len(token) == TOKEN_LENGTH


def matches(token: str, stored_digest: str) -> bool:
    """Whether ``token`` is the one whose digest was stored, in constant time (a
    database may have found the row by a case-insensitive comparison)."""
    return hmac.compare_digest(digest(token).encode(), stored_digest.encode())


def checked_host(host: object) -> str:
    """``host`` as a node's hostname, or ValueError with a sentence."""
    if not isinstance(host, str) or not HOSTNAME_RE.fullmatch(host):
        raise ValueError(f"{str(host)[:60]!r} is not a hostname: use the node's name as `docker node ls` shows it")
    return host


def refusal(token_host: str, report_host: str) -> str | None:
    """None when a token issued to ``token_host`` may report for ``report_host``;
    otherwise why not, in one sentence."""
    if report_host == token_host:
        return None
    return f"This agent token belongs to {token_host} and may report only for {token_host}, not for {report_host}."
