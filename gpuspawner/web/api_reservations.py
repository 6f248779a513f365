"""Reservations for admins (docs/reservations.md), served by JupyterHub under /hub/.

* ``GET /hub/api/gpuspawner/reservations``: every reservation, with its open or
  next window and what its members hold now.
* ``POST /hub/api/gpuspawner/reservations``: a new one, from a JSON body
  ``{"group", "model", "count", "start", "end", "weekly", "timezone", "name", "lend",
  "shares", "until"}`` (``shares``: ``count`` is a total such as 2.5, taken as shares or
  whole GPUs, of a model users may share; ``until``: a weekly one's last window starts
  before it); times are ISO 8601, read in ``timezone`` when they carry no offset. 400 with
  the reason when it is bad or conflicts with others; 201 with it when stored.
* ``DELETE /hub/api/gpuspawner/reservations/ID``: removes it.

They need ``admin:servers``. ``gpuspawner reserve`` uses them.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from .. import hub_port
from ..core.json_shape import JSONShapeError, check_shape
from ..core.reservations import HORIZON_WEEKS, WEEK, Reservation, ReservationError, local, zone_of
from ..ledger.ledger import LedgerError
from .api import ADMIN_SCOPE, _GPUMixin

__all__ = ["handlers", "parse_reservation"]

FIELDS = {"group", "model", "count", "start", "end", "weekly", "timezone", "name", "lend", "shares", "until"}
# A reservation is one object of plain fields: deeper or larger bodies are refused before decoding.
MAX_DEPTH = 4
MAX_CONTAINERS = 64
# Weekly windows are looked at a year past a reservation's end: its times must leave room for that in datetime's range.
MARGIN = (HORIZON_WEEKS + 4) * WEEK


def parse_reservation(body: Any, created_by: str, aliases: dict[str, str]) -> Reservation:
    """A reservation from a POST's JSON body. Raises ReservationError naming what is wrong."""
    if not isinstance(body, dict):
        raise ReservationError("the body must be a JSON object")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise ReservationError(f"unknown field(s): {', '.join(map(str, unknown))}; known: {', '.join(sorted(FIELDS))}")
    zone_name = body.get("timezone", "UTC")
    if not isinstance(zone_name, str):
        raise ReservationError("timezone must be an IANA name, e.g. Europe/Berlin")
    weekly, lend, shares = (body.get(k, False) for k in ("weekly", "lend", "shares"))
    if not all(isinstance(v, bool) for v in (weekly, lend, shares)):
        raise ReservationError("weekly, lend and shares must be true or false")
    name = body.get("name", "")
    if not isinstance(name, str):
        raise ReservationError("name must be a string")
    model = body.get("model")
    zone = zone_of(zone_name)
    times = [_time(body.get(k), k, zone) for k in ("start", "end")]
    until = None if body.get("until") is None else _time(body["until"], "until", zone)
    return Reservation(
        group=body.get("group"),  # type: ignore[arg-type] - checked by Reservation
        model=aliases.get(model, model) if isinstance(model, str) else model,  # type: ignore[arg-type]
        count=body.get("count"),  # type: ignore[arg-type]
        start=times[0],
        end=times[1],
        weekly=weekly,
        lend=lend,
        shares=shares,
        until=until,
        timezone=zone_name,
        name=name,
        created_by=created_by,
    )


def _time(value: Any, key: str, zone: ZoneInfo) -> datetime:
    if not isinstance(value, str):
        raise ReservationError(f"{key} must be an ISO 8601 time, e.g. 2026-12-08T14:00")
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ReservationError(f"{key} {value!r} is not an ISO 8601 time, e.g. 2026-12-08T14:00") from None
    t = t if t.tzinfo is not None else local(t, zone)
    try:
        utc = t.astimezone(timezone.utc)
        _ = (utc - MARGIN, utc + MARGIN)
    except OverflowError:
        raise ReservationError(f"{key} {value!r} is out of range (too far in the past or the future)") from None
    return t


def _body(raw: bytes) -> Any:
    """A POST's JSON, decoded once its shape is checked (json.loads recurses once per
    level); web.HTTPError 400 with the reason when it is not JSON or too deep."""
    try:
        text = raw.decode(json.detect_encoding(raw))
        check_shape(text, "the body", MAX_DEPTH, MAX_CONTAINERS)
        return json.loads(text)
    except JSONShapeError as exc:
        raise web.HTTPError(400, f"{exc} (a reservation is one JSON object of plain fields)") from None
    except (ValueError, LookupError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise web.HTTPError(400, "the body must be a JSON object") from None


class ReservationsHandler(_GPUMixin, APIHandler):
    async def get(self, reservation_id: str | None = None):
        self.require(ADMIN_SCOPE)
        if reservation_id is not None:
            raise web.HTTPError(405, "GET lists every reservation: use /hub/api/gpuspawner/reservations")
        keeper = self.gpu_hub().reservations
        await keeper.refresh(force=True)
        if not keeper.known:
            raise web.HTTPError(503, "the reservations cannot be read: the hub's GPU ledger is unreachable")
        self.write({"reservations": keeper.status()})

    async def post(self, reservation_id: str | None = None):
        self.require(ADMIN_SCOPE)
        if reservation_id is not None:
            raise web.HTTPError(405, "POST to /hub/api/gpuspawner/reservations, without an id")
        hub = self.gpu_hub()
        body = _body(self.request.body or b"null")
        try:
            r = parse_reservation(body, self.current_user.name, hub.settings.gpu_model_aliases)
            models = {m.model: m for m in hub.holdings.allocator.summary()}
            if r.model not in models:
                raise ReservationError(
                    f"no {r.model} in the cluster; its models: {', '.join(sorted(models)) or 'none'}"
                )
            if r.shares and not models[r.model].shareable:
                raise ReservationError(
                    f"users may not share {r.model} on this hub (gpu_sharing): reserve whole GPUs of it"
                )
            if hub_port.group_members(self, r.group) is None:  # (the handler has the hub's db)
                # A typo would keep the GPUs for nobody and stop everyone's servers at its start.
                raise ReservationError(
                    f"no JupyterHub group {r.group!r}: create it first (the admin page, or c.JupyterHub.load_groups)"
                )
            made = await hub.reservations.add(r, models[r.model].total, hub.quotas.guaranteed(r.model))
        except ReservationError as exc:
            raise web.HTTPError(400, str(exc)) from None
        except LedgerError as exc:
            raise web.HTTPError(503, str(exc)) from None
        self.log.info("gpuspawner: %s reserved %s", self.current_user.name, made.describe())
        self.set_status(201)
        self.write(made.as_json())

    async def delete(self, reservation_id: str | None = None):
        self.require(ADMIN_SCOPE)
        if reservation_id is None or not re.fullmatch(r"[0-9]{1,18}", reservation_id):
            raise web.HTTPError(400, "name the reservation: /hub/api/gpuspawner/reservations/ID")
        try:
            gone = await self.gpu_hub().reservations.remove(int(reservation_id))
        except LedgerError as exc:
            raise web.HTTPError(503, str(exc)) from None
        if gone is None:
            raise web.HTTPError(404, f"no reservation {reservation_id}")
        self.log.info("gpuspawner: %s removed the reservation %s", self.current_user.name, gone.describe())
        self.write(gone.as_json())


handlers = [
    (r"/api/gpuspawner/reservations", ReservationsHandler),
    (r"/api/gpuspawner/reservations/([^/]+)", ReservationsHandler),
]
