"""The ledger's database URL: its default beside the hub's database, and its
secrets (passwords, tokens) masked for every message and log line that quotes it."""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

#: The default ledger file, beside the hub's own database.
DEFAULT_FILENAME = "gpuspawner.sqlite"


def default_db_url(hub_db_url: str, cwd: str | os.PathLike) -> str:
    """The default ``gpu_db_url``: ``gpuspawner.sqlite`` beside the hub's SQLite file,
    or in the hub's working directory ``cwd`` when the hub's database is anything else."""
    directory = Path(os.path.abspath(cwd))
    try:
        url = sa.engine.make_url(hub_db_url)
    except sa_exc.ArgumentError:
        url = None
    if (
        url is not None
        and url.get_backend_name() == "sqlite"
        and url.database
        and url.database != ":memory:"
        and not url.database.startswith("file:")
    ):
        directory = (directory / url.database).parent  # an absolute path replaces cwd
    return f"sqlite:///{directory / DEFAULT_FILENAME}"


# Query parameters whose value is a secret (case-insensitive, percent-decoded):
# password, passwd, pwd, sslpassword, token, secret, client_secret, api_key ...
_SECRET_KEY = re.compile(r"pass|pwd|token|secret|api_?key", re.IGNORECASE)
_USERINFO_PASSWORD = re.compile(r"^([^:/?#]*://[^:/?#@]*:)(.*)(@)", re.DOTALL)
_MASK = "***"


def _is_secret(key: str, value: str) -> bool:
    """Whether a query parameter (``key=value``) holds a secret."""
    return bool(value) and bool(_SECRET_KEY.search(urllib.parse.unquote_plus(key)))


def safe_url(url: str | sa.engine.URL) -> str:
    """The URL with every password hidden (in its user part and in query
    parameters such as ``?password=``), for messages and logs. Never raises,
    whatever it is given."""
    if isinstance(url, sa.engine.URL):
        url = url.render_as_string(hide_password=False)
    if not isinstance(url, str):
        return f"<a {type(url).__name__}, not a URL>"
    # Greedy up to the last "@": a password with an unescaped "@" is hidden whole.
    text = _USERINFO_PASSWORD.sub(lambda m: m[1] + _MASK + m[3] if m[2] else m[0], url, count=1)
    base, sep, query = text.partition("?")
    if not sep:
        return text
    query, hash_, fragment = query.partition("#")
    parts = []
    for part in re.split(r"([&;])", query):
        key, eq, value = part.partition("=")
        if _is_secret(key, value):
            value = _MASK
        parts.append(key + eq + value)
    return base + sep + "".join(parts) + hash_ + fragment


def secrets_of(url: str) -> list[str]:
    """The secret values in a URL, as written and decoded, longest first, to
    scrub from messages that quote it (a driver's error, a parser's)."""
    if not isinstance(url, str):
        return []
    secrets = set()
    m = _USERINFO_PASSWORD.match(url)
    if m and m[2]:
        secrets.add(m[2])
    for part in re.split(r"[&;]", url.partition("?")[2].partition("#")[0]):
        key, eq, value = part.partition("=")
        if _is_secret(key, value):
            secrets.add(value)
    secrets |= {urllib.parse.unquote_plus(s) for s in secrets}
    return sorted((s for s in secrets if s), key=len, reverse=True)


def scrub(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, _MASK)
    return text
