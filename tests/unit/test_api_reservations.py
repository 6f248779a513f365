"""``/hub/api/gpuspawner/reservations[/ID]`` (web/api_reservations.py) in a real
JupyterHub served over HTTP on loopback, as test_api_servers.py serves one (the config
of test_agent_token_api.hub_config, its swarm the in-process fake of tests/fakedocker.py,
its ledger a SQLite file), with a static inventory of two A100s and one T4: what an
admin may reserve, what is refused with which sentence (and that nothing is stored
then), removal, who may ask at all, and the reservations on the /hub/gpus page.

The hub's wall clock for reservations (``ReservationKeeper.wall``) is set by the test,
so the windows listed do not depend on the day the tests run."""

from __future__ import annotations

import json
import re
import urllib.parse
from datetime import datetime, timezone

import pytest
from jupyterhub import orm
from jupyterhub.app import JupyterHub
from tornado.httpclient import AsyncHTTPClient

from gpuspawner import hub_port
from gpuspawner.hub.app import KEY
from tests.unit.test_agent_token_api import ADMIN, READER, hub_config, served

A100 = "NVIDIA A100 80GB PCIe"
T4 = "Tesla T4"
INVENTORY = {
    "gpu-a": [{"uuid": f"GPU-a{i}", "model": A100, "memory_mib": 81920} for i in range(2)],
    "gpu-b": [{"uuid": "GPU-b0", "model": T4, "memory_mib": 15360}],
}
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)  # a Thursday, before the first window
PATH = "/hub/api/gpuspawner/reservations"

CS101 = {
    "group": "cs101",
    "model": A100,
    "count": 2,
    "start": "2026-12-08T14:00",  # a Tuesday, 13:00 UTC in winter
    "end": "2026-12-08T16:00",
    "weekly": True,
    "timezone": "Europe/Berlin",
    "name": "CS101 lab",
}


class Hub:
    """A started hub: its app, its GPU hub, and requests to it with a token."""

    def __init__(self, app: JupyterHub, port: int):
        self.app, self.gpu_hub = app, app.tornado_settings[KEY]
        self.url = f"http://127.0.0.1:{port}"

    async def __call__(self, method: str, path: str = "", token: str | None = ADMIN, body=None) -> tuple[int, dict]:
        headers = {"Authorization": f"token {token}"} if token else {}
        if method in ("GET", "DELETE"):
            data = None
        else:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        r = await AsyncHTTPClient().fetch(
            self.url + PATH + path, method=method, headers=headers, body=data, raise_error=False
        )
        return r.code, json.loads(r.body or b"{}")

    async def listed(self) -> list[dict]:
        code, answer = await self("GET")
        assert code == 200, answer
        return answer["reservations"]

    def user_token(self, name: str) -> str:
        """A user's own token, as /hub/token makes it."""
        return self.app.users[orm.User.find(self.app.db, name)].new_api_token(note=f"{name}'s own")


@pytest.fixture
async def start(monkeypatch, tmp_path):
    """``await start(**gpu_settings)``: a hub with the users anna and boss (an admin),
    who log in with any password (JupyterHub's DummyAuthenticator)."""
    monkeypatch.chdir(tmp_path)
    servers, hubs = [], []

    async def started(**gpu_settings) -> Hub:
        config = hub_config(tmp_path, gpu_inventory_source=["static"], gpu_inventory=INVENTORY, **gpu_settings)
        config.JupyterHub.authenticator_class = "dummy"
        config.Authenticator.allowed_users = {"anna", "boss"}
        groups = ("cs101", "cs102", "physics")
        config.JupyterHub.load_groups = {g: {"users": ["anna"] if g == "cs101" else []} for g in groups}
        config.Authenticator.admin_users = {"boss"}
        app, server, port = await served(config)
        servers.append(server)
        hub = Hub(app, port)
        hubs.append(hub.gpu_hub)
        hub.gpu_hub.reservations.wall = lambda: NOW
        return hub

    yield started
    for server in servers:
        server.stop()
    for gpu_hub in hubs:
        await gpu_hub.stop()


@pytest.fixture
async def hub(start) -> Hub:
    return await start()


async def test_a_weekly_reservation_in_local_time_is_stored_and_answered_in_utc(hub):
    assert await hub.listed() == []
    code, made = await hub("POST", body=CS101)
    assert code == 201, made
    assert made["start"] == "2026-12-08T13:00:00Z" and made["end"] == "2026-12-08T15:00:00Z"
    assert {k: made[k] for k in ("name", "group", "model", "count", "weekly", "timezone", "created_by")} == {
        "name": "CS101 lab",
        "group": "cs101",
        "model": A100,
        "count": 2,
        "weekly": True,
        "timezone": "Europe/Berlin",
        "created_by": "admin",  # the admin service whose token asked
    }
    assert isinstance(made["id"], int)

    (listed,) = await hub.listed()
    assert listed["id"] == made["id"] and listed["name"] == "CS101 lab"
    assert listed["window"] == {"start": "2026-12-08T13:00:00Z", "end": "2026-12-08T15:00:00Z"}
    assert listed["open"] is False and listed["members_hold"] == 0 and listed["unused"] == 2

    hub.gpu_hub.reservations.wall = lambda: datetime(2026, 12, 15, 13, 30, tzinfo=timezone.utc)
    (listed,) = await hub.listed()  # the second Tuesday, during the window
    assert listed["window"] == {"start": "2026-12-15T13:00:00Z", "end": "2026-12-15T15:00:00Z"}
    assert listed["open"] is True
    hub.gpu_hub.reservations.wall = lambda: datetime(2027, 7, 1, tzinfo=timezone.utc)
    (listed,) = await hub.listed()  # summer time: still 14:00 in Berlin, so 12:00 UTC
    assert listed["window"] == {"start": "2027-07-06T12:00:00Z", "end": "2027-07-06T14:00:00Z"}
    assert listed["open"] is False


async def test_an_overlap_beyond_the_models_count_is_refused_naming_the_other(hub):
    """Guards docs/reservations.md, "Making one": "Overlaps that cannot both be met are refused when
    the reservation is made, naming the reservations it conflicts with" and "Nothing is stored
    then"."""
    assert (await hub("POST", body=CS101))[0] == 201
    physics = {
        "group": "physics",
        "model": A100,
        "count": 1,
        "start": "2026-12-15T15:00+01:00",  # the second Tuesday, during CS101's window
        "end": "2026-12-15T17:00+01:00",
        "timezone": "Europe/Berlin",
    }
    code, answer = await hub("POST", body=physics)
    assert code == 400
    message = answer["message"]
    assert message.startswith(f"1 {A100} for physics would need more than the 2 there are")
    assert f"CS101 lab: 2 {A100} every week, Tue 14:00–16:00 Europe/Berlin" in message
    assert [r["name"] for r in await hub.listed()] == ["CS101 lab"]  # nothing stored

    # Right after CS101's window, or of another model, it fits.
    after = physics | {"start": "2026-12-15T16:00+01:00", "end": "2026-12-15T18:00+01:00"}
    assert (await hub("POST", body=after))[0] == 201
    assert (await hub("POST", body=physics | {"model": T4}))[0] == 201
    assert sorted(r["group"] + " " + r["model"] for r in await hub.listed()) == [
        f"cs101 {A100}",
        f"physics {A100}",
        f"physics {T4}",
    ]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"count": 3}, f"the cluster has 2 {A100}, fewer than the 3 asked for"),
        ({"model": "H100"}, f"no H100 in the cluster; its models: {A100}, {T4}"),
        (
            {"colour": "red"},
            "unknown field(s): colour; known: count, end, group, lend, model, name, shares, start, timezone, until, weekly",
        ),
        ({"timezone": "Europe/Atlantis"}, "unknown time zone 'Europe/Atlantis' (an IANA name, e.g. Europe/Berlin)"),
        ({"timezone": ""}, "unknown time zone ''"),
        ({"end": "2026-12-08T13:00"}, "a reservation's end must be after its start"),
        ({"start": "next tuesday"}, "start 'next tuesday' is not an ISO 8601 time"),
        ({"end": None}, "end must be an ISO 8601 time"),
        ({"count": 0}, "a reservation's count is a whole number of GPUs from 1, got 0"),
        ({"count": "2"}, "a reservation's count is a whole number of GPUs from 1, got '2'"),
        ({"weekly": "yes"}, "weekly, lend and shares must be true or false"),
        ({"lend": 1}, "weekly, lend and shares must be true or false"),
        ({"group": ""}, "a reservation needs a group"),
        ({"end": "2026-12-15T14:00"}, "a weekly reservation's window must be shorter than a week"),
        ({"group": "cs10"}, "no JupyterHub group 'cs10': create it first"),  # a typo keeps GPUs for nobody
        (
            {"start": "2027-03-28T02:30", "end": "2027-03-28T04:00"},
            "2027-03-28 02:30 does not exist in Europe/Berlin: the clocks skip that hour",
        ),
    ],
)
async def test_a_bad_reservation_is_refused_with_its_reason_and_nothing_is_stored(hub, change, message):
    code, answer = await hub("POST", body=CS101 | change)
    assert code == 400 and message in answer["message"], answer
    assert await hub.listed() == []


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe", b"", b"[1, 2]", b'"cs101"', b"null"])
async def test_a_body_that_is_no_json_object_is_refused(hub, body):
    code, answer = await hub("POST", body=body)
    assert code == 400 and answer["message"] == "the body must be a JSON object", answer
    assert await hub.listed() == []


HOSTILE = [
    (b"[" * 100_000 + b"]" * 100_000, "the body has 100000 objects and lists; the limit is 64 (a reservation"),
    (json.dumps(CS101 | {"name": "x"}).replace('"x"', "[" * 10 + "]" * 10), "the body is nested more than 4 levels"),
    (json.dumps(CS101 | {"timezone": "Europe"}), "unknown time zone 'Europe' (an IANA name"),  # a tz folder
    (json.dumps(CS101 | {"timezone": "a" * 300}), "unknown time zone 'aaaa"),  # ENAMETOOLONG
    (json.dumps(CS101 | {"timezone": "Europe/" + "a" * 300}), "unknown time zone 'Europe/aaaa"),
    (json.dumps(CS101 | {"name": "CS101\n"}), "a reservation's name is at most 64 letters"),
]


@pytest.mark.parametrize("body, message", HOSTILE, ids=["deep", "deep-field", "tz-folder", "tz-300", "tz-long", "nl"])
async def test_a_hostile_body_is_a_400_with_a_sentence_and_nothing_is_stored(hub, body, message):
    """Guards docs/reservations.md: "A bad body gets 400 with the reason, and nothing is stored" (hostile bodies:
    a deep body, a time zone that is a folder of the tz database or too long a name, a name
    ending in a newline)."""
    code, answer = await hub("POST", body=body)
    assert code == 400 and answer["message"].startswith(message), answer
    assert "\n" not in answer["message"] and "Traceback" not in answer["message"]
    assert await hub.listed() == []


async def test_the_clis_timezone_that_names_a_tz_folder_is_refused_with_a_sentence(hub, monkeypatch, capsys):
    """Guards docs/reservations.md: "A bad body gets 400 with the reason", through `gpuspawner reserve
    --timezone` too."""
    import asyncio

    from gpuspawner.cli import main
    from tests.unit.test_agent_token_api import ADMIN as TOKEN

    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", TOKEN)
    argv = ["--hub-url", hub.url, "reserve", "cs101", A100, "1", "--start", "2026-12-08T14:00"]
    for zone in ("Europe", "a" * 300):
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, main, [*argv, "--end", "2026-12-08T16:00", "--timezone", zone]) == 1
        err = capsys.readouterr().err
        assert f"HTTP 400: unknown time zone {zone!r} (an IANA name, e.g. Europe/Berlin)" in err, err
    assert await hub.listed() == []


async def test_a_removed_reservation_is_answered_once_and_no_longer_listed(hub):
    _, made = await hub("POST", body=CS101)
    _, other = await hub("POST", body=CS101 | {"group": "cs102", "name": "", "model": T4, "count": 1})
    code, gone = await hub("DELETE", f"/{made['id']}")
    assert code == 200 and gone["id"] == made["id"] and gone["name"] == "CS101 lab" and gone["count"] == 2
    assert [r["id"] for r in await hub.listed()] == [other["id"]]
    code, answer = await hub("DELETE", f"/{made['id']}")
    assert code == 404 and answer["message"] == f"no reservation {made['id']}"
    for path in ("/abc", "", "/-1", "/%C2%B2", "/" + "9" * 30):  # ² is a digit to str.isdigit()
        code, answer = await hub("DELETE", path)
        assert code == 400 and "name the reservation" in answer["message"], (path, answer)
    assert [r["id"] for r in await hub.listed()] == [other["id"]]


async def test_only_admins_may_list_make_or_remove_reservations(hub):
    _, made = await hub("POST", body=CS101)
    for token in (hub.user_token("anna"), READER, None):
        assert (await hub("GET", token=token))[0] == 403
        assert (await hub("POST", token=token, body=CS101 | {"group": "anna"}))[0] == 403
        assert (await hub("DELETE", f"/{made['id']}", token=token))[0] == 403
    assert [(r["id"], r["group"]) for r in await hub.listed()] == [(made["id"], "cs101")]  # nothing changed
    # An admin user's own token may (the admin role has admin:servers).
    code, answer = await hub("GET", token=hub.user_token("boss"))
    assert code == 200 and len(answer["reservations"]) == 1


async def test_a_model_alias_names_the_model(start):
    hub = await start(gpu_model_aliases={A100: "A100 (80 GB)"})
    code, made = await hub("POST", body=CS101)  # NVML's name becomes the alias
    assert code == 201 and made["model"] == "A100 (80 GB)"
    code, answer = await hub("POST", body=CS101 | {"model": "A100 (80 GB)", "group": "cs102"})
    assert code == 400 and "CS101 lab: 2 A100 (80 GB) every week" in answer["message"]  # the same model
    code, answer = await hub("POST", body=CS101 | {"model": "H100"})
    assert code == 400 and answer["message"] == f"no H100 in the cluster; its models: A100 (80 GB), {T4}"
    assert [r["model"] for r in await hub.listed()] == ["A100 (80 GB)"]


async def test_far_off_times_are_refused_not_failed(hub):
    for change in (
        {"start": "9999-12-20T00:00", "end": "9999-12-20T02:00"},  # weekly: a year of windows past year 9999
        {"start": "9999-12-31T22:00", "end": "9999-12-31T23:00", "timezone": "America/Adak", "weekly": False},
        {"start": "0001-01-01T00:00", "end": "0001-01-01T02:00", "weekly": False},  # before year 1 in UTC
    ):
        code, answer = await hub("POST", body=CS101 | change)
        assert code == 400 and "out of range" in answer["message"], (change, answer)
    assert await hub.listed() == []


def _cookies(response, jar: dict) -> None:
    for header in response.headers.get_list("Set-Cookie"):
        name, _, value = header.split(";")[0].partition("=")
        jar[name] = value


async def login(hub: Hub, user: str) -> dict:
    """Headers with the login cookies of ``user`` (/hub/gpus is a page: JupyterHub's
    pages take the login cookie, not a token)."""
    jar: dict[str, str] = {}
    client = AsyncHTTPClient()
    form = await client.fetch(hub.url + "/hub/login")
    _cookies(form, jar)
    (xsrf,) = re.findall(rb'name="_xsrf" value="([^"]+)"', form.body)
    done = await client.fetch(
        hub.url + "/hub/login",
        method="POST",
        body=urllib.parse.urlencode({"username": user, "password": "any", "_xsrf": xsrf.decode()}),
        headers={"Cookie": "; ".join(f"{k}={v}" for k, v in jar.items())},
        follow_redirects=False,
        raise_error=False,
    )
    assert done.code == 302, done.body
    _cookies(done, jar)
    return {"Cookie": "; ".join(f"{k}={v}" for k, v in jar.items())}


async def test_the_gpus_page_lists_the_reservations(hub):
    admin = await login(hub, "boss")
    page = await AsyncHTTPClient().fetch(hub.url + "/hub/gpus", headers=admin, follow_redirects=False)
    assert page.code == 200 and b"No GPUs are reserved" in page.body
    _, made = await hub("POST", body=CS101)
    page = (await AsyncHTTPClient().fetch(hub.url + "/hub/gpus", headers=admin, follow_redirects=False)).body.decode()
    table = page[page.index('class="h4 mt-4 gpu-reservations">Reservations</h3>') :]
    table = table[: table.index("</table>")]
    assert f"<td>{made['id']}</td><td>CS101 lab</td><td>cs101</td><td>2 {A100} weekly (Europe/Berlin)</td>" in table
    assert "2026-12-08T13:00:00Z – 2026-12-08T15:00:00Z" in table and "(open)" not in table
    anna = await login(hub, "anna")
    refused = await AsyncHTTPClient().fetch(hub.url + "/hub/gpus", headers=anna, raise_error=False)
    assert refused.code == 403 and b"CS101 lab" not in refused.body


async def test_the_hubs_groups_are_read_as_jupyterhub_has_them(start):
    """What reservations and fair share by group ask of JupyterHub (hub_port), on a real hub."""
    hub = await start()  # c.JupyterHub.load_groups: anna in cs101; cs102 and physics empty
    app = hub.app
    assert hub_port.user_groups(app, "anna") == ["cs101"]
    assert hub_port.user_groups(app, "boss") == []
    assert hub_port.user_groups(app, "nobody") is None
    assert hub_port.group_members(app, "cs101") == ["anna"]
    assert hub_port.group_members(app, "physics") == []
    assert hub_port.group_members(app, "chemistry") is None


async def test_a_share_total_is_stored_for_a_model_users_may_share_and_refused_for_another(start):
    """Guards docs/reservations.md, "Share totals (--shares)": "The model must be one users may share
    (gpu_sharing)" and "a fractional count without --shares is refused too"."""
    hub = await start(gpu_sharing={A100: {"quantum": 0.25}})
    code, made = await hub("POST", body=CS101 | {"count": 1.5, "shares": True})
    assert code == 201 and (made["count"], made["shares"]) == (1.5, True)
    (listed,) = await hub.listed()
    assert (listed["count"], listed["shares"], listed["unused"]) == (1.5, True, 1.5)
    code, answer = await hub("POST", body=CS101 | {"model": T4, "count": 0.5, "shares": True})
    assert (
        code == 400
        and answer["message"] == f"users may not share {T4} on this hub (gpu_sharing): reserve whole GPUs of it"
    )
    code, answer = await hub("POST", body=CS101 | {"group": "cs102", "count": 0.75, "shares": True})
    assert (
        code == 400
        and "would need more than the 2 there are while these are reserved too: CS101 lab: 1.5" in (answer["message"])
    )
    code, answer = await hub("POST", body=CS101 | {"group": "cs102", "count": 1.5})
    assert code == 400 and answer["message"].startswith("a reservation's count is a whole number of GPUs from 1")
    assert len(await hub.listed()) == 1
    admin = await login(hub, "boss")
    page = (await AsyncHTTPClient().fetch(hub.url + "/hub/gpus", headers=admin, follow_redirects=False)).body.decode()
    assert f"<td>1.5 {A100} in shares weekly (Europe/Berlin)</td>" in page


async def test_a_weekly_reservation_until_a_day_is_stored_and_listed_with_it(hub):
    """Guards docs/reservations.md, "Making one": "ends a weekly reservation: no window starts at or
    after it" and "A one-off reservation has none"."""
    code, made = await hub("POST", body=CS101 | {"until": "2027-02-09T00:00"})  # Berlin time
    assert code == 201 and made["until"] == "2027-02-08T23:00:00Z"
    assert (await hub.listed())[0]["until"] == "2027-02-08T23:00:00Z"
    code, answer = await hub("POST", body=CS101 | {"group": "cs102", "weekly": False, "until": "2027-02-09T00:00"})
    assert code == 400 and answer["message"].startswith("only a weekly reservation has an until")
    code, answer = await hub("POST", body=CS101 | {"group": "cs102", "until": "soon"})
    assert code == 400 and answer["message"].startswith("until 'soon' is not an ISO 8601 time")
