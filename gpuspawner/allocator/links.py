"""What a request for several GPUs gets on each host by the links between them, for
one decision: each host's set worked out once, whether it meets the link class the
admin requires, and how many GPUs must free up before one does (pure; the
topologies are read, never changed).

The allocator keeps each host's :class:`~gpuspawner.core.topology.Topology` and the
admin's :class:`~gpuspawner.core.link_classes.LinkRequired` in a :class:`LinkState`,
and makes a :class:`Links` for each decision (or each plan of the line): ranking the
hosts, choosing among them and taking the set all ask it, and it works each host's
set out once. Placement (:mod:`~gpuspawner.allocator.whole`,
:mod:`~gpuspawner.allocator.fragment`), the line's plan
(:mod:`~gpuspawner.allocator.nearest`) and the refusals all read the one rule here: a
set meets a class when every pair of it does (``LinkClass.met_by``), and a host whose
links are not known has no such set.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..core.inventory import GPU
from ..core.link_classes import NONE, LinkClass, LinkRequired
from ..core.topology import Link, Topology
from .linked import best_set, fewest_missing, required_set

__all__ = ["LinkState", "Links"]

Fits = Callable[[str], bool] | None


KEPT = 16_384  # entries remembered across decisions (a few MB; then forgotten all at once)


class LinkState:
    """The allocator's: each host's topology, where known, and the admin's requirements;
    and, across decisions, how the pairs of a host's GPUs are linked and what was
    worked out from that (hosts of one kind in one state are many, and choosing among 8
    GPUs is the costly part of a decision)."""

    def __init__(self) -> None:
        self.topologies: dict[str, Topology] = {}
        self.required: LinkRequired = NONE
        # (host, uuids) -> (its shape, each pair's link); a shape numbers the links of
        # every pair alike (hashed once: the answers' keys are the numbers)
        self.pairs: dict[tuple, tuple[int, tuple[Link, ...]]] = {}
        self.shapes: dict[tuple[Link, ...], int] = {}
        self.answers: dict[tuple, Any] = {}  # (what, n, class, shape, ...) -> the answer

    def set_topology(self, host: str, topology: Topology | None) -> bool:
        """True when it changed (the pairs remembered are then forgotten)."""
        if self.topologies.get(host) == topology:
            return False
        if topology is None:
            del self.topologies[host]
        else:
            self.topologies[host] = topology
        self.pairs.clear()
        return True

    def decision(self) -> Links:
        if max(len(self.pairs), len(self.shapes), len(self.answers)) >= KEPT:
            self.pairs.clear()
            self.shapes.clear()  # (the answers are keyed by them)
            self.answers.clear()
        return Links(self.topologies, self.required, self.pairs, self.shapes, self.answers)


class Links:
    """One decision's view of the links (the state must not change while it is used)."""

    def __init__(
        self,
        topologies: Mapping[str, Topology],
        required: LinkRequired,
        pairs: dict[tuple, tuple[int, tuple[Link, ...]]] | None = None,
        shapes: dict[tuple[Link, ...], int] | None = None,
        answers: dict[tuple, Any] | None = None,
    ):
        self.topologies = topologies
        self.required = required
        self._pairs = {} if pairs is None else pairs
        self._shapes = {} if shapes is None else shapes
        self._answers = {} if answers is None else answers
        self._groups: dict[tuple, tuple[GPU, ...] | None] = {}  # (host, n, class, free uuids) -> the set

    def need(self, model: str, n: int) -> LinkClass | None:
        """The class a request for ``n`` GPUs of ``model`` must get (None: any set)."""
        return self.required.of(model, n)

    def ranks(self, n: int) -> bool:
        """Whether hosts are ranked by how well their set for ``n`` GPUs is linked."""
        return n >= 2 and bool(self.topologies)

    def group(self, model: str, host: str, free: Sequence[GPU], n: int) -> tuple[GPU, ...] | None:
        """The ``n`` of ``free`` (in index order) a request gets on ``host``: the best
        linked where its links are known (:mod:`~gpuspawner.allocator.linked`), else the
        first; meeting the class required. None: no such set there."""
        return self.best(host, free, n, self.need(model, n))

    def best(self, host: str, free: Sequence[GPU], n: int, need: LinkClass | None = None) -> tuple[GPU, ...] | None:
        """As :meth:`group`, for the class ``need`` (None: any set)."""
        key = (host, n, need, tuple(g.uuid for g in free))
        if key in self._groups:
            return self._groups[key]
        topology = self.topologies.get(host)
        found: tuple[GPU, ...] | None
        if n > len(free) or need is not None and topology is None:
            found = None
        elif topology is None or n < 2 or n == len(free) and need is None:
            found = tuple(free[:n])
        else:
            positions = self._positions(topology, host, [g.uuid for g in free], n, need)
            found = None if positions is None else tuple(free[i] for i in positions)
        self._groups[key] = found
        return found

    def _positions(
        self, topology: Topology, host: str, uuids: list[str], n: int, need: LinkClass | None
    ) -> tuple[int, ...] | None:
        """The positions of the set to take of ``uuids``: a pure function of how each pair
        is linked, so remembered by that."""
        shape, pairs = self._links_of(topology, host, uuids)
        key = ("set", n, need, shape)
        if key not in self._answers:
            link = _pair_link(len(uuids), pairs)
            score = lambda a, b: link(a, b).score  # noqa: E731
            if need is None:
                self._answers[key] = best_set(len(uuids), n, score)
            else:
                self._answers[key] = required_set(len(uuids), n, score, lambda a, b: need.met_by(link(a, b)))
        return self._answers[key]

    def _links_of(self, topology: Topology, host: str, uuids: Sequence[str]) -> tuple[int, tuple[Link, ...]]:
        """Each pair's link, (0, 1), (0, 2) ... (1, 2) ..., and the number of that shape;
        remembered per host and GPUs."""
        key = (host, tuple(uuids))
        found = self._pairs.get(key)
        if found is None:
            pairs = tuple(topology.link(a, b) for a, b in itertools.combinations(uuids, 2))
            found = self._pairs[key] = (self._shapes.setdefault(pairs, len(self._shapes)), pairs)
        return found

    def ok(self, model: str, host: str, free: Sequence[GPU], n: int) -> bool:
        """Whether ``host`` can give the request a set of ``n`` of ``free`` now."""
        need = self.need(model, n)
        if n > len(free):
            return False
        if need is None:
            return True
        key = (host, n, need, tuple(g.uuid for g in free))
        if key in self._groups:
            return self._groups[key] is not None
        return self._missing(host, [g.uuid for g in free], range(len(free)), n, need) == 0

    def _missing(self, host: str, uuids: list[str], free: Iterable[int], n: int, need: LinkClass) -> int | None:
        """:func:`~gpuspawner.allocator.linked.fewest_missing` of ``host``'s ``uuids``,
        remembered by how their pairs are linked and which positions are ``free``."""
        topology = self.topologies.get(host)
        if topology is None:
            return None
        shape, pairs = self._links_of(topology, host, uuids)
        now = frozenset(free)
        key = ("missing", n, need, shape, now)
        if key not in self._answers:
            link = _pair_link(len(uuids), pairs)
            self._answers[key] = fewest_missing(len(uuids), n, lambda a, b: need.met_by(link(a, b)), now)
        return self._answers[key]

    def fits(self, model: str, free_of: Mapping[str, Sequence[GPU]], n: int, fits: Fits) -> Fits:
        """``fits``, and where a class is required only the hosts whose free GPUs
        (``free_of``: host -> its free GPUs of ``model``) have a set that meets it."""
        if self.need(model, n) is None:
            return fits
        return lambda h: (fits is None or fits(h)) and self.ok(model, h, free_of[h], n)

    def rank(self, model: str, host: str, free: Sequence[GPU], n: int) -> tuple[int, int]:
        """How well linked the set ``host`` gives is: (its farthest pair's score, all its
        pairs'), higher better; (0, 0) where its links are not known or it gives none."""
        topology = self.topologies.get(host)
        group = None if topology is None else self.group(model, host, free, n)
        if topology is None or group is None:
            return 0, 0
        uuids = [g.uuid for g in group]
        worst = topology.worst(uuids)
        return (0 if worst is None else worst.score), topology.set_score(uuids)

    def missing(self, model: str, host: str, devices: Sequence[GPU], free: Sequence[GPU], n: int) -> int | None:
        """Of ``host``'s ``devices`` of ``model``, how many more must free up (``free``:
        those free now) before it can give a set of ``n`` the request may get; None: it
        never can (too few, or none of its sets meets the class required)."""
        if n > len(devices):
            return None
        need = self.need(model, n)
        if need is None:
            return max(0, n - len(free))
        uuids = [g.uuid for g in devices]
        now = {g.uuid for g in free}
        return self._missing(host, uuids, (i for i, u in enumerate(uuids) if u in now), n, need)


def _pair_link(m: int, pairs: tuple[Link, ...]) -> Callable[[int, int], Link]:
    """The link of positions a and b of ``m``, from :meth:`Links._links_of`'s order."""
    at = {}
    for i, (x, y) in enumerate(itertools.combinations(range(m), 2)):
        at[(x, y)] = at[(y, x)] = i
    return lambda a, b: pairs[at[(a, b)]]
