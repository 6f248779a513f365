"""The spawn form: each GPU model with how many are free now, and for a count of
2 or more, where a request for it would go now and how the GPUs it would get are
linked; rendered from the hub's holdings with gpuspawner's Jinja template (or the
admin's own)."""

from __future__ import annotations

import functools
from dataclasses import replace

import jinja2

from ..allocator.records import Request
from ..allocator.summary import ModelSummary
from ..cluster.gpu_links import offer_words
from ..cluster.service_spec import enforcement_mode
from ..core.access import Access
from ..core.budget import Budget
from ..core.budget import summary as budget_summary
from ..core.sharing import UNIT, fmt, to_milli
from ..plan.reservations import Keep
from .rules import groups_of

__all__ = ["SHARE_NOTES", "render_form"]

# What a share means on the GPU, in the form, by enforcement mode (see docs/sharing.md).
SHARE_NOTES = {
    "none": "A share is shared with other users' servers without isolation: "
    "each server can still use all of the GPU's memory and compute, so keep to your share.",
    "mps": "Your share's memory and compute are enforced by CUDA MPS on the GPU.",
    "hami": "Your share's memory and compute are enforced on the GPU (HAMi-core).",
}
MAX_SHARE_CHOICES = 20


def _share_choices(summary, room: int) -> list[str]:
    """The shares the form offers: each shareable model's list, or multiples of
    its quantum up to what one device (or, with split, the user's ``room``, in
    thousandths) allows."""
    out: set[int] = set()
    for m in summary:
        if not m.shareable or m.largest_milli <= 0 or room <= 0:
            continue
        if m.shares:
            out.update(x for x in m.shares if x <= room)
            continue
        n = min(room, m.largest_milli if not m.split else room) // m.quantum
        step = max(1, -(-n // MAX_SHARE_CHOICES))
        out.update(m.quantum * k for k in range(step, n + 1, step))
    return [fmt(x) for x in sorted(out)]


def model_flags(summary, room, max_count: int, share_choices) -> dict[str, tuple[bool, bool]]:
    """Per model: whether it can be had now (a whole GPU or a share), and
    whether it may be chosen at all (also to wait in line for it)."""
    flags = {}
    for m in summary:
        share_ok = m.shareable and m.largest_milli > 0 and room > 0 and bool(share_choices)
        available = (m.free > 0 and max_count > 0) or share_ok
        flags[m.model] = (available, available or (room > 0 and m.total > m.unavailable))
    return flags


def last_choice(options: dict, flags: dict[str, tuple[bool, bool]], max_count: int, share_choices) -> dict:
    """The user's last choice, to show again (after a refusal, or for the next
    server): only what the form offers now. A model that cannot be chosen is not
    preselected: its radio is disabled, and would not be sent (a CPU-only server)."""
    model = options.get("gpu_model")
    if not isinstance(model, str) or model not in flags or not flags[model][1]:  # a list (REST): no radio
        return {"selected": None, "last_count": None, "last_share": None, "wait_hint": False}
    count = options.get("gpu_count")
    try:
        text = fmt(to_milli(options["gpu_share"], "gpu_share"))
    except (KeyError, ValueError):
        text = None
    return {
        "selected": model,
        "last_count": count if type(count) is int and 1 <= count <= max_count else None,
        "last_share": text if text in share_choices else None,
        "wait_hint": not flags[model][0] and options.get("gpu_wait") is not True,
    }


def class_rows(classes, summary, flags: dict[str, tuple[bool, bool]]) -> list[dict]:
    """The admin's classes of models as form choices, with their models' counts
    (only models the form offers this user); ``flags`` gains each class's."""
    rows = []
    for name, members in classes.items():
        ms = [m for m in summary if m.model in members]
        if not ms or name in flags:  # a class named as a model: the model is what that name asks for
            continue
        flags[name] = (any(flags[m.model][0] for m in ms), any(flags[m.model][1] for m in ms))
        rows.append(
            {
                "name": name,
                "models": [m.model for m in ms],
                "free": sum(m.free for m in ms),
                "total": sum(m.total for m in ms),
                "largest_block": max(m.largest_block for m in ms),
            }
        )
    return rows


def with_reservations(
    summary: list[ModelSummary], keeper, groups: list[str], quotas=None
) -> tuple[list[ModelSummary], list[str]]:
    """The counts as this user may have them while reservations' windows are open and
    groups' quotas keep GPUs (GPUs kept for others are not offered, nor any beyond the
    user's borrowing limit), and a line for each open window and quota that concerns them."""
    now = keeper.wall()
    mine = keeper.member_of(groups)
    kept = dict(keeper.keep_free(groups))
    for model, k in (quotas.keep_free(groups, {m.model: UNIT for m in summary}) if quotas else {}).items():
        kept[model] = kept.get(model, Keep()) + k
    notes = [] if keeper.known else [keeper.refusal("", groups)]  # none is handed out: say why
    for n in keeper.needs(now):
        r = n.reservation
        until = r.when(n.window.end)
        shares = ", as shares or whole GPUs," if r.shares else ""
        if r.id in mine:
            notes.append(
                f"{r.label}: {n.left} of {fmt(r.milli)} reserved {r.model} GPUs free for you{shares} until {until}."
            )
        elif n.keep:
            notes.append(f"{n.kept} {r.model} GPUs are reserved for {r.label}{shares} until {until}.")
    out = []
    for m in summary:
        k = kept.get(m.model)
        if k:
            allocator = keeper.holdings.allocator
            free = m.free - k.devices  # untouched devices beyond those kept
            # A share goes on an untouched device only where one is left beyond those kept.
            largest = m.largest_milli if free > 0 else allocator.largest_shared_room(m.model) if free == 0 else 0
            if k.room:  # others may take only the room beyond all that is kept
                room = allocator.room(m.model) - k.devices * UNIT - k.room
                free, largest = min(free, room // UNIT), min(largest, room)
            if k.most is not None:  # a borrowing limit
                free, largest = min(free, k.most // UNIT), min(largest, k.most)
            free = max(0, free)
            m = replace(m, free=free, largest_block=min(m.largest_block, free), largest_milli=max(0, largest))
        out.append(m)
    if quotas is not None:
        notes += quotas.form_notes(groups, {m.model: m.free for m in out})
    return out, notes


def link_offers(
    allocator, summary: list[ModelSummary], max_count: int, asked: Request, policy: str | None = None
) -> dict[str, dict[int, str]]:
    """Per model, for each count from 2 to what the form offers of it: what a request
    for that many would get now (the host, and how the set it would get there is linked:
    ``Allocator.link_offers``, a dry run), as the form says it. Counts the form does not
    offer (beyond the user's limit, or the most free on one host as the user may have
    them) are left out. ``asked`` carries the CPU and memory the user's server reserves
    and ``policy`` is the spawner's, so that the host named is the one a spawn gets."""
    out = {}
    for m in summary:
        most = min(m.largest_block, max_count)
        if most < 2:
            continue
        offers = {
            n: offer_words(m.model, n, host, link)
            for n, (host, link) in allocator.link_offers(m.model, asked.cpu_milli, asked.memory_mib, policy).items()
            if n <= most
        }
        if offers:
            out[m.model] = offers
    return out


# Why a host's GPUs cannot be had now, as the form says it (GPUCluster.why_unavailable).
UNAVAILABLE_WORDS = {
    "swarm": "on hosts that are down, drained or paused",
    "refused": "on hosts whose agents' reports are refused (a new agent token not installed yet)",
    "late": "on hosts whose agents have not reported lately",
}


def unavailable_why(cluster, allocator, summary: list[ModelSummary]) -> dict[str, str]:
    """Per model with devices it cannot offer now, what the form says of them: how many are
    on hosts of each cause, e.g. "2 on hosts that are down, drained or paused; 1 on hosts
    whose agents' reports are refused (...)". Devices whose cause is not known are said to
    be on hosts that are down, drained or paused, as before."""
    causes = {h: cluster.why_unavailable(h) for h in allocator.hosts()}
    out = {}
    for m in summary:
        if not m.unavailable:
            continue
        counts: dict[str, int] = {}
        for host, cause in causes.items():
            if cause:
                n = len(allocator.host_devices(host, (m.model,)))
                if n:
                    counts[cause] = counts.get(cause, 0) + n
        counts["swarm"] = counts.get("swarm", 0) + max(0, m.unavailable - sum(counts.values()))
        out[m.model] = "; ".join(f"{counts[c]} {UNAVAILABLE_WORDS[c]}" for c in UNAVAILABLE_WORDS if counts.get(c))
    return out


def _gpus(milli: int) -> int | float:
    """Thousandths as a number of GPUs that prints as people write it (2, 0.5, 1.25)."""
    return milli // UNIT if milli % UNIT == 0 else milli / UNIT


@functools.lru_cache(maxsize=8)
def _templates(paths: tuple[str, ...]) -> jinja2.Environment:
    """The admin's template folders first, then gpuspawner's own; autoescaped."""
    loaders = [jinja2.FileSystemLoader(list(paths)), jinja2.PackageLoader("gpuspawner", "templates")]
    return jinja2.Environment(loader=jinja2.ChoiceLoader(loaders), autoescape=True)


def render_form(
    spawner,
    holdings,
    error: str = "",
    access: Access | None = None,
    budget: Budget | None = None,
    reservations=None,
    quotas=None,
) -> str:
    """The form for ``spawner``'s user, from the hub's ``holdings``: the
    models their ``access`` offers them, with its limit and ``budget``, the
    open windows of ``reservations`` (a ReservationKeeper; None: none) and the
    groups' ``quotas`` (a QuotaKeeper; None: none)."""
    cluster, allocator = holdings.cluster, holdings.allocator
    held = allocator.milli_held_by(spawner.user.name)
    access = access or Access(max_gpus=spawner.max_gpus_per_user)
    asked = spawner._with_reservations(Request())  # the CPU and memory its server reserves
    summary = [m for m in allocator.summary(asked.cpu_milli, asked.memory_mib) if access.allows(m.model)]
    reserved: list[str] = []
    if reservations is not None:
        summary, reserved = with_reservations(summary, reservations, groups_of(spawner), quotas)
    limit = 0 if access.cpu_only or (budget is not None and budget.over) else access.max_gpus
    room = max(0, limit * UNIT - held)
    hosts = [h for h in allocator.hosts() if h in cluster.nodes and cluster.nodes[h].schedulable]
    max_count = min(room // UNIT, max((m.largest_block for m in summary), default=0))
    shares = _share_choices(summary, room)
    flags = model_flags(summary, room, max_count, shares)
    classes = class_rows(spawner.model_classes(), summary, flags)
    options = spawner.user_options or {}
    choice = last_choice(options, flags, max_count, shares)
    if any(c["name"] == choice["selected"] for c in classes):
        choice["wait_hint"] = False  # a class does not wait in line
    offers = link_offers(allocator, summary, max_count, asked, spawner.allocation_policy)
    # The line for the choice shown (a model and a count of 2 or more, no share), so that
    # it is there without JavaScript; the script shows the line of each choice made.
    offer = "" if choice["last_share"] else offers.get(choice["selected"] or "", {}).get(choice["last_count"] or 0, "")
    return (
        _templates(tuple(spawner.template_paths))
        .get_template(spawner.options_form_template)
        .render(
            models=summary,
            classes=classes,
            max_count=max_count,
            limit=limit,
            budget=budget,
            budget_note=budget_summary(budget) if budget else "",
            reservation_notes=reserved,
            held=_gpus(held),
            hosts=hosts if spawner.allow_host_choice else [],
            flags=flags,
            offers=offers,
            offer=offer,
            unavailable_why=unavailable_why(cluster, allocator, summary),
            **choice,
            wait_checked=options.get("gpu_wait") is True,
            error=error,
            room=_gpus(room),
            share_choices=shares,
            share_note=SHARE_NOTES[enforcement_mode(spawner.gpu_share_enforcement, "*")],
        )
    )
