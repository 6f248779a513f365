"""Node agents' tokens (gpuspawner.core.agent_tokens): their shape, digest and host rule (pure)."""

from __future__ import annotations

import hashlib

import pytest

from gpuspawner.core import agent_tokens as t


def test_a_new_token_carries_32_random_bytes_after_its_prefix():
    tokens = {t.new_token() for _ in range(200)}
    assert len(tokens) == 200
    for token in tokens:
        assert token.startswith(t.PREFIX) and t.is_node_token(token)
        assert len(token) - len(t.PREFIX) >= 43  # 32 bytes in URL-safe base64
        assert token.isprintable() and not any(c.isspace() for c in token)  # one line, as the agent reads it


def test_the_hub_keeps_the_tokens_sha256_and_matches_only_that_token():
    """Guards docs/security.md, "A node's agent token": "be read back from the hub: it keeps only the
    SHA-256"."""
    token, other = t.new_token(), t.new_token()
    stored = t.digest(token)
    assert stored == hashlib.sha256(token.encode()).hexdigest() and token not in stored
    assert t.matches(token, stored)
    assert not t.matches(other, stored)
    assert not t.matches(token, stored.upper())  # byte for byte, whatever the database's collation


@pytest.mark.parametrize(
    "token",
    [None, "", "agent-token-for-tests-0123456789", t.PREFIX, t.PREFIX + "x" * 10, "x" + t.new_token()],
    ids=[
        "none",
        "empty",
        "not-node-shaped",
        "prefix-only",
        "prefix-and-10",
        "x-and-a-real-token",
    ],  # the same in every worker
)
def test_only_node_shaped_tokens_are_looked_up(token):
    assert not t.is_node_token(token)


def test_a_node_token_reports_only_for_its_own_host():
    assert t.refusal("gpu-a", "gpu-a") is None
    sentence = t.refusal("gpu-a", "gpu-b")
    assert sentence == "This agent token belongs to gpu-a and may report only for gpu-a, not for gpu-b."


@pytest.mark.parametrize("host", ["", "-x", "a b", "gpu/a", "x" * 300, None, 3])
def test_hosts_must_be_hostnames(host):
    with pytest.raises(ValueError, match="is not a hostname"):
        t.checked_host(host)
    assert t.checked_host("gpu-a.example.org") == "gpu-a.example.org"
