"""Quotas for admins in a real JupyterHub served over HTTP on loopback (the harness of
test_api_reservations.py: a static inventory of two A100s and one T4, JupyterHub's
groups cs101, cs102 and physics): ``GET /hub/api/gpuspawner/quotas``, the quotas table
and its problems on /hub/gpus, the doctor's findings, ``gpuspawner quotas``'s table, who
may ask, and a reservation refused where quotas leave too little.

Guards docs/quotas.md, "Where to see them": "/hub/gpus has a table per group and model",
"and so do GET /hub/api/gpuspawner/quotas and gpuspawner quotas", "groups JupyterHub
does not have are named there and by gpuspawner doctor" (and reservations that need more
than quotas leave); and "How quotas and
reservations combine": "one that would need more of a model than its GPUs less those
quotas guarantee is refused"."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from tornado.httpclient import AsyncHTTPClient

from gpuspawner.cli import format_quotas
from gpuspawner.core.reservations import Reservation
from gpuspawner.ledger.ledger import Ledger
from tests.unit.test_agent_token_api import READER
from tests.unit.test_api_reservations import A100, CS101, login, start  # noqa: F401 - the hub fixture

QUOTAS = {"cs101": {A100: {"gpus": 1, "borrow": 0}}, "ghosts": {A100: 1}}


async def get(hub, path: str, token: str | None) -> tuple[int, dict]:
    headers = {"Authorization": f"token {token}"} if token else {}
    r = await AsyncHTTPClient().fetch(hub.url + path, headers=headers, raise_error=False)
    return r.code, json.loads(r.body or b"{}")


async def test_admins_see_each_quota_and_what_cannot_be_met(start):  # noqa: F811 - the fixture of test_api_reservations
    hub = await start(gpu_quotas=QUOTAS)
    code, answer = await get(hub, "/hub/api/gpuspawner/quotas", "admin-token-0123456789abcdef")
    assert code == 200
    rows = {q["group"]: q for q in answer["quotas"]}
    assert rows["cs101"] == {
        "group": "cs101",
        "model": A100,
        "quota": "1",
        "borrow_limit": "0",
        "lend_limit": None,
        "notice_seconds": 600,
        "within": "0",
        "borrowed": "0",
        "idle": "1",
        "waiting": "0",
        "taking_back": [],
    }
    assert [p["problem"] for p in answer["problems"]] == [
        "gpu_quotas names the group 'ghosts', which JupyterHub does not have"
    ]
    table = format_quotas(answer)
    assert "cs101" in table and "WARNING: gpu_quotas names the group 'ghosts'" in table

    for token in (None, READER):
        assert (await get(hub, "/hub/api/gpuspawner/quotas", token))[0] == 403

    code, doctor = await get(hub, "/hub/api/gpuspawner/doctor", "admin-token-0123456789abcdef")
    assert code == 200
    assert any("'ghosts', which JupyterHub does not have" in f["problem"] for f in doctor["findings"])

    admin = await login(hub, "boss")
    page = (await AsyncHTTPClient().fetch(hub.url + "/hub/gpus", headers=admin)).body.decode()
    quotas = page[page.index('class="h4 mt-4 gpu-quotas">Quotas</h3>') :]
    assert "gpu_quotas names the group &#39;ghosts&#39;, which JupyterHub does not have" in quotas
    assert "<td>cs101</td>" in quotas and "borrows at most 0" in quotas


async def test_a_reservation_beyond_what_quotas_leave_is_refused_and_not_stored(start):  # noqa: F811 - the fixture of test_api_reservations
    hub = await start(gpu_quotas={"physics": {A100: 1}})
    code, answer = await hub("POST", body=CS101)  # 2 A100s: quotas guarantee 1 of the 2
    assert code == 400
    assert "of which quotas guarantee 1 at any time: 1 may be reserved, fewer than the 2" in answer["message"]
    assert await hub.listed() == []
    code, made = await hub("POST", body=CS101 | {"count": 1})
    assert code == 201, made


async def test_without_quotas_the_answer_is_empty_and_the_page_has_no_table(start):  # noqa: F811 - the fixture of test_api_reservations
    hub = await start()
    code, answer = await get(hub, "/hub/api/gpuspawner/quotas", "admin-token-0123456789abcdef")
    assert (code, answer) == (200, {"quotas": [], "problems": []})
    assert format_quotas(answer) == "No quotas (gpu_quotas is empty)."
    admin = await login(hub, "boss")
    page = (await AsyncHTTPClient().fetch(hub.url + "/hub/gpus", headers=admin)).body.decode()
    assert "gpu-quotas" not in page


async def test_a_reservation_made_before_the_quotas_that_needs_more_than_they_leave_is_named(start):  # noqa: F811 - the fixture of test_api_reservations
    """Guards docs/quotas.md, "Where to see them": reservations that need more than quotas
    leave (made before the quotas were set) "are named there and by gpuspawner doctor"."""
    hub = await start(gpu_quotas={"physics": {A100: 1}})
    ledger = Ledger(hub.gpu_hub.settings.ledger_url())
    start_at = datetime(2026, 12, 8, 13, tzinfo=timezone.utc)
    ledger.add_reservation(Reservation("cs101", A100, 2, start_at, start_at + timedelta(hours=2), name="Lab"))
    await hub.gpu_hub.reservations.refresh(force=True)  # (as it reads the list every half minute)
    code, answer = await get(hub, "/hub/api/gpuspawner/quotas", "admin-token-0123456789abcdef")
    assert code == 200
    [problem] = [p["problem"] for p in answer["problems"]]
    assert problem.startswith("the reservation Lab: 2 NVIDIA A100 80GB PCIe") and problem.endswith(
        "needs more than the 1 NVIDIA A100 80GB PCIe that quotas leave"
    )
    code, doctor = await get(hub, "/hub/api/gpuspawner/doctor", "admin-token-0123456789abcdef")
    assert any(f["problem"] == problem for f in doctor["findings"])
