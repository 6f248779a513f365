"""How the GPUs of one multi-GPU server are linked, in words (pure): its farthest
pair's class ("2 NVLinks", "across CPUs") and each pair's, for the home page's
"Your GPUs", the servers API (JupyterLab's status item) and the admin's /hub/gpus;
and, for the spawn form, what a request for a count would get now.

A node whose agent did not say how its GPUs are linked, and a pair it could not
find out, read "not known", never "no link".
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.topology import Link, Path, Topology

__all__ = ["NOT_KNOWN", "holder_links", "link_words", "links_of", "offer_words"]

NOT_KNOWN = "links not known"


def link_words(link: Link) -> str:
    """A pair's link as people read it: "2 NVLinks", "across CPUs", "not known"."""
    words = link.words
    return "not known" if words == "unknown" else words


def links_of(topology: Topology | None, gpus: Sequence[tuple[int, str]]) -> dict | None:
    """The links among a server's GPUs, ``gpus`` as (number shown, UUID), in order:
    ``{"summary", "detail", "pairs": [{"gpus": [a, b], "link"}], "worst"}`` (``worst``:
    the farthest pair's words, None while not known), or None for fewer than two GPUs.

    ``summary`` is one short line ("Links: 2 NVLinks between each pair", "Links: at
    worst across CPUs (GPU 0–2)"), ``detail`` every pair ("GPU 0–1: 2 NVLinks, 0–2:
    across CPUs"), empty where the summary already says it all."""
    if len(gpus) < 2:
        return None
    if topology is None:
        return {
            "summary": f"{NOT_KNOWN.capitalize()} (the node did not report them)",
            "detail": "",
            "pairs": [],
            "worst": None,
        }
    pairs = [(a, b, topology.link(ua, ub)) for i, (a, ua) in enumerate(gpus) for b, ub in gpus[i + 1 :]]
    a, b, worst = min(pairs, key=lambda p: p[2].score)  # the first of the farthest, in order
    words = [link_words(link) for _, _, link in pairs]
    worst_words = link_words(worst)
    known = worst_words != "not known"
    if len(set(words)) == 1:
        if not known:
            summary = NOT_KNOWN.capitalize()
        elif len(pairs) == 1:
            summary = f"Links: {worst_words} (GPU {a}–{b})"
        else:
            summary = f"Links: {worst_words} between each pair"
    elif known:
        summary = f"Links: at worst {worst_words} (GPU {a}–{b})"
    else:
        summary = f"Links: not known for GPU {a}–{b}"
    detail = "" if len(set(words)) == 1 else "GPU " + ", ".join(f"{x}–{y}: {w}" for (x, y, _), w in zip(pairs, words))
    return {
        "summary": summary,
        "detail": detail,
        "pairs": [{"gpus": [x, y], "link": w} for (x, y, _), w in zip(pairs, words)],
        "worst": worst_words if known else None,
    }


def holder_links(devices: dict[str, dict], topology: Topology | None) -> list[dict]:
    """For a host's card on /hub/gpus: each holder of several of its GPUs, as
    ``{"user", "server", "gpus": [index, ...], "links"}`` (:func:`links_of`, the GPUs
    numbered by their index on the node), in the order of their first GPU.
    ``devices``: the host's allocation map entries by UUID, in device order."""
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for uuid, d in devices.items():
        for h in d["holders"]:
            groups.setdefault((h["user"], h["server"]), []).append((d["index"], uuid))
    return [
        {"user": user, "server": server, "gpus": [i for i, _ in gpus], "links": links_of(topology, gpus)}
        for (user, server), gpus in groups.items()
        if len(gpus) > 1
    ]


# A PCIe path as the form's sentence says it.
_PATHS = {
    Path.BOARD: "on one board",
    Path.SWITCH: "behind one PCIe switch",
    Path.SWITCHES: "behind several PCIe switches",
    Path.BRIDGE: "through a host bridge",
    Path.CPU: "on one CPU",
    Path.CROSS_CPU: "across CPUs",
}


def offer_words(model: str, count: int, host: str, link: Link | None) -> str:
    """What a request for ``count`` GPUs of ``model`` gets now, for the spawn form:
    ``host`` and ``link``, the farthest pair of the set it would get there (None: the
    host's links are not known), e.g. "2 × NVIDIA A100 80GB PCIe: an NVLink pair free
    on gpu-7 (2 NVLinks)"."""
    head = f"{count} × {model}: "
    if link is not None and link.nvlinks:
        if count == 2:
            return f"{head}an NVLink pair free on {host} ({link.words})"
        return f"{head}{count} all joined by NVLink free on {host} (at least {link.words} between each pair)"
    if link is None or link.path is None:
        return f"{head}{count} free on {host}, {NOT_KNOWN}"
    path = _PATHS[link.path]
    if link.nvlinks is None:  # the path is known, the NVLinks not
        got = "a pair free on" if count == 2 else f"{count} free on"
        return f"{head}{got} {host}, {'' if count == 2 else 'at worst '}{path} (NVLinks not known)"
    if count == 2:
        return f"{head}a pair free on {host}, {path}, without NVLink"
    return f"{head}{count} free on {host}, not all joined by NVLink: at worst {path}"
