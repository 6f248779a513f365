"""The spawn-pending page while a spawn waits in line: a waiting page of its own, with the
model and the place, no progress bar, and a Leave line button; when the line serves the
request it is JupyterHub's page again (progress, then the redirect, by JupyterHub's script).
Rendered over a stand-in for JupyterHub's own spawn_pending.html (its two blocks, the
progress bar and the button); the place is the hub's line's. The page's script is run in
Node over a small stand-in for the browser's DOM (without Node it skips, and fails under CI=true)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from datetime import timedelta
from types import SimpleNamespace

import jinja2

from gpuspawner.core.fairshare import FairShare
from gpuspawner.web.home_gpus import waiting_var
from tests.ci import skip_or_fail
from tests.unit.test_holdings import A100, World
from tests.unit.test_line import WAIT, messages, until
from tests.unit.test_line_priority import cancelled

JUPYTERHUB_PAGE = """<div class="text-center">
{% block message %}<p>Your server is starting up.</p>{% endblock message %}
<div class="progress"><div id="progress-bar" class="progress-bar" aria-valuenow="0"></div></div>
<p id="progress-message"></p></div>
<button type="button" id="stop-server-btn">Stop Server</button>
{% block script %}<script>/* JupyterHub's */</script>{% endblock script %}"""

HIDES_THE_BAR = '<style id="gpuspawner-waiting-style">.progress { display: none; }</style>'


def page(waiting, spawner) -> str:
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(
            [
                jinja2.DictLoader({"templates/spawn_pending.html": JUPYTERHUB_PAGE}),
                jinja2.PackageLoader("gpuspawner", "templates"),
            ]
        ),
        autoescape=True,
    )
    return " ".join(env.get_template("spawn_pending.html").render(gpuspawner_waiting=waiting, spawner=spawner).split())


async def bob_waiting(world: World) -> tuple:
    """Alice holds the one A100 and bob's start waits for it as number 1: (bob, his start)."""
    await world.started(world.spawner("alice", {"gpu_model": A100}))
    bob = world.spawner("bob", WAIT)
    start = asyncio.ensure_future(bob.start())
    await until(lambda: any("number 1" in m for m in messages(bob)))
    return bob, start


async def test_a_waiting_spawn_has_a_waiting_page_with_its_place_and_leave_line(tmp_path):
    world = World(tmp_path)
    bob, start = await bob_waiting(world)
    user = SimpleNamespace(name="bob", kind="user")
    html = page(waiting_var(world.hub)(user), bob)  # JupyterHub calls template variables with the user
    assert f"Waiting for {A100} — number 1 in line</h2>" in html
    assert re.search(r"No server of this model has ended yet; 1 holds it now, for \d+ s\.", html)  # alice's
    assert "<strong>Leave line</strong> takes you out of the line." in html
    assert HIDES_THE_BAR in html  # nothing is starting yet: no empty progress bar
    assert 'button.textContent = "Leave line"' in html and "Cancel" not in html
    # JupyterHub's own message is there, hidden, for when the line serves the request.
    assert '<div id="gpuspawner-starting" hidden><p>Your server is starting up.</p></div>' in html
    assert "Fair share" not in html  # first come, first served: nothing to explain
    world.hub.line.fair = FairShare(timedelta(days=7), timedelta(hours=24))
    html = page(waiting_var(world.hub)(user), bob)
    assert "Fair share orders this line: recent use 0.0 GPU-hours." in html
    await cancelled(bob, start)
    # Not waiting (or not ours): JupyterHub's own page, unchanged, its progress bar shown.
    for spawner in (bob, SimpleNamespace()):
        html = page(waiting_var(world.hub)(user), spawner)
        assert "Your server is starting up." in html and "Stop Server" in html and 'id="progress-bar"' in html
        assert "gpuspawner" not in html and "Leave line" not in html and "display: none" not in html


# A stand-in for the browser: the page's elements by id, and MutationObserver as JupyterHub's
# script triggers it (it sets aria-valuenow on the bar from each progress event).
DOM = """
const els = {}, observers = [];
function el(id, props) { els[id] = Object.assign({ id, hidden: false, attrs: {}, textContent: "",
  getAttribute(a) { return a in this.attrs ? this.attrs[a] : null; },
  setAttribute(a, v) { this.attrs[a] = String(v); observers.filter(o => o.el === this).forEach(o => o.fn()); },
  parentNode: { removeChild(c) { delete els[c.id]; } } }, props); return els[id]; }
el("gpuspawner-waiting-style"); el("gpuspawner-waiting"); el("gpuspawner-starting", { hidden: true });
el("stop-server-btn", { textContent: "Stop Server" }); el("progress-bar", { attrs: { "aria-valuenow": "0" } });
global.document = { getElementById: id => els[id] || null };
global.window = global;
global.MutationObserver = class { constructor(fn) { this.fn = fn; }
  observe(e) { this.el = e; observers.push(this); } disconnect() { observers.splice(observers.indexOf(this), 1); } };
const state = () => ({ bar_hidden: "gpuspawner-waiting-style" in els, waiting: !els["gpuspawner-waiting"].hidden,
  starting: !els["gpuspawner-starting"].hidden, button: els["stop-server-btn"].textContent });
const seen = [];
"""


async def test_when_the_line_serves_the_request_the_waiting_page_turns_into_jupyterhubs(tmp_path):
    """Guards docs/line.md, "Leaving the line": "When the line serves the request, the page becomes
    JupyterHub's again: the progress bar follows the start"."""
    if shutil.which("node") is None:
        skip_or_fail("Node runs the waiting page's script here (apt-get install nodejs)")
    world = World(tmp_path)
    bob, start = await bob_waiting(world)
    html = page(waiting_var(world.hub)(SimpleNamespace(name="bob", kind="user")), bob)
    await cancelled(bob, start)
    script = re.search(r'<script id="gpuspawner-waiting-script">(.*?)</script>', html).group(1)
    run = DOM + "seen.push(state());" + script + "seen.push(state());"
    # "Server requested" (0), then places in line (no progress), then the reservation (20).
    run += 'const bar = els["progress-bar"]; bar.setAttribute("aria-valuenow", "0"); seen.push(state());'
    run += 'bar.setAttribute("aria-valuenow", "20"); seen.push(state()); console.log(JSON.stringify(seen));'
    out = subprocess.run(["node", "-e", run], capture_output=True, text=True, timeout=60, check=True).stdout
    before, waiting, still, served = json.loads(out)
    assert before["button"] == "Stop Server"
    assert waiting == still == {"bar_hidden": True, "waiting": True, "starting": False, "button": "Leave line"}
    assert served == {"bar_hidden": False, "waiting": False, "starting": True, "button": "Stop Server"}
