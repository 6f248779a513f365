"""What a share decision costs at the least, in Python, on one node of 8 GPUs:

    python -m benchmarks.bench_floor                 # 3 rounds, CPU time
    python -m benchmarks.bench_floor --rounds 5 --ops 20000 --json

:class:`Floor` makes the allocator's decisions on one host, with the sharing
of :mod:`benchmarks.bench_shares` (even splits; a share of at most 1 GPU on
one device), from nothing but a list of the devices' rooms: no index for
other hosts, no summary, no per-owner count, no lock, no refusal that says
what would fit, a plain record of each holding (the tests check, decision by
decision, that it decides as the allocator does). It is a lower bound on the
cost of those decisions, not an allocator.

Each round runs the one-node churn of :mod:`benchmarks.bench_shares` (shares
of each mix, and whole GPUs, 1 or 2) on the floor and on the allocator,
alternating, timed by the thread's CPU time. The ratios say how much of the
gap between a share decision and a whole-GPU one is in the decision itself:
``floor share / floor whole`` is the most a share decision's rate can be of a
whole-GPU one when both carry nothing else.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable

from benchmarks import bench_shares
from benchmarks.bench_shares import MODEL, SHARING, THIS, Impl, churn
from gpuspawner.allocator.allocator import Request
from gpuspawner.core.inventory import GPU
from gpuspawner.core.sharing import UNIT, split_evenly

__all__ = ["FLOOR", "Floor", "FloorRefused"]


class FloorRefused(Exception):
    pass


class Held:
    __slots__ = ("devices", "milli", "total_milli")

    def __init__(self, devices: tuple, milli: tuple, total: int):
        self.devices, self.milli, self.total_milli = devices, milli, total


class Floor:
    """The allocator's decisions for one host, over its devices' rooms
    (thousandths): a share of at most 1 GPU on the device with the least room
    that takes it (lowest index among equals), a larger one split as evenly as
    the quantum allows over the fewest devices, each piece (larger first) on
    the device with the least room that takes it; whole GPUs: the untouched
    devices of lowest index."""

    def __init__(self, gpus: Iterable[GPU], policy: str = "pack", sharing: dict | None = None):
        # ``policy`` is the allocator's signature only: on one host pack and spread decide alike.
        self.gpus = sorted(gpus)
        if len({g.host for g in self.gpus}) != 1:
            raise ValueError("the floor takes the devices of one host")
        self.quantum = round((sharing or SHARING)[MODEL]["quantum"] * UNIT)
        self.rooms = [UNIT] * len(self.gpus)
        self.holders: dict[str, tuple[tuple[int, int], ...]] = {}

    def allocate(self, holder: str, request: Request) -> Held:
        if request.milli is None:
            return self._whole(holder, request.count)
        share = request.milli
        rooms = self.rooms
        if share <= UNIT:
            best, least = -1, UNIT + 1
            for i, room in enumerate(rooms):
                if share <= room < least:
                    best, least = i, room
            if best < 0:
                raise FloorRefused(share)
            return self._book(holder, ((best, share),))
        order = sorted(range(len(rooms)), key=rooms.__getitem__)  # least room first, then index
        for n in range(-(-share // UNIT), len(rooms) + 1):
            pieces = split_evenly(share, n, self.quantum)
            if pieces is None:
                break  # pieces below the quantum: more devices cannot help
            picks = []
            left = list(order)
            for piece in pieces:
                for j, i in enumerate(left):
                    if rooms[i] >= piece:
                        picks.append((i, piece))
                        del left[j]
                        break
                else:
                    break
            else:
                return self._book(holder, tuple(sorted(picks)))
        raise FloorRefused(share)

    def _whole(self, holder: str, count: int) -> Held:
        free = [i for i, room in enumerate(self.rooms) if room == UNIT][:count]
        if len(free) < count:
            raise FloorRefused(count)
        for i in free:
            self.rooms[i] = 0
        self.holders[holder] = tuple((i, UNIT) for i in free)
        return Held(tuple(self.gpus[i] for i in free), (UNIT,) * count, count * UNIT)

    def _book(self, holder: str, picks: tuple[tuple[int, int], ...]) -> Held:
        for i, piece in picks:
            self.rooms[i] -= piece
        self.holders[holder] = picks
        milli = tuple(p for _, p in picks)
        return Held(tuple(self.gpus[i] for i, _ in picks), milli, sum(milli))

    def release(self, holder: str) -> Held:
        picks = self.holders.pop(holder)
        for i, piece in picks:
            self.rooms[i] += piece
        return Held((), (), sum(p for _, p in picks))


FLOOR = Impl("floor", Floor, Request, FloorRefused, GPU)

CASES = [("uniform", False), ("70/30", False), ("uniform", True)]  # (mix, whole GPUs)


def compare(rounds: int, ops: int, seed: int) -> dict[str, dict[str, list[float]]]:
    """Decisions/s of each case, per round, on the floor and the allocator (alternating)."""
    out: dict[str, dict[str, list[float]]] = {"floor": {}, "allocator": {}}
    for r in range(rounds):
        for name, impl in sorted([("floor", FLOOR), ("allocator", THIS)], reverse=bool(r % 2)):
            for mix, whole in CASES:
                c = churn(1, mix, "pack", ops, seed, whole=whole, impl=impl)
                out[name].setdefault("whole GPUs" if whole else mix, []).append(c.decisions.per_s)
    return out


def table(out: dict[str, dict[str, list[float]]]) -> str:
    med = {(n, case): statistics.median(v) for n, cases in out.items() for case, v in cases.items()}
    rng = lambda v: f"{min(v):,.0f}–{max(v):,.0f}"  # noqa: E731
    lines = [
        "| one node × 8 | floor decisions/s | allocator decisions/s | allocator / floor "
        "| floor: share / whole | allocator: share / whole |",
        "|---|---|---|---|---|---|",
    ]
    fw, aw = med["floor", "whole GPUs"], med["allocator", "whole GPUs"]
    for case in out["floor"]:
        f, a = med["floor", case], med["allocator", case]
        lines.append(
            f"| {case} | {rng(out['floor'][case])} | {rng(out['allocator'][case])} | {a / f:.2f} "
            f"| {f / fw:.2f} | {a / aw:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ops", type=int, default=50_000, help="decisions per churn run")
    p.add_argument("--seed", type=int, default=1)
    bench_shares.add_clock(p)
    p.set_defaults(clock="cpu")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    bench_shares.set_clock(args.clock)
    out = compare(args.rounds, args.ops, args.seed)
    print(json.dumps(out, indent=2) if args.json else table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
