"""Resuming the line after a hub restart beside spawns that have an owner: the resume
issues again only the spawns of rows nobody owns. A spawn of the same server that the
user began again meanwhile (its own wait in line, or JupyterHub's pending spawn) is
left alone, and a server JupyterHub is still checking or stopping (the earlier hub's
record) is resumed once that is over; the resume never stops a server that is live."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gpuspawner import hub_port
from gpuspawner.hub import resume
from gpuspawner.ledger.ledger import Ledger
from tests.unit.test_holdings import A100, World, driven
from tests.unit.test_line import WAIT, until
from tests.unit.test_line_priority import ledger_down_at_first, stopped_leftover


class Hub:
    """What resume_waiting touches of the running JupyterHub: its users, the proxy, when it
    has started (``up``), and the spawns the resume issues (``resumed``, each also run)."""

    def __init__(self, monkeypatch, w: World):
        self.w, self.users, self.stops, self.resumed = w, {}, [], []
        self.up = asyncio.Event()
        self.app = SimpleNamespace(users=self.users, proxy=SimpleNamespace(add_user=self._route))
        real = hub_port.spawn_in_background

        def spawn_in_background(app, user, server, options):
            self.resumed.append((user.name, server, options))
            return real(app, user, server, options)

        async def hub_started(app):
            await self.up.wait()

        self.spawn = real  # as JupyterHub's spawn handler: pending while it runs
        monkeypatch.setattr(hub_port, "running_hub", lambda: self.app)
        monkeypatch.setattr(hub_port, "spawn_in_background", spawn_in_background)
        monkeypatch.setattr(hub_port, "hub_started", hub_started)

    async def _route(self, user, server):
        return None

    def user(self, name: str, hook=None):
        """A hub user over a real spawner: its spawn runs JupyterHub's hooks (``hook``) and
        then the spawner's start; its stop is recorded and does to a pending spawn what
        ``User.stop`` does (it is no longer pending; JupyterHub deletes its API token)."""
        spawner = self.w.spawner(name, WAIT)

        async def spawn(server, options):
            if hook is not None:
                await hook()
            spawner.user_options = dict(options)
            await spawner.start()

        async def stop(server):
            self.stops.append(name)
            spawner._spawn_pending = False

        self.users[name] = user = SimpleNamespace(name=name, spawners={"": spawner}, spawn=spawn, stop=stop)
        return user


async def restarted(tmp_path, monkeypatch) -> tuple[World, Hub]:
    """A hub that restarted with the ledger down: alice's server (the earlier hub's) holds
    the one A100; bob waited first in the earlier hub's line, stu after him."""
    w = World(tmp_path)
    w.leftover("alice")
    ledger = Ledger(w.db_url)
    ledger.enqueue("jupyter-bob", "bob", "", A100, 0, WAIT)
    ledger.enqueue("jupyter-stu", "stu", "", A100, 0, WAIT)
    ledger.dispose()
    assert (await w.owner.reconcile())["adopted"] == 1
    return w, Hub(monkeypatch, w)


def live(w: World, service: str) -> bool:
    return w.hub.line.place(service) is not None and not w.hub.line.unowned(service)


@pytest.mark.parametrize("begun", ["waiting in line", "in a hook before the line"])
async def test_resuming_the_line_leaves_alone_a_spawn_of_the_same_server_begun_while_the_ledger_was_down(
    tmp_path, monkeypatch, begun
):
    """The resume cannot read the line at first, and reads it again once the ledger
    answers; before it walks the line, bob (whose wait died with the earlier hub) spawns
    his server again with gpu_wait. The resume issues stu's spawn again and leaves bob's
    alone: his pending server is not stopped (JupyterHub would delete its API token and
    OAuth client) nor spawned a second time. Bob keeps the first place and is served when
    alice's GPU comes back; stu waits behind him. ``begun``: how far bob's spawn has got
    when the resume walks the line (a live wait, or still in JupyterHub's hooks).

    Guards docs/line.md, "A hub restart": "Only the rows nobody owns are resumed" and "the resume
    never stops it (JupyterHub would delete its API token) nor spawns the server a second time".

    Guards docs/reliability.md, "The fault model": "a server its user spawned again meanwhile is
    left to that spawn, neither stopped nor spawned twice"."""
    reads = ledger_down_at_first(monkeypatch)
    w, hub = await restarted(tmp_path, monkeypatch)
    hooked = asyncio.Event()
    go_on = asyncio.Event()

    async def hook():
        hooked.set()
        await go_on.wait()

    bob = hub.user("bob", hook=hook if begun != "waiting in line" else None)
    hub.user("stu")
    resumption = asyncio.ensure_future(resume.resume_waiting(w.hub.line, w.owner))
    await until(lambda: w.hub.line.loaded)  # read again after the ledger came back
    assert len(reads) == 2
    bob_spawn = hub.spawn(hub.app, bob, "", WAIT)
    if begun == "waiting in line":
        await until(lambda: live(w, "jupyter-bob"))
    else:
        await hooked.wait()
        assert w.hub.line.unowned("jupyter-bob") and bob.spawners[""].pending == "spawn"
    hub.up.set()  # the hub has started: the resume walks the line
    assert await resumption == 1
    assert hub.stops == [] and hub.resumed == [("stu", "", WAIT)]
    go_on.set()
    await until(lambda: live(w, "jupyter-bob") and live(w, "jupyter-stu"))
    assert w.hub.line.place("jupyter-bob") == (A100, 1) and w.hub.line.place("jupyter-stu") == (A100, 2)
    assert not bob_spawn.done() and bob.spawners[""].pending == "spawn"
    await stopped_leftover(w, "alice")
    await driven(bob_spawn, w.fake.run_all)
    assert w.owner.get("jupyter-bob").held.uuids == ("GPU-b0",)
    assert [r.service for r in Ledger(w.db_url).waiting()] == ["jupyter-stu"] and hub.stops == []
    stu_spawn = hub.users["stu"].spawners[""]._spawn_future
    stu_spawn.cancel()
    await asyncio.wait([stu_spawn])


class Record:
    """JupyterHub's spawner as resume_waiting reads it (pending, ready), for the earlier
    hub's record of a server: ``pending`` as JupyterHub sets it, ``server`` its entry."""

    def __init__(self, pending=None, server=True):
        self.pending, self.server = pending, server

    @property
    def ready(self):
        return not self.pending and bool(self.server)

    @property
    def active(self):
        return bool(self.pending or self.ready)


def record_of(monkeypatch, w: World, record: Record, stop=None) -> Hub:
    """A hub whose user bob has ``record`` for the server that waited in line; its stop
    runs ``stop`` (the record's entry is gone after it); the spawns it issues only count."""
    hub = Hub(monkeypatch, w)
    hub.up.set()
    issued = asyncio.get_running_loop().create_future()  # never ends: a spawn that waits

    def spawn_in_background(app, user, server, options):
        hub.resumed.append((user.name, server, options))
        return issued

    async def stopped(server):
        hub.stops.append("bob")
        record.pending = "stop"
        if stop is not None:
            await stop()
        record.server, record.pending = None, None

    monkeypatch.setattr(hub_port, "spawn_in_background", spawn_in_background)
    hub.users["bob"] = SimpleNamespace(name="bob", spawners={"": record}, stop=stopped)
    return hub


async def test_a_server_jupyterhub_still_checks_as_the_line_is_resumed_is_resumed_once_jupyterhub_stopped_it(
    tmp_path, monkeypatch
):
    """JupyterHub checks the earlier hub's record of bob's server in the background
    (``init_spawners_timeout``): it is still pending ``check`` when the resume walks the
    line. The resume does not stop it under JupyterHub's check; JupyterHub finds it gone
    and stops it (pending ``stop``), and then the resume issues bob's spawn, once.

    Guards docs/line.md, "A hub restart": "A server JupyterHub is still checking or stopping" and
    "is resumed once that is over"."""
    monkeypatch.setattr(resume, "SETTLE_POLL_SECONDS", 0.01)
    w = World(tmp_path)
    Ledger(w.db_url).enqueue("jupyter-bob", "bob", "", A100, 0, WAIT)
    record = Record(pending="check")
    hub = record_of(monkeypatch, w, record)
    resumption = asyncio.ensure_future(resume.resume_waiting(w.hub.line, w.owner))
    await until(lambda: w.hub.line.loaded)
    await asyncio.sleep(0.1)
    assert hub.stops == [] and hub.resumed == [] and not resumption.done()
    record.pending = "stop"  # JupyterHub's check found the server gone: User.stop
    await asyncio.sleep(0.1)
    assert hub.stops == [] and hub.resumed == [] and not resumption.done()
    record.server, record.pending = None, None  # stopped: the record has no server entry
    assert await asyncio.wait_for(resumption, 5) == 1
    assert hub.stops == [] and hub.resumed == [("bob", "", WAIT)]


async def test_a_row_an_admin_takes_out_of_line_while_the_resume_stops_its_dead_record_is_not_spawned_again(
    tmp_path, monkeypatch
):
    """The resume stops the earlier hub's record of bob's server (it has an entry and no
    service); while that stop runs, an admin takes bob's request out of the line. The
    resume does not then spawn it again.

    Guards docs/line.md, "A hub restart": "A row that left the line before its turn is not resumed"."""
    w = World(tmp_path)
    Ledger(w.db_url).enqueue("jupyter-bob", "bob", "", A100, 0, WAIT)

    async def taken_out():
        assert await w.hub.line.remove("bob", "", RuntimeError("taken out of line by an admin"))

    hub = record_of(monkeypatch, w, Record(), stop=taken_out)
    assert await resume.resume_waiting(w.hub.line, w.owner) == 0
    assert hub.stops == ["bob"] and hub.resumed == [] and Ledger(w.db_url).waiting() == []


async def test_a_server_jupyterhub_checks_past_the_settle_time_is_left_alone_and_the_others_are_resumed(
    tmp_path, monkeypatch, caplog
):
    """Bob's server is still pending ``check`` when the resume gives up waiting for it
    (:data:`resume.SETTLE_SECONDS`): it is neither stopped nor spawned, the hub's log
    says so, and stu's row behind it is resumed all the same.

    Guards docs/line.md, "A hub restart": "after 60 seconds, left with its place until its
    deadline"."""
    monkeypatch.setattr(resume, "SETTLE_SECONDS", 0.2)
    monkeypatch.setattr(resume, "SETTLE_POLL_SECONDS", 0.01)
    w = World(tmp_path)
    ledger = Ledger(w.db_url)
    ledger.enqueue("jupyter-bob", "bob", "", A100, 0, WAIT)
    ledger.enqueue("jupyter-stu", "stu", "", A100, 0, WAIT)
    hub = record_of(monkeypatch, w, Record(pending="check"))
    hub.users["stu"] = SimpleNamespace(name="stu", spawners={})
    assert await asyncio.wait_for(resume.resume_waiting(w.hub.line, w.owner), 5) == 1
    assert hub.stops == [] and hub.resumed == [("stu", "", WAIT)]
    assert "JupyterHub still checks or stops the server of jupyter-bob" in caplog.text
    assert w.hub.line.unowned("jupyter-bob")  # its place holds until its deadline
