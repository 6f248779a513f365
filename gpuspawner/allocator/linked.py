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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import combinations
from math import comb, factorial

__all__ = ["best_set", "PARTITIONS_MAX", "SETS_MAX"]

PARTITIONS_MAX = 2_000  # splits into groups counted at most (8 GPUs into pairs: 105)
SETS_MAX = 5_000  # groups scored at most when the splits are too many

Score = Callable[[int, int], int]  # (position, position) -> the pair's score


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
