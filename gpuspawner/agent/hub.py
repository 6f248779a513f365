"""How gpuspawner-agent reaches the hub: the report endpoint, the token, the POST.

Every failure of a post is one line (HubError); bad settings are AgentErrors.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .._version import __version__
from .errors import PROG, AgentError

log = logging.getLogger(PROG)

DEFAULT_TIMEOUT_S = 10.0
TOKEN_ENV = "GPUSPAWNER_AGENT_TOKEN"
TOKEN_FILE_ENV = "GPUSPAWNER_AGENT_TOKEN_FILE"  # --token-file's default (stacks template it per node)
REPORT_PATH = "hub/api/gpuspawner/report"
NO_TOKEN = (
    f"{PROG}: no hub token: pass --token-file FILE or set {TOKEN_FILE_ENV} or {TOKEN_ENV} "
    "(this node's own token, issued with `gpuspawner agent-token HOST`)"
)


class HubError(Exception):
    """A report did not get through; str() says why in one line."""


class _Forbidden(HubError):
    """The hub refused the token (403)."""


def report_url(hub_url: str) -> str:
    """The report endpoint under the hub's public URL, which may carry a base path.

    ``http://h:8000`` and ``http://h:8000/jhub/`` give ``…/hub/api/gpuspawner/report``
    and ``…/jhub/hub/api/gpuspawner/report``.
    """
    parts = urllib.parse.urlsplit(hub_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AgentError(
            f"{PROG}: --hub-url must be the hub's address, like http://hub.example.org:8000/ (got {hub_url!r})"
        )
    if parts.query or parts.fragment:
        raise AgentError(f"{PROG}: --hub-url must not carry a query or a fragment (got {hub_url!r})")
    path = parts.path.rstrip("/") + "/" + REPORT_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def read_token(token_file: str | None) -> str:
    """The agent's hub token: from --token-file if given, else from $GPUSPAWNER_AGENT_TOKEN."""
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = getattr(e, "strerror", None) or str(e)
            raise AgentError(f"{PROG}: cannot read the token file {token_file}: {reason}") from None
        where = f"the token file {token_file}"
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        if not token:
            raise AgentError(NO_TOKEN)
        where = f"${TOKEN_ENV}"
    if not token:
        raise AgentError(f"{PROG}: {where} is empty")
    if any(c.isspace() or not c.isprintable() for c in token):
        raise AgentError(f"{PROG}: {where} holds more than one token (it has spaces or line breaks)")
    return token


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib would turn a redirected POST into a GET without the report; say so instead.
    def redirect_request(self, *args, **kwargs):
        return None


def _one_line(text, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _warn_left_out(body: bytes) -> None:
    """The hub takes a report but leaves out a device another node has: say which."""
    try:
        left_out = json.loads(body).get("left_out")
    except (ValueError, AttributeError):
        return
    for sentence in left_out[:8] if isinstance(left_out, list) else ():
        log.warning(
            "the hub left a device out: %s (a copied inventory or a spoofed agent; check nvidia-smi -L on both)",
            _one_line(sentence),
        )


def _hub_message(e: urllib.error.HTTPError) -> str:
    """The hub's own message from its JSON error body, else the HTTP reason."""
    if 300 <= e.code < 400:
        return f"it redirects to {e.headers.get('Location')}; give that address as --hub-url"
    try:
        body = json.loads(e.read(4096))
        message = body.get("message") if isinstance(body, dict) else None
    except (OSError, ValueError, http.client.HTTPException):
        message = None
    return _one_line(message or e.reason or "no reason given")


class Token:
    """The agent's token, from --token-file (read again when the file changes, so that a
    rotated token needs no restart) or from $GPUSPAWNER_AGENT_TOKEN."""

    def __init__(self, token_file: str | None):
        self.file = token_file
        self.value = read_token(token_file)
        self._seen: tuple | None = self._stamp()  # the file's identity when last read

    def _stamp(self) -> tuple | None:
        try:
            st = os.stat(self.file) if self.file else None
        except OSError:
            return None
        return st and (st.st_ino, st.st_mtime_ns, st.st_size)

    def changed(self) -> bool:
        """The file is not the one last read (it may hold a new token)."""
        return bool(self.file) and self._stamp() != self._seen

    def refresh(self, force: bool = False) -> bool:
        """Read the file again if it changed (or ``force``); True when the token is new.
        A file that cannot be read now keeps the token in use (AgentError says why)."""
        if not self.file:
            return False
        if not force and not self.changed():
            return False
        self._seen = self._stamp()  # this state of the file is dealt with, read or not: no retry loop
        token = read_token(self.file)
        changed, self.value = token != self.value, token
        return changed


class HubClient:
    """Posts reports to the hub: one seam, every failure turned into a one-line HubError."""

    def __init__(self, url: str, token: Token, timeout: float = DEFAULT_TIMEOUT_S):
        self.url = url
        self.timeout = timeout
        self.token = token
        self.opener = urllib.request.build_opener(_NoRedirect)

    def token_changed(self) -> bool:
        return self.token.changed()

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": f"token {self.token.value}",
            "Content-Type": "application/json",
            "User-Agent": f"{PROG}/{__version__}",
        }

    def post(self, body: bytes) -> None:
        """POST a report. A changed token file is read first; a 403 reads it again and,
        if it holds a new token, tries once more at once."""
        if self.token.refresh():
            log.info("the token file %s holds a new token: using it", self.token.file)
        try:
            self._post(body)
        except _Forbidden:
            if not self.token.refresh(force=True):
                raise
            log.info("the token file %s holds a new token: using it", self.token.file)
            self._post(body)

    def _post(self, body: bytes) -> None:
        request = urllib.request.Request(self.url, data=body, headers=self._headers(), method="POST")
        try:
            with self.opener.open(request, timeout=self.timeout) as response:
                _warn_left_out(response.read(65536))
        except urllib.error.HTTPError as e:
            message = f"the hub answered {e.code}: {_hub_message(e)}"
            if e.code == 403:
                raise _Forbidden(message) from None
            raise HubError(message) from None
        except urllib.error.URLError as e:
            raise HubError(self._unreachable(e.reason)) from None
        except (OSError, http.client.HTTPException) as e:
            raise HubError(self._unreachable(e)) from None

    def _unreachable(self, reason) -> str:
        if isinstance(reason, TimeoutError):
            return f"no answer from the hub within {self.timeout:g} s"
        if isinstance(reason, ConnectionRefusedError):
            return "cannot reach the hub: connection refused"
        text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        return f"cannot reach the hub: {_one_line(text)}"
