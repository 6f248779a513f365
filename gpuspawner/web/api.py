"""The hub's gpuspawner endpoints, served by JupyterHub itself under /hub/.

* ``POST /hub/api/gpuspawner/report``: node agents post what NVML sees, each
  with its node's own token (see :mod:`gpuspawner.core.agent_tokens`), which may
  report only for that node. A JupyterHub token with the custom scope
  ``custom:gpuspawner:report`` (one shared by all agents) is accepted only
  while ``agent_shared_token`` is on.
* ``GET /hub/api/gpuspawner/agent-tokens``: the hosts that have a token (never
  the tokens); ``POST …/agent-tokens/HOST`` issues a fresh one (the old one
  stops working), ``DELETE …/agent-tokens/HOST`` revokes it.
* ``GET /hub/api/gpuspawner/alloc-map``: who holds which device, and how
  healthy each is. ``POST /hub/api/gpuspawner/rescan`` reconciles the
  holdings with the services the swarm runs, then returns the map.
  ``GET /hub/api/gpuspawner/usage?since=&until=&by=user|model|reason|quota``: GPU-hours
  from the ledger. ``GET /hub/api/gpuspawner/doctor``: known
  misconfigurations and their fixes. ``GET /hub/api/gpuspawner/queue``: who waits
  in line for which model (docs/line.md). These need ``admin:servers`` (the admin role has it).
* ``GET /hub/gpus``: the allocation map as a page, for admins.

They use the hub's one :class:`~gpuspawner.hub.app.GPUHub`, the same the
spawners use, built from the hub's own ``c.GPUSwarmSpawner`` settings.
Register them with :func:`gpuspawner.hubconfig.configure`.

XSRF: the handlers keep JupyterHub's own checks (they override neither
``prepare`` nor ``check_xsrf_cookie``): a cookie-authenticated POST needs the
hub's ``_xsrf`` argument or X-XSRFToken header, or is refused with 403;
token-authenticated requests (the CLI, node agents) need none.
tests/unit/test_api_xsrf.py pins this.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime, timezone

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.scopes import has_scope
from markupsafe import Markup
from tornado import web

from .. import hub_port
from ..cluster.cluster import GPUCluster
from ..cluster.doctor import Finding, diagnose, enforcement_gaps
from ..cluster.gpu_links import holder_links
from ..cluster.host_views import batches
from ..cluster.swarm import SwarmError
from ..core import agent_tokens
from ..core.line_order import by_model, order_reason
from ..core.reports import MAX_REPORT_BYTES, ReportError, parse_report
from ..core.topology import Topology
from ..holdings.holdings import Holdings
from ..hub.app import KEY, GPUHub, HubConfigError
from ..ledger.ledger import LedgerError
from ..line.wait import WaitLine
from ..spawn.errors import NOT_NOW, spawn_error

__all__ = ["ADMIN_SCOPE", "REPORT_SCOPE", "handlers"]

ADMIN_SCOPE = "admin:servers"
REPORT_SCOPE = "custom:gpuspawner:report"  # node agents' tokens: report, nothing else
NODE_REFRESH_SECONDS = 2.0  # an unknown hostname asks the swarm at most this often
UNCONFIGURED = "The hub's GPU configuration is invalid:"
UNREACHABLE = "The cluster cannot be reached right now; please try again in a minute."


class _GPUMixin:
    """The hub's GPUHub, and scope checks that work with custom scopes (JupyterHub's
    ``needs_scope`` decorator checks its scope when the module is imported,
    before the hub has defined custom scopes)."""

    def require(self, scope: str) -> None:
        if not self.current_user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        if not has_scope(scope, self.parsed_scopes, db=self.db):
            raise web.HTTPError(403, f"Action is not authorized with current scopes; requires {scope}")

    def gpu_hub(self) -> GPUHub:
        """The hub's GPUHub (``configure(c)``, which registers these handlers, made
        it), with its parts made; 503 while its GPU settings cannot work."""
        hub: GPUHub = self.settings[KEY]
        try:
            hub.holdings  # noqa: B018 - made at first use
        except HubConfigError as exc:
            raise web.HTTPError(503, f"{UNCONFIGURED} {exc}") from None
        return hub

    def current_holdings(self) -> Holdings:
        """The hub's holdings as they are (no swarm call)."""
        return self.gpu_hub().holdings

    async def ledger(self, call):
        """``call(ledger)`` in the ledger's executor; 503 with the reason when it fails."""
        try:
            return await self.current_holdings().ledger_call(call)
        except LedgerError as exc:
            raise web.HTTPError(503, str(exc)) from None

    async def fresh_holdings(self) -> Holdings:
        """The hub's holdings, with fresh node status."""
        hub = self.gpu_hub()
        try:
            return await hub.up_to_date()
        except SwarmError as exc:
            self.log.warning("The swarm could not be asked: %s", exc)
            raise web.HTTPError(503, UNREACHABLE) from None


class ReportHandler(_GPUMixin, APIHandler):
    async def reporter(self) -> str | None:
        """The host the request's node token belongs to; None for the shared
        agent token while ``agent_shared_token`` allows it; else 403."""
        if self.current_user:  # a JupyterHub token (or a login cookie)
            self.require(REPORT_SCOPE)
            if not self.gpu_hub().settings.agent_shared_token:
                raise web.HTTPError(403, agent_tokens.SHARED_TOKEN_REFUSED)
            return None
        token = self.get_auth_token()
        if agent_tokens.is_node_token(token):
            stored = await self.ledger(lambda db: db.agent_token(agent_tokens.digest(token)))
            if stored is not None and agent_tokens.matches(token, stored.token_sha256):
                return stored.host
        raise web.HTTPError(403, "Missing or invalid credentials.")

    def note_refused(self) -> None:
        """The node the refused report names, when it is one of the swarm's, is told to be
        refused (the form says so of its GPUs once they are not offered: docs/agent.md)."""
        body = self.request.body
        try:
            hostname = parse_report(body).hostname if len(body) <= MAX_REPORT_BYTES else None
            cluster = self.current_holdings().cluster
        except (ReportError, web.HTTPError):
            return
        if hostname in cluster.nodes:
            cluster.report_refused(hostname)

    async def post(self):
        try:
            token_host = await self.reporter()
        except web.HTTPError as exc:
            if exc.status_code == 403:
                self.note_refused()
            raise
        body = self.request.body
        if len(body) > MAX_REPORT_BYTES:
            raise web.HTTPError(400, f"report is {len(body)} bytes; the limit is {MAX_REPORT_BYTES}")
        try:
            report = parse_report(body)
        except ReportError as exc:
            raise web.HTTPError(400, str(exc)) from None
        wrong_host = token_host and agent_tokens.refusal(token_host, report.hostname)
        if wrong_host:
            raise web.HTTPError(403, wrong_host)
        cluster = self.current_holdings().cluster
        if report.hostname not in cluster.nodes:
            # A node that joined since the last look, or not a node at all.
            last = self.settings.get("gpuspawner_nodes_checked", 0.0)
            if time.monotonic() - last >= NODE_REFRESH_SECONDS:
                self.settings["gpuspawner_nodes_checked"] = time.monotonic()
                await self.fresh_holdings()
            if report.hostname not in cluster.nodes:
                raise web.HTTPError(400, f"{report.hostname} is not a node of this swarm")
        left_out = cluster.receive(report)  # a UUID another node has: that device only (doctor shows it)
        self.gpu_hub().reclaimer.observe(report)  # idle timers (docs/idle.md)
        self.gpu_hub().enforcement_seen(report)  # shares where it is missing (docs/sharing.md)
        self.set_header("Content-Type", "application/json")
        self.write(
            {
                "hostname": report.hostname,
                "devices": len(report.devices),
                "interval": report.interval,
                "left_out": [c.sentence() for c in left_out],
            }
        )


class AgentTokenHandler(_GPUMixin, APIHandler):
    """Node agents' tokens, for admins: list, issue (or rotate), revoke."""

    async def get(self, host: str | None = None):
        self.require(ADMIN_SCOPE)
        if host is not None:
            raise web.HTTPError(405, "GET lists every host's token: use /hub/api/gpuspawner/agent-tokens")
        stored = await self.ledger(lambda db: db.agent_tokens())
        self.write({"hosts": [{"host": t.host, "issued_at": _iso(t.issued_at)} for t in stored or []]})

    async def post(self, host: str | None = None):
        self.require(ADMIN_SCOPE)
        host = self._host(host)
        try:
            nodes = (await self.fresh_holdings()).cluster.nodes
        except web.HTTPError:  # the swarm cannot be asked now; issuing does not need it
            nodes = None
        token = agent_tokens.new_token()
        replaced = await self.ledger(lambda db: db.set_agent_token(host, agent_tokens.digest(token)))
        self.log.info("gpuspawner: %s the agent token of %s", "rotated" if replaced else "issued", host)
        self.set_header("Cache-Control", "no-store")  # the token is shown this once
        self.write(
            {"host": host, "token": token, "rotated": bool(replaced), "node": None if nodes is None else host in nodes}
        )

    async def delete(self, host: str | None = None):
        self.require(ADMIN_SCOPE)
        host = self._host(host)
        if not await self.ledger(lambda db: db.revoke_agent_token(host)):
            raise web.HTTPError(404, f"{host} has no agent token: nothing was revoked")
        self.log.info("gpuspawner: revoked the agent token of %s", host)
        self.write({"host": host, "revoked": True})

    @staticmethod
    def _host(host: str | None) -> str:
        if host is None:
            raise web.HTTPError(400, "name the node: /hub/api/gpuspawner/agent-tokens/HOST")
        try:
            return agent_tokens.checked_host(host)
        except ValueError as exc:
            raise web.HTTPError(400, str(exc)) from None


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class AllocMapHandler(_GPUMixin, APIHandler):
    async def get(self):
        self.require(ADMIN_SCOPE)
        holdings = await self.fresh_holdings()
        self.set_header("Content-Type", "application/json")
        self.write(await holdings.cluster.views.alloc_map_json())


class RescanHandler(_GPUMixin, APIHandler):
    async def post(self):
        self.require(ADMIN_SCOPE)
        holdings = await self.fresh_holdings()
        try:
            await holdings.reconcile()
        except SwarmError as exc:
            raise web.HTTPError(503, f"The swarm could not be asked: {exc}") from None
        self.set_header("Content-Type", "application/json")
        self.write(await holdings.cluster.views.alloc_map_json())


class DoctorHandler(_GPUMixin, APIHandler):
    async def get(self):
        self.require(ADMIN_SCOPE)
        holdings = await self.fresh_holdings()
        cluster = holdings.cluster
        reports = cluster.last_reports()
        findings = diagnose(
            cluster.nodes.values(),
            cluster.settings.static,
            reports,
            cluster.stale,
            cluster.settings.sources,
            cluster.aliases,
            foreign=holdings.foreign,
            conflicts=cluster.uuid_conflicts,
            shared_token=self.gpu_hub().settings.agent_shared_token,
            enforcement=self.gpu_hub().settings.gpu_share_enforcement,
        )
        hub = self.gpu_hub()
        await hub.reservations.refresh()
        quotas = hub.quotas.problems(
            lambda group: hub_port.group_members(self, group) is not None, hub.reservations.reservations
        )
        findings += [Finding("warning", "", problem, fix) for problem, fix in quotas]
        self.set_header("Content-Type", "application/json")
        self.write({"findings": [f.as_dict() for f in findings]})


class QueueHandler(_GPUMixin, APIHandler):
    """Each model's line: ``{model: [{user, server, since, position, request}]}``;
    ``DELETE .../queue/USER[/SERVER]`` takes a request out of it."""

    async def get(self):
        self.require(ADMIN_SCOPE)
        hub = self.gpu_hub()
        self.write(await queue_json(hub.line, hub.why_waiting))

    async def delete(self, user: str | None = None, server: str | None = None):
        self.require(ADMIN_SCOPE)
        if not user:
            raise web.HTTPError(400, "name the request: /hub/api/gpuspawner/queue/USER[/SERVER]")
        server = server or ""
        ended = spawn_error(
            "An admin took your request out of the line for a GPU; start your server again to wait anew.",
            reason="line_removed",
            status_code=NOT_NOW,
        )
        row = await self.gpu_hub().line.remove(user, server, ended)
        if row is None:
            where = f"{user}'s server {server!r}" if server else f"{user}'s default server"
            raise web.HTTPError(404, f"{where} is not waiting in line: nothing was removed")
        self.log.info("gpuspawner: %s took %s out of the line for %s", self.current_user.name, row.service, row.model)
        self.write({"user": row.user, "server": row.server, "model": row.model, "removed": True})


async def queue_json(line: WaitLine, why: Callable[[str], str] | None = None) -> dict:
    """Each model's line in order, with why each waiter stands there ("order"), the
    host kept for it at the line's last serving ("planned_host"), what it waits for
    ("why": ``why(service)``, the GPUHub's, or the line's own) and, with fair share,
    the recent use it was ordered by."""
    why = why or (lambda service: line.plan_text(service) or line.why(service))
    await line.load()
    await line.read_use()
    standing = line.standing()
    return {
        model: [
            {
                "user": w.user,
                "server": w.server,
                "since": _iso(w.since),
                "position": i,
                "request": w.request,
                "order": order_reason(w, standing),
                "planned_host": line.planned_host(w.service),  # kept for it (backfill); None: behind others
                "planned_start": _iso(at) if (at := line.planned_at(w.service)) else None,  # where limits tell
                "passed_by": line.passed.get(w.service, []),  # granted ahead of it, on hosts it does not need
                "why": why(w.service),  # what it waits for, in a sentence
                **({} if standing is None else {"recent_gpu_hours": round(standing.used.get(w.user, 0.0), 3)}),
            }
            for i, w in enumerate(waiters, 1)
        ]
        for model, waiters in by_model(line.rows, standing).items()
    }


class UsageHandler(_GPUMixin, APIHandler):
    """GPU-hours per user, model, end reason or quota standing: ``?since=ISO&until=ISO&by=user|model|reason|quota``."""

    async def get(self):
        self.require(ADMIN_SCOPE)
        since, until = (_time_arg(self.get_argument(k, "")) for k in ("since", "until"))
        by = self.get_argument("by", "user")
        if by not in ("user", "model", "reason", "quota"):
            raise web.HTTPError(400, f"by={by!r}: use user, model, reason or quota")
        holdings = await self.fresh_holdings()
        fair = self.gpu_hub().line.fair if by == "user" else None
        recent: dict[str, float] = {}
        try:
            rows = await holdings.ledger_call(lambda db: db.usage(since, until, by))
            if fair is not None and rows:
                recent = await holdings.ledger_call(lambda db: db.recent_use([u.key for u in rows], fair)) or {}
        except LedgerError as exc:
            raise web.HTTPError(503, str(exc)) from None
        except ValueError as exc:  # e.g. since after until
            raise web.HTTPError(400, str(exc)) from None
        self.set_header("Content-Type", "application/json")
        self.write(
            {
                "by": by,
                "since": since.isoformat() if since else None,
                "until": until.isoformat() if until else None,
                "usage": [
                    {
                        "key": u.key,
                        "gpu_hours": round(u.gpu_hours, 6),
                        "peak_memory_mib": u.peak_memory_mib,
                        **({"recent_gpu_hours": round(recent.get(u.key, 0.0), 6)} if fair is not None else {}),
                    }
                    for u in rows or []
                ],
            }
        )


def _time_arg(text: str) -> datetime | None:
    """An ISO 8601 time (UTC when no zone is given), or None when empty."""
    if not text:
        return None
    try:
        # Python 3.10's fromisoformat does not read the "Z" zone (3.11's does).
        t = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise web.HTTPError(400, f"{text[:40]!r} is not an ISO 8601 time such as 2026-11-01T00:00:00Z") from None
    t = t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    try:
        t.astimezone(timezone.utc)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+05:00 is before year 1 in UTC
        raise web.HTTPError(400, f"{text[:40]!r} is out of range: give a time from year 1 to 9999 in UTC") from None
    return t


class HostCard:
    """One host's card on the GPU page, UTF-8, from the (synchronous) template
    gpus_host.html; safe to call from a thread. Equal for the same template (and
    ``topology_of``), so the cards the cluster keeps are reused until the template
    changes. ``topology_of(host)``: how its GPUs are linked (the allocator's, which
    comes with each report: a card is made again at each one), for the links among
    the GPUs of each holder of several."""

    def __init__(self, template, topology_of: Callable[[str], Topology | None] | None = None):
        self.template = template
        self.topology_of = topology_of

    def __call__(self, host: str, devices: dict[str, dict], stale: str | None) -> bytes:
        topology = self.topology_of(host) if self.topology_of is not None else None
        linked = holder_links(devices, topology)
        return self.template.render(host=host, devices=devices, stale=stale, holder_links=linked).encode()

    def __eq__(self, other) -> bool:
        return isinstance(other, HostCard) and other.template is self.template and other.topology_of == self.topology_of

    __hash__ = None


CARDS = "<!-- gpuspawner: the hosts' cards -->"


async def gpu_page(
    cluster: GPUCluster, render_page, card_template, enforcement: str | dict = "none"
) -> tuple[str, list[bytes], str]:
    """The GPU page as what comes before the hosts' cards, the cards, and what
    comes after. ``render_page(**namespace)`` renders gpus.html (awaitable);
    ``card_template`` is gpus_host.html, synchronous. Each card is kept by the
    cluster until its host changes, as UTF-8: a page of 8,000 devices is ~6 MB,
    written as it is rather than copied through the page template. ``enforcement``:
    ``gpu_share_enforcement``, for the nodes that lack what it needs."""
    cards = await cluster.views.host_views("html", HostCard(card_template, cluster.allocator.topology), inline=2)
    reports = cluster.last_reports()
    gaps = enforcement_gaps(enforcement, reports)
    page = await render_page(hosts=Markup(CARDS) if cards else Markup(""), stale=cluster.stale, enforcement=gaps)
    head, _, tail = page.partition(CARDS)
    return head, cards, tail


class GPUPageHandler(_GPUMixin, BaseHandler):
    @web.authenticated
    async def get(self):
        self.require(ADMIN_SCOPE)
        holdings = await self.fresh_holdings()
        cluster = holdings.cluster
        hub = self.gpu_hub()
        lines = {
            model: [{**w, "since": w["since"].replace("T", " ")} for w in ws]
            for model, ws in (await queue_json(hub.line, hub.why_waiting)).items()
        }
        keeper = self.gpu_hub().reservations
        await keeper.refresh()
        render = functools.partial(
            self.render_template,
            "gpus.html",
            lines=lines,
            reservations=keeper.status(),
            reservations_known=keeper.known,
            quotas=hub.quotas.status(),
            quota_problems=hub.quotas.problems(
                lambda group: hub_port.group_members(self, group) is not None, keeper.reservations
            ),
        )
        card = self.get_template("gpus_host.html", sync=True)
        head, cards, tail = await gpu_page(cluster, render, card, self.gpu_hub().settings.gpu_share_enforcement)
        # Sent a piece at a time: one copy of megabytes would hold up the event loop for milliseconds.
        for piece in batches([head.encode(), *cards, tail.encode()]):
            self.write(piece)
            await self.flush()
        self.finish()


handlers = [
    (r"/api/gpuspawner/report", ReportHandler),
    (r"/api/gpuspawner/agent-tokens", AgentTokenHandler),
    (r"/api/gpuspawner/agent-tokens/([^/]+)", AgentTokenHandler),
    (r"/api/gpuspawner/alloc-map", AllocMapHandler),
    (r"/api/gpuspawner/rescan", RescanHandler),
    (r"/api/gpuspawner/usage", UsageHandler),
    (r"/api/gpuspawner/queue", QueueHandler),
    (r"/api/gpuspawner/queue/([^/]+)", QueueHandler),
    (r"/api/gpuspawner/queue/([^/]+)/([^/]+)", QueueHandler),
    (r"/api/gpuspawner/doctor", DoctorHandler),
    (r"/gpus", GPUPageHandler),
]
