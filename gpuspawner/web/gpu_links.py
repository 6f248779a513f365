"""How the GPUs of one multi-GPU server are linked, in words (pure): its farthest
pair's class ("2 NVLinks", "across CPUs") and each pair's, for the home page's
"Your GPUs", the servers API (JupyterLab's status item) and the admin's /hub/gpus.

A node whose agent did not say how its GPUs are linked, and a pair it could not
find out, read "not known", never "no link".
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.topology import Link, Topology

__all__ = ["NOT_KNOWN", "holder_links", "link_words", "links_of"]

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
