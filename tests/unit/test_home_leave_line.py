"""The home page of a user waiting in line: there is no server yet to stop or go to, so
JupyterHub's Stop My Server and My Server are hidden, and "Your GPUs" offers Leave line, which
does what the waiting page's button does: JupyterHub's DELETE on the pending server (the spawn
is cancelled and leaves the line). Rendered by the hub's own templates, as configure(c) sets
them up (gpuspawner's home.html over JupyterHub's), with the rows of a hub whose line bob waits
in (the real spawner over the Docker fake). The button's script is run in Node over stand-ins
for require, jQuery and JupyterHub's JHAPI (without Node it skips, and fails under CI=true).

Guards docs/line.md: "While a server waits in line, the home page shows its place under
"Your GPUs" with a Leave line button (for the default server, instead of JupyterHub's Stop My
Server and My Server: there is no server yet)"."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from types import SimpleNamespace

from gpuspawner.web.home_gpus import servers_var
from tests.ci import skip_or_fail
from tests.unit.test_holdings import A100, World
from tests.unit.test_hubconfig import hub  # noqa: F401 - the fixture
from tests.unit.test_line import WAIT, until
from tests.unit.test_line_priority import cancelled
from tests.unit.test_spawn_pending_page import bob_waiting

BOB = SimpleNamespace(name="bob", kind="user", json_escaped_name="bob", spawner=SimpleNamespace(options_form=""))
HIDES_JUPYTERHUBS_BUTTONS = '<style id="gpuspawner-in-line-style">#stop, #start { display: none; }</style>'


def leave_button(server: str) -> str:
    return (
        '<button type="button" class="btn btn-danger btn-sm mt-1 gpuspawner-leave-line" '
        f'data-user="bob" data-server="{server}">Leave line</button>'
    )


async def home(hub, world: World, active: bool) -> str:  # noqa: F811
    """Bob's home page, as the hub renders it (``active``: his default server is pending or running)."""
    env = hub.tornado_application.settings["jinja2_env"]
    page = await env.get_template("home.html").render_async(
        gpuspawner_servers=servers_var(world.hub)(BOB),  # JupyterHub calls template variables with the user
        gpuspawner_notices=world.hub.notices_for(BOB),
        user=BOB,
        default_server=SimpleNamespace(active=active),
        url="/hub/user/bob/",
        base_url="/hub/",
        static_url=lambda *a, **kw: "/hub/static/",
        parsed_scopes=set(),
        allow_named_servers=False,
    )
    return " ".join(page.split())


async def test_a_user_waiting_in_line_is_offered_leave_line_not_jupyterhubs_buttons(tmp_path, hub):  # noqa: F811
    world = World(tmp_path)
    bob, start = await bob_waiting(world)  # alice holds the one A100
    html = await home(hub, world, active=True)  # a pending spawn is active to JupyterHub
    assert f"Number 1 in line for {A100}." in html and leave_button("") in html
    assert HIDES_JUPYTERHUBS_BUTTONS in html  # its Stop My Server and My Server, still in the page
    assert 'id="stop"' in html and 'id="gpuspawner-leave-line-script"' in html
    await cancelled(bob, start)  # Leave line
    html = await home(hub, world, active=False)
    assert "Leave line" not in html and "gpuspawner-in-line-style" not in html and "gpuspawner-leave-line" not in html
    assert re.search(
        r'<a id="start" role="button" class="btn btn-lg btn-primary" href="/hub/user/bob/"> Start My', html
    )


async def test_a_named_server_in_line_has_leave_line_and_the_default_servers_buttons_stay(tmp_path, hub):  # noqa: F811
    world = World(tmp_path)
    await world.started(world.spawner("alice", {"gpu_model": A100}))
    second = world.spawner("bob", WAIT, server="second")
    start = asyncio.ensure_future(second.start())
    # In line, and its wait begun (joining reads the user's use after the row is in line).
    await until(
        lambda: (
            world.hub.line.place(second.service_name) == (A100, 1) and not world.hub.line.unowned(second.service_name)
        )
    )
    html = await home(hub, world, active=False)
    assert "Server “second”" in html and leave_button("second") in html
    assert "gpuspawner-in-line-style" not in html  # his default server has nothing to do with the line
    await cancelled(second, start)


async def test_a_place_without_a_spawn_to_end_has_no_leave_line(tmp_path, hub):  # noqa: F811
    """A restarted hub's row before its spawn is resumed: JupyterHub's DELETE would end nothing."""
    world = World(tmp_path)
    await world.hub.line.join("jupyter-bob", "bob", "", A100, 0, WAIT)
    html = await home(hub, world, active=False)
    assert f"Number 1 in line for {A100}." in html
    assert "Leave line" not in html and "gpuspawner-in-line-style" not in html


# Stand-ins for the browser's require, jQuery (the buttons by their data attributes) and JupyterHub's
# JHAPI, which records the calls; each test clicks a button and settles the request.
BROWSER = """
const calls = [], buttons = {}, dialogs = [];
let reloaded = 0, clickers = [];
function button(server) { return buttons[server] = { attrs: { "data-user": "bob", "data-server": server },
  disabled: false }; }
button(""); button("second");
function $(x) {
  if (typeof x === "string") return { click(fn) { clickers.push(fn); } };
  return { attr(a) { return x.attrs[a]; }, prop(p, v) { x[p] = v; } };
}
class JHAPI { constructor(base) { this.base = base; }
  stop_server(user, o) { calls.push(["stop_server", this.base, user]); this.o = o; }
  stop_named_server(user, server, o) { calls.push(["stop_named_server", this.base, user, server]); this.o = o; } }
let api;
global.require = (deps, fn) => fn($, class extends JHAPI { constructor(b) { super(b); api = this; } },
  { ajax_error_dialog() { dialogs.push("error"); } });
global.window = { jhdata: { base_url: "/hub/" }, location: { reload() { reloaded++; } } };
"""


async def test_leave_line_is_jupyterhubs_delete_on_the_pending_server_then_the_page_reloads(tmp_path, hub):  # noqa: F811
    if shutil.which("node") is None:
        skip_or_fail("Node runs the home page's Leave line script here (apt-get install nodejs)")
    world = World(tmp_path)
    bob, start = await bob_waiting(world)
    html = await home(hub, world, active=True)
    await cancelled(bob, start)
    script = re.search(r'<script id="gpuspawner-leave-line-script">(.*?)</script>', html).group(1)
    run = BROWSER + script
    run += 'clickers[0].call(buttons[""]); const during = buttons[""].disabled; api.o.success();'
    run += 'clickers[0].call(buttons["second"]); api.o.error();'
    run += "console.log(JSON.stringify({calls, during, reloaded, again: buttons.second.disabled, dialogs}));"
    out = subprocess.run(["node", "-e", run], capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out) == {
        # The waiting page's button makes the same call (JupyterHub's spawn_pending.html).
        "calls": [["stop_server", "/hub/", "bob"], ["stop_named_server", "/hub/", "bob", "second"]],
        "during": True,  # not twice
        "reloaded": 1,  # out of line: the page shows JupyterHub's Start My Server again
        "again": False,  # a failed request: the button may be clicked again, and JupyterHub's dialog says why
        "dialogs": ["error"],
    }
