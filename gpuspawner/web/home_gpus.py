"""The home page's "Your GPUs": per server, what it holds and for how long.

For ``c.JupyterHub.template_vars`` (templates/gpuspawner_servers.html): the
model, host and devices with each one's share and the memory it entitles to,
the memory the server's own processes use there and the device's utilization
(from the node's latest report), how the GPUs of a multi-GPU server are linked
(:mod:`~gpuspawner.web.gpu_links`), how long the GPUs have been held, and when
an idle or held-time limit would stop the server; a server waiting in line
shows its place, with Leave line (templates/gpuspawner_servers.html). Read
from the hub's memory only (no ledger, no swarm call), so the page costs no I/O.
"""

from __future__ import annotations

import logging
from math import inf

from ..cluster.gpu_links import links_of
from ..core.idle import BUDGET
from ..core.line_order import fmt_duration
from ..core.sharing import UNIT, entitled_mib, fmt

__all__ = ["server_rows", "servers_var", "waiting_var"]

log = logging.getLogger("JupyterHub")


def server_rows(hub, user: str) -> list[dict]:
    """The user's servers that hold GPUs or wait in line for them (``hub``: the GPUHub)."""
    holdings, reclaimer = hub.holdings, hub.reclaimer
    notices = hub.notices_of(user) if any(h.user == user for h in holdings.all().values()) else []
    rows = []
    for name, h in sorted(holdings.all().items()):
        if h.user != user or not h.held.uuids:
            continue
        report = holdings.cluster.reports.get(h.held.host, (None, 0.0))[0]
        seen = {d.uuid: d for d in report.devices} if report is not None else {}
        devices = []
        for uuid, milli in zip(h.held.uuids, h.held.milli):
            gpu, dev = holdings.allocator.device(uuid), seen.get(uuid)
            own = [p.used_mib for p in dev.compute if p.service == name and p.used_mib is not None] if dev else []
            devices.append(
                {
                    "uuid": uuid,
                    "share": "the whole GPU" if milli == UNIT else f"{fmt(milli)} of the GPU",
                    "entitled_mib": None if gpu is None else entitled_mib(gpu.memory_mib, milli),
                    "used_mib": sum(own) if dev is not None else None,
                    "utilization": None if dev is None else dev.utilization_gpu,
                }
            )
        rows.append(
            {
                "server": h.held.server,
                "phase": h.phase.value,
                "model": h.held.model,
                "host": h.held.host,
                "devices": devices,
                # Numbered as the server sees them: in NVIDIA_VISIBLE_DEVICES order, from 0.
                "links": links_of(holdings.allocator.topology(h.held.host), list(enumerate(h.held.uuids))),
                "quota": hub.quotas.describe(name),
                "notices": [  # announced stops, soonest first: the server's stop-notice file (docs/quotas.md)
                    {k: n[k] for k in ("reason", "stop_at", "seconds_left", "message")}
                    for n in notices
                    if n["server"] == h.held.server and n["stop_at"] is not None
                ],
                **_times(reclaimer, h, hub.quotas.stop_in(name)),
            }
        )
    for w in hub.line.rows:
        place = hub.line.place(w.service)
        if w.user == user and place is not None:
            waiting = f"Number {place[1]} in line for {place[0]}"
            why = hub.why_waiting(w.service)
            outlook = hub.line.outlook(w.service)
            # Leave line ends the spawn that waits; a row without one (a restarted hub's, until its
            # spawn is resumed) has none to end.
            leave = not hub.line.unowned(w.service)
            rows.append(
                {"server": w.server, "user": w.user, "waiting": waiting, "why": why, "outlook": outlook, "leave": leave}
            )
    return rows


def _times(reclaimer, h, taken_back: tuple[float, str] | None = None) -> dict:
    """How long the GPUs have been held, and what would stop the server when, soonest
    first (``taken_back``: seconds until a quota takes its GPUs back, and whose)."""
    held = reclaimer.timers.held_for(h.name)
    idle = reclaimer.timers.idle_for(h.name)
    limits = reclaimer.limits_for(h)
    stops: list[tuple[float, str]] = []  # (seconds left, what); no countdown yet: last
    if limits.max_held is not None and held is not None:
        what = "weekly budget" if limits.max_held_reason == BUDGET else "held-time limit"
        left = max(0.0, limits.max_held - held)
        stops.append((left, f"{what} in {fmt_duration(left)}"))
    if limits.idle_timeout is not None:
        if idle is None:
            stops.append((inf, f"idle limit: after {fmt_duration(limits.idle_timeout)} without GPU use"))
        else:
            left = max(0.0, limits.idle_timeout - idle)
            stops.append((left, f"idle limit in {fmt_duration(left)} unless its GPU is used"))
    if taken_back is not None:
        left, group = taken_back
        stops.append((left, f"take-back for {group}'s quota in {fmt_duration(left)}"))
    memory_at = reclaimer.memory.stop_at(h.name, reclaimer.memory_policy(h))
    if memory_at is not None:
        left = max(0.0, memory_at - reclaimer.clock())
        stops.append((left, f"memory limit in {fmt_duration(left)} unless it uses less GPU memory"))
    return {"held_for": None if held is None else fmt_duration(held), "stops": [t for _, t in sorted(stops)]}


def servers_var(hub):
    """For ``c.JupyterHub.template_vars``: the logged-in user's rows."""

    def rows(user) -> list[dict]:
        if user is None or getattr(user, "kind", "user") != "user":
            return []
        try:
            return server_rows(hub, user.name)
        except Exception as exc:  # noqa: BLE001 - a page must render even when the GPU side cannot
            log.warning("The GPUs of %s cannot be shown: %s", user.name, exc)
            return []

    return rows


def waiting_var(hub):
    """For ``c.JupyterHub.template_vars`` (JupyterHub calls it with the user): a
    function of a spawner, where that spawn waits in line as ``{"model", "place",
    "outlook", "why"}`` (the estimate, or what is known; the host kept for it and when it
    starts there), or None (the spawn-pending page,
    spawn_pending.html)."""

    def waiting(spawner) -> dict | None:
        try:
            place = hub.line.place(spawner.service_name)
        except Exception:  # noqa: BLE001 - not a GPUSwarmSpawner, or the GPU side cannot say
            return None
        if place is None:
            return None
        return {
            "model": place[0],
            "place": place[1],
            "outlook": hub.line.outlook(spawner.service_name),
            "why": hub.why_waiting(spawner.service_name),
            "order": hub.line.reason(spawner.service_name) if hub.line.fair else "",
        }

    return lambda user: waiting
