"""Cookie-authenticated POSTs to gpuspawner's endpoints need JupyterHub's XSRF token.

The handlers subclass ``jupyterhub.apihandlers.base.APIHandler`` and override
none of its checks: JupyterHub's ``BaseHandler.prepare`` authenticates, then
calls ``check_xsrf_cookie`` for every method outside ``_xsrf_safe_methods``
(for API handlers only HEAD and OPTIONS); ``APIHandler.check_xsrf_cookie``
skips token-authenticated requests (the CLI, node agents) and otherwise runs
``jupyterhub._xsrf_utils.check_xsrf_cookie``, which refuses a POST without a
matching ``_xsrf`` argument or X-XSRFToken header with 403. These tests pin
that: a change here or in JupyterHub that loses it fails them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.handlers.base import BaseHandler
from tornado import web
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from gpuspawner.web.api import handlers

POSTING = list(dict.fromkeys(h for _, h in handlers if "post" in vars(h) or "delete" in vars(h)))


def test_every_post_endpoint_is_an_api_handler_with_jupyterhubs_checks():
    """Guards docs/security.md, "A user": "which gpuspawner's handlers inherit"; "An admin (of
    JupyterHub, or its configuration)": "XSRF as for the other POST endpoints"."""
    assert {h.__name__ for h in POSTING} == {"ReportHandler", "RescanHandler", "AgentTokenHandler", "QueueHandler"}
    for h in POSTING:
        assert issubclass(h, APIHandler)
        assert h.prepare is BaseHandler.prepare
        assert h.check_xsrf_cookie is APIHandler.check_xsrf_cookie
        assert "POST" not in h._xsrf_safe_methods and "DELETE" not in h._xsrf_safe_methods


def _handler(cls, headers: dict, *, token: bool):
    app = web.Application(xsrf_cookies=True, cookie_secret="x" * 32, hub=SimpleNamespace(base_url="/hub/"))
    start = RequestStartLine("POST", "/hub/api/gpuspawner/rescan", "HTTP/1.1")
    request = HTTPServerRequest(
        start_line=start,
        headers=HTTPHeaders({"Host": "hub.example.org", **headers}),
        body=b"",
        connection=_Connection(),
    )
    handler = cls(app, request)
    handler._jupyterhub_user = object()  # authenticated, as prepare() leaves it
    handler._token_authenticated = token
    return handler


class _Connection:
    def set_close_callback(self, callback):
        pass


@pytest.mark.parametrize("cls", POSTING)
@pytest.mark.parametrize(
    "headers", [{}, {"Sec-Fetch-Mode": "cors", "Sec-Fetch-Site": "cross-site"}, {"X-XSRFToken": "forged"}]
)
def test_a_cookie_authenticated_post_without_the_token_is_403(cls, headers, monkeypatch):
    """Guards docs/security.md, "A user": "such a POST without JupyterHub's XSRF token is 403"."""
    handler = _handler(cls, headers, token=False)
    monkeypatch.setattr(type(handler), "xsrf_token", property(lambda self: b"the-real-token"))
    with pytest.raises(web.HTTPError) as err:
        handler.check_xsrf_cookie()
    assert err.value.status_code == 403


@pytest.mark.parametrize("cls", POSTING)
def test_a_cookie_authenticated_post_with_the_token_passes(cls, monkeypatch):
    handler = _handler(cls, {"X-XSRFToken": "the-real-token"}, token=False)
    monkeypatch.setattr(type(handler), "xsrf_token", property(lambda self: b"the-real-token"))
    handler.check_xsrf_cookie()


@pytest.mark.parametrize("cls", POSTING)
def test_a_token_authenticated_post_needs_no_xsrf_token(cls):
    _handler(cls, {}, token=True).check_xsrf_cookie()
