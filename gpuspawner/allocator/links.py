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

from collections.abc import Callable, Mapping, Sequence

from ..core.inventory import GPU
from ..core.link_classes import NONE, LinkClass, LinkRequired
from ..core.topology import Topology
from .linked import best_set, fewest_missing, has_set, required_set

__all__ = ["LinkState", "Links"]

Fits = Callable[[str], bool] | None


SETS_KEPT = 4096  # sets remembered across decisions, by how their GPUs are linked (then forgotten all at once)


class LinkState:
    """The allocator's: each host's topology, where known, the admin's requirements, and
    the sets chosen so far by how the free GPUs were linked (hosts of one kind in one
    state are many, and choosing among 8 GPUs is the costly part of a decision)."""

    def __init__(self) -> None:
        self.topologies: dict[str, Topology] = {}
        self.required: LinkRequired = NONE
        self.sets: dict[tuple, tuple[int, ...] | None] = {}

    def decision(self) -> Links:
        if len(self.sets) >= SETS_KEPT:
            self.sets.clear()
        return Links(self.topologies, self.required, self.sets)


class Links:
    """One decision's view of the links (the state must not change while it is used)."""

    def __init__(
        self,
        topologies: Mapping[str, Topology],
        required: LinkRequired,
        sets: dict[tuple, tuple[int, ...] | None] | None = None,
    ):
        self.topologies = topologies
        self.required = required
        self._sets = {} if sets is None else sets  # (n, class, every pair's Link) -> positions
        self._groups: dict[tuple, tuple[GPU, ...] | None] = {}  # (host, n, class, free uuids) -> the set
        self._has: dict[tuple, bool] = {}  # (host, n, class, free uuids) -> whether it has a set that meets

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
            positions = self._positions(topology, [g.uuid for g in free], n, need)
            found = None if positions is None else tuple(free[i] for i in positions)
        self._groups[key] = found
        return found

    def _positions(
        self, topology: Topology, uuids: list[str], n: int, need: LinkClass | None
    ) -> tuple[int, ...] | None:
        """The positions of the set to take of ``uuids``: a pure function of how each pair
        is linked, so remembered by that."""
        m = len(uuids)
        pairs = [topology.link(uuids[a], uuids[b]) for a in range(m) for b in range(a + 1, m)]
        key = (n, need, tuple(pairs))
        if key in self._sets:
            return self._sets[key]
        at = {(a, b): i for i, (a, b) in enumerate((a, b) for a in range(m) for b in range(a + 1, m))}
        link = lambda a, b: pairs[at[(a, b) if a < b else (b, a)]]  # noqa: E731
        score = lambda a, b: link(a, b).score  # noqa: E731
        if need is None:
            found: tuple[int, ...] | None = best_set(m, n, score)
        else:
            found = required_set(m, n, score, lambda a, b: need.met_by(link(a, b)))
        self._sets[key] = found
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
        if key not in self._has:
            topology = self.topologies.get(host)
            uuids = [g.uuid for g in free]
            self._has[key] = topology is not None and has_set(
                range(len(free)), n, lambda a, b: need.met_by(topology.link(uuids[a], uuids[b]))
            )
        return self._has[key]

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
        topology = self.topologies.get(host)
        if topology is None:
            return None
        uuids = [g.uuid for g in devices]
        now = {g.uuid for g in free}
        return fewest_missing(
            len(devices),
            n,
            lambda a, b: need.met_by(topology.link(uuids[a], uuids[b])),
            {i for i, u in enumerate(uuids) if u in now},
        )
