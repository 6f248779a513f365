"""The spawn-pending page while a spawn waits in line: it says so, with the place,
and its Stop button reads Cancel. Rendered over a stand-in for JupyterHub's own
spawn_pending.html (its two blocks and the button); the place is the hub's line's."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from types import SimpleNamespace

import jinja2

from gpuspawner.core.fairshare import FairShare
from gpuspawner.web.home_gpus import waiting_var
from tests.unit.test_holdings import A100, World
from tests.unit.test_line import WAIT, messages, until

JUPYTERHUB_PAGE = """{% block message %}<p>Your server is starting up.</p>{% endblock message %}
<button type="button" id="stop-server-btn">Stop Server</button>
{% block script %}<script>/* JupyterHub's */</script>{% endblock script %}"""


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


async def test_a_waiting_spawn_says_its_place_and_offers_cancel(tmp_path):
    world = World(tmp_path)
    await world.started(world.spawner("alice", {"gpu_model": A100}))
    bob = world.spawner("bob", WAIT)
    start = asyncio.ensure_future(bob.start())
    await until(lambda: any("number 1" in m for m in messages(bob)))
    user = SimpleNamespace(name="bob", kind="user")
    html = page(waiting_var(world.hub)(user), bob)  # JupyterHub calls template variables with the user
    assert f"Your server is waiting in line for a GPU: number 1 for {A100}." in html
    assert re.search(r"No server of this model has ended yet; 1 holds it now, for \d+ s\.", html)  # alice's
    assert "<strong>Cancel</strong> leaves the line." in html and "Cancel (leave the line)" in html
    assert "starting up" not in html and "Fair share" not in html  # first come, first served: nothing to explain
    world.hub.line.fair = FairShare(timedelta(days=7), timedelta(hours=24))
    html = page(waiting_var(world.hub)(user), bob)
    assert "Fair share orders this line: recent use 0.0 GPU-hours." in html
    start.cancel()
    try:
        await start
    except asyncio.CancelledError:
        pass
    await bob.stop()
    # Not waiting (or not ours): JupyterHub's own page, unchanged.
    for spawner in (bob, SimpleNamespace()):
        html = page(waiting_var(world.hub)(user), spawner)
        assert "Your server is starting up." in html and "Cancel" not in html and "Stop Server" in html
