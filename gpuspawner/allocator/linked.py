"""Which of a host's free GPUs a multi-GPU request gets, by how they are linked (pure).

A server that asks for several GPUs trains across them, and NCCL's all-reduce runs
several times faster over NVLink than across a CPU socket. So the set is chosen by
the links between its pairs (:class:`~gpuspawner.core.topology.Topology`): the free
GPUs are split into groups of the size asked in every way, the split whose groups
are best linked in all is taken, and of it the best linked group. Taking the single
best group alone can leave the next request a scattered one (on a DGX-1 with GPUs 0,
2, 4 and 5 free, 0 and 4 share two NVLinks, but taking them leaves 2 and 5 across
the CPUs; 4 and 5 leave 0 and 2 an NVLink). This is the rule of NVIDIA's device
plugin allocator, and its published choices on a DGX-1 are among the tests.

Splits are counted only while few (a host's free GPUs of one model, up to 8 or so
for pairs); beyond, the best linked group alone is taken (its farthest pair first,
then all its pairs), and beyond that too, a group grown greedily. Without links known
the GPUs go in index order, as before.

Where the admin requires every pair of the set to be joined in some way
(:mod:`~gpuspawner.core.link_classes`), the set is the one above when it meets that,
else the best linked of those that do (:func:`required_set`); the sets that do are
found by an exact search, so a host gives one whenever it has one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence, Set
from itertools import combinations
from math import comb, factorial

__all__ = ["best_set", "fewest_missing", "required_set", "PARTITIONS_MAX", "SETS_MAX"]

PARTITIONS_MAX = 2_000  # splits into groups counted at most (8 GPUs into pairs: 105)
SETS_MAX = 5_000  # groups scored at most when the splits are too many

Score = Callable[[int, int], int]  # (position, position) -> the pair's score
Meets = Callable[[int, int], bool]  # (position, position) -> whether the pair is joined as required


def best_set(m: int, n: int, score: Score) -> tuple[int, ...]:
    """The positions (0..m-1, in order) of the ``n`` of ``m`` free GPUs to take, by
    ``score`` of each pair (positions in index order: ties go to the lower ones)."""
    if n >= m:
        return tuple(range(m))
    if n <= 1:
        return tuple(range(n))
    if _partitions(m, n) <= PARTITIONS_MAX:
        best: tuple[int, list[tuple[int, ...]]] | None = None
        for part in _splits(list(range(m + -m % n)), n, m):
            total = sum(_set_score(g, score, m) for g in part)
            if best is None or total > best[0]:
                best = (total, part)
        assert best is not None
        groups = [g for g in best[1] if max(g) < m]
        return max(groups, key=lambda g: (_set_score(g, score, m), [-i for i in g]))
    if comb(m, n) <= SETS_MAX:
        return max(combinations(range(m), n), key=lambda g: (_worst(g, score), _set_score(g, score), [-i for i in g]))
    return _greedy(m, n, score)


def _partitions(m: int, n: int) -> int:
    """How many splits of ``m`` GPUs (padded up to a multiple of ``n``) into groups of ``n``."""
    k = -(-m // n)
    return factorial(k * n) // (factorial(n) ** k * factorial(k))


def _splits(items: list[int], n: int, m: int) -> Iterator[list[tuple[int, ...]]]:
    """Every split of ``items`` into groups of ``n``, the first item's group first;
    positions from ``m`` on are padding, all in one group or in none (so that no
    group of real GPUs is smaller than asked)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    pad = sum(1 for x in items if x >= m)
    for others in combinations(rest, n - 1):
        group = (first, *others)
        if sum(1 for x in group if x >= m) not in (0, pad):
            continue
        left = [x for x in rest if x not in others]
        yield from ([group, *tail] for tail in _splits(left, n, m))


def _set_score(group: Sequence[int], score: Score, m: int | None = None) -> int:
    real = [i for i in group if m is None or i < m]
    return sum(score(a, b) for i, a in enumerate(real) for b in real[i + 1 :])


def _worst(group: Sequence[int], score: Score) -> int:
    return min(score(a, b) for i, a in enumerate(group) for b in group[i + 1 :])


def _greedy(m: int, n: int, score: Score) -> tuple[int, ...]:
    """A group grown from the best linked pair, each time by the GPU best linked to it."""
    a, b = max(combinations(range(m), 2), key=lambda p: (score(*p), -p[0], -p[1]))
    group = [a, b]
    while len(group) < n:
        nxt = max((i for i in range(m) if i not in group), key=lambda i: (sum(score(i, g) for g in group), -i))
        group.append(nxt)
    return tuple(sorted(group))


def required_set(m: int, n: int, score: Score, meets: Meets) -> tuple[int, ...] | None:
    """As :func:`best_set`, of the sets whose every pair ``meets``: its choice where it
    does, else the best linked of those that do (farthest pair, then all pairs, then
    the lower positions; of the first :data:`SETS_MAX` found); None: no set does."""
    if n > m:
        return None
    chosen = best_set(m, n, score)
    if all(meets(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]):
        return chosen
    best: tuple[tuple, tuple[int, ...]] | None = None
    for k, group in enumerate(_cliques(list(range(m)), n, meets)):
        key = (_worst(group, score), _set_score(group, score), [-i for i in group])
        if best is None or key > best[0]:
            best = (key, group)
        if k + 1 == SETS_MAX:
            break
    return None if best is None else best[1]


def fewest_missing(m: int, n: int, meets: Meets, free: Set[int]) -> int | None:
    """Of the sets of ``n`` of positions 0..m-1 whose every pair meets, the fewest
    positions not in ``free`` one has (how many must free up before such a set is all
    free); None: no set meets. An exact search, free positions tried first."""
    order = sorted(range(m), key=lambda i: (i not in free, i))
    best: int | None = None

    def walk(cands: list[int], size: int, missing: int) -> None:
        nonlocal best
        if size == n:
            best = missing
            return
        for k, c in enumerate(cands):
            if len(cands) - k < n - size:
                return
            more = missing + (c not in free)
            if best is not None and more >= best:
                return  # the rest are no better: free ones come first
            walk([d for d in cands[k + 1 :] if meets(c, d)], size + 1, more)
            if best == 0:
                return

    walk(order, 0, 0)
    return best


def _cliques(cands: list[int], n: int, meets: Meets, chosen: tuple[int, ...] = ()) -> Iterator[tuple[int, ...]]:
    """The sets of ``n`` (with ``chosen``) of ``cands`` whose every pair meets, in the
    order of ``cands``; each of ``cands`` meets all of ``chosen``."""
    if len(chosen) == n:
        yield chosen
        return
    for k, c in enumerate(cands):
        if len(cands) - k < n - len(chosen):
            return
        yield from _cliques([d for d in cands[k + 1 :] if meets(c, d)], n, meets, (*chosen, c))
