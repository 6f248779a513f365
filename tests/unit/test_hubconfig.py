"""configure(c) in a real JupyterHub: the hub, initialized from that config,
routes gpuspawner's URLs to gpuspawner's handlers.

They are registered through ``JupyterHub.extra_handlers``, which JupyterHub
calls deprecated (README, "Configuration", says why it is still used): the day
JupyterHub stops serving them, this test fails.
"""

from __future__ import annotations

import asyncio
import logging
import os
from types import SimpleNamespace

import pytest
from jupyterhub.app import JupyterHub
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine
from traitlets.config import Config

from gpuspawner.hubconfig import TEMPLATES, configure
from gpuspawner.web import api, api_reclaim, api_servers


@pytest.fixture
def hub(monkeypatch, tmp_path, caplog) -> JupyterHub:
    monkeypatch.chdir(tmp_path)  # whatever the hub writes, it writes here
    c = Config()
    c.JupyterHub.spawner_class = "gpuswarm"
    c.JupyterHub.db_url = "sqlite:///:memory:"
    c.JupyterHub.cookie_secret = b"0" * 32
    c.GPUSwarmSpawner.max_gpus_per_user = 2
    configure(c)  # outside an event loop: no reconciliation is started
    app = JupyterHub()
    app.log.addHandler(caplog.handler)  # the app's log does not propagate to caplog's
    try:
        app.update_config(c)
        asyncio.run(app.initialize([]))
    finally:
        app.log.removeHandler(caplog.handler)
    return app


def handler_for(app: JupyterHub, method: str, path: str) -> type:
    start = RequestStartLine(method, path, "HTTP/1.1")
    request = HTTPServerRequest(start_line=start, headers=HTTPHeaders({"Host": "127.0.0.1:8000"}))
    return app.tornado_application.default_router.find_handler(request).handler_class


@pytest.mark.parametrize(
    "method, path, handler",
    [
        ("POST", "/hub/api/gpuspawner/report", api.ReportHandler),
        ("GET", "/hub/api/gpuspawner/agent-tokens", api.AgentTokenHandler),
        ("POST", "/hub/api/gpuspawner/agent-tokens/gpu-a", api.AgentTokenHandler),
        ("GET", "/hub/api/gpuspawner/alloc-map", api.AllocMapHandler),
        ("POST", "/hub/api/gpuspawner/rescan", api.RescanHandler),
        ("GET", "/hub/api/gpuspawner/usage?by=model", api.UsageHandler),
        ("GET", "/hub/api/gpuspawner/doctor", api.DoctorHandler),
        ("GET", "/hub/gpus", api.GPUPageHandler),
        ("GET", "/hub/api/gpuspawner/notices", api_reclaim.NoticesHandler),
        ("GET", "/hub/api/gpuspawner/idle", api_reclaim.IdleHandler),
        ("GET", "/hub/api/gpuspawner/servers/anna", api_servers.ServerGPUsHandler),
        ("GET", "/hub/api/gpuspawner/servers/anna/big", api_servers.ServerGPUsHandler),
    ],
)
def test_the_hub_routes_gpuspawners_urls_to_its_handlers(hub, method, path, handler):
    """Guards docs/how-it-works.md, "How configure(c) registers the endpoints": "It appends
    gpuspawner's handlers to c.JupyterHub.extra_handlers"."""
    assert handler_for(hub, method, path) is handler


def test_the_handlers_see_the_hubs_own_spawner_settings_scope_and_templates(hub):
    # The handlers build the hub's holdings from the tornado settings' config.
    assert hub.tornado_application.settings["config"].GPUSwarmSpawner.max_gpus_per_user == 2
    assert api.REPORT_SCOPE in hub.custom_scopes
    assert TEMPLATES in hub.template_paths
    # gpuspawner's home.html (its notes above JupyterHub's page) is the one the hub renders
    home = hub.tornado_settings["jinja2_env"].get_template("home.html")
    assert home.filename.startswith(TEMPLATES)
    assert "gpuspawner_budget" in hub.tornado_settings["template_vars"]


def test_the_admins_own_template_folders_come_first(tmp_path, monkeypatch):
    c = Config()
    c.JupyterHub.template_paths = [str(tmp_path)]
    configure(c)
    assert c.JupyterHub.template_paths == [str(tmp_path), TEMPLATES]


def test_the_home_page_is_jupyterhubs_with_the_notices_of_the_users_servers(hub):
    env = hub.tornado_application.settings["jinja2_env"]
    _, path, _ = env.loader.get_source(env, "home.html")
    assert path == os.path.join(TEMPLATES, "home.html")
    assert callable(hub.template_vars["gpuspawner_notices"])
    notices = [{"reason": "idle", "server": "", "message": "Your default server has not used its GPU for a while"}]
    page = _render(env, "gpuspawner_notices.html", gpuspawner_notices=notices)
    assert 'data-reason="idle"' in page and "has not used its GPU for a while" in page
    assert _render(env, "gpuspawner_notices.html", gpuspawner_notices=[]).strip() == ""


def _render(env, name: str, **values) -> str:
    """Render as the hub does: its Jinja environment may be an async one."""
    template = env.get_template(name)
    return asyncio.run(template.render_async(**values)) if env.is_async else template.render(**values)


def test_the_spawn_page_shows_the_same_notices_above_jupyterhubs_form(hub):
    env = hub.tornado_application.settings["jinja2_env"]
    _, path, _ = env.loader.get_source(env, "spawn.html")
    assert path == os.path.join(TEMPLATES, "spawn.html")
    source, _, _ = env.loader.get_source(env, "spawn.html")
    assert '{% include "gpuspawner_notices.html" %}' in source and "{{ super() }}" in source
    # it extends JupyterHub's own page, which still renders the form
    _, parent, _ = env.loader.get_source(env, "templates/spawn.html")
    assert not parent.startswith(TEMPLATES) and "spawn_form" in open(parent).read()


def test_other_urls_under_the_prefix_are_still_jupyterhubs(hub):
    assert handler_for(hub, "GET", "/hub/api/gpuspawner/nothing-here").__module__ == "jupyterhub.apihandlers.base"
    assert handler_for(hub, "GET", "/hub/api/users").__module__ == "jupyterhub.apihandlers.users"


def test_jupyterhub_warns_that_extra_handlers_is_deprecated_as_the_readme_says(hub, caplog):
    """Guards docs/how-it-works.md, "How configure(c) registers the endpoints": "so the hub logs at
    start that JupyterHub.extra_handlers is deprecated"."""
    warnings = [r.getMessage() for r in caplog.get_records("setup") if r.levelno == logging.WARNING]
    assert any(m.startswith("JupyterHub.extra_handlers is deprecated") for m in warnings), warnings


def test_settings_made_after_configure_are_the_hubs_own(tmp_path):
    """configure(c) may run before the last settings (a later line, another config
    file, the command line): the GPUHub reads them at its first use."""
    from gpuspawner.hub.app import KEY

    c = Config()
    c.GPUSwarmSpawner.max_gpus_per_user = 2
    configure(c)
    c.GPUSwarmSpawner.gpu_db_url = f"sqlite:///{tmp_path}/later.sqlite"
    c.GPUSwarmSpawner.reconcile_interval = 7
    hub = c.JupyterHub.tornado_settings.get_value({})[KEY]
    assert hub.settings.gpu_db_url == f"sqlite:///{tmp_path}/later.sqlite"
    assert (hub.settings.max_gpus_per_user, hub.settings.reconcile_interval) == (2, 7)


def test_the_home_pages_budget_note_reads_the_ledger_off_the_event_loop(hub, tmp_path, monkeypatch):
    import threading
    from types import SimpleNamespace

    from gpuspawner.hub.app import GPUHub
    from gpuspawner.ledger.ledger import Ledger
    from gpuspawner.spawn.spawner import GPUSwarmSpawner
    from gpuspawner.web.home_budget import budget_var

    c = Config()
    c.GPUSwarmSpawner.gpu_access = {"*": {"weekly_gpu_hours": 20}}
    c.GPUSwarmSpawner.gpu_db_url = f"sqlite:///{tmp_path}/budget.sqlite"
    readers = []
    spans = Ledger.user_spans
    monkeypatch.setattr(Ledger, "user_spans", lambda *a: readers.append(threading.current_thread()) or spans(*a))
    note = budget_var(GPUHub.from_config(c, GPUSwarmSpawner))
    ann = SimpleNamespace(name="ann", kind="user", groups=[])
    env = hub.tornado_application.settings["jinja2_env"]
    page = _render(env, "gpuspawner_budget.html", gpuspawner_budget=note(ann))
    assert "Your weekly GPU budget: 20.0 of 20 GPU-hours left (over the last 7 days)." in page
    assert readers and threading.main_thread() not in readers
    assert _render(env, "gpuspawner_budget.html", gpuspawner_budget=note(None)).strip() == ""


def test_a_bad_setting_made_after_configure_is_a_clear_hub_config_error():
    from gpuspawner.hub.app import KEY, HubConfigError

    c = Config()
    configure(c)
    c.GPUSwarmSpawner.allocation_policy = "bogus"
    hub = c.JupyterHub.tornado_settings.get_value({})[KEY]
    with pytest.raises(HubConfigError, match="Unknown allocation_policy 'bogus'"):
        hub.settings  # noqa: B018
    with pytest.raises(HubConfigError):
        hub.holdings  # noqa: B018 - the endpoints answer 503 with it, spawns say the configuration is invalid
    assert hub.notices_for(SimpleNamespace(name="ann", kind="user")) == []  # pages still render


def test_the_home_page_renders_without_the_budget_note_while_the_ledger_is_down(hub, tmp_path, monkeypatch, caplog):
    from gpuspawner.hub.app import GPUHub
    from gpuspawner.ledger.ledger import Ledger, LedgerError
    from gpuspawner.spawn.spawner import GPUSwarmSpawner
    from gpuspawner.web.home_budget import budget_var

    c = Config()
    c.GPUSwarmSpawner.gpu_access = {"*": {"weekly_gpu_hours": 20}}
    c.GPUSwarmSpawner.gpu_db_url = f"sqlite:///{tmp_path}/budget.sqlite"

    def down(*args):
        raise LedgerError("the GPU ledger database is unreachable")

    monkeypatch.setattr(Ledger, "user_spans", down)
    note = budget_var(GPUHub.from_config(c, GPUSwarmSpawner))(SimpleNamespace(name="ann", kind="user", groups=[]))
    env = hub.tornado_application.settings["jinja2_env"]
    assert _render(env, "gpuspawner_budget.html", gpuspawner_budget=note).strip() == ""
    assert "The GPU budget of ann is unknown: the GPU ledger database is unreachable" in caplog.text


async def test_the_hubs_http_client_looks_names_up_afresh_each_time(monkeypatch, tmp_path):
    """Servers reached by name get a new address at each start: the hub's client must
    not keep an old one (JupyterHub 6's aiohttp with c-ares kept it for 600 s)."""
    import socket

    monkeypatch.chdir(tmp_path)  # the hub's default ledger, made as it starts, goes there

    from jupyterhub.httpclient import JupyterHubHTTPClient

    from gpuspawner.hub.dns import FreshResolver

    c = Config()
    c.JupyterHubHTTPClient.connector_options = {"limit": 5}
    configure(c)
    options = c.JupyterHubHTTPClient.connector_options
    assert isinstance(options["resolver"], FreshResolver) and options["use_dns_cache"] is False
    assert options["limit"] == 5  # the admin's own options stay
    client = JupyterHubHTTPClient(config=c)
    connector = client._new_connector()
    assert isinstance(connector._resolver, FreshResolver) and not connector.use_dns_cache
    await connector.close()

    answers = iter(["10.0.1.13", "10.0.1.42"])  # the server started again elsewhere

    def getaddrinfo(host, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    resolver = options["resolver"]
    first = await resolver.resolve("jupyter-alice", 8888)
    second = await resolver.resolve("jupyter-alice", 8888)
    assert [r["host"] for r in first + second] == ["10.0.1.13", "10.0.1.42"]
