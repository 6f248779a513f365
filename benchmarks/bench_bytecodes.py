"""Bytecodes the allocator executes per decision, in the churn of
:mod:`benchmarks.bench_shares`: a count that does not change with the load
of the machine, so two allocators compare exactly (time per bytecode still
differs: C calls and memory are not counted).

    python -m benchmarks.bench_bytecodes                      # this tree
    python -m benchmarks.bench_bytecodes --against 6b56009    # and another commit's allocator
    python -m benchmarks.bench_bytecodes --ops 1000           # a quicker run

Every bytecode between the two clock readings around a decision is counted
(``sys.settrace`` with opcode events), which is the allocate call and the
few steps of the benchmark around it, the same for both allocators.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import bench_shares
from benchmarks.bench_shares_ab import CASES
from benchmarks.impl import THIS, Impl, load


def per_decision(nodes: int, mix: str, policy: str, whole: bool, ops: int, impl: Impl = THIS) -> float:
    """Mean bytecodes per timed decision of one churn run."""
    executed = 0

    def each_frame(frame, event, arg):
        frame.f_trace_opcodes = True
        return each_opcode

    def each_opcode(frame, event, arg):
        nonlocal executed
        if event == "opcode":
            executed += 1
        return each_opcode

    counts: list[int] = []
    clock = bench_shares.clock
    bench_shares.clock = lambda: executed  # the churn's "time" of a decision: the bytecodes it ran
    sys.settrace(each_frame)
    try:
        bench_shares.churn(nodes, mix, policy, ops, 1, whole=whole, impl=impl, times_out=counts)
    finally:
        sys.settrace(None)
        bench_shares.clock = clock
    return sum(counts) / len(counts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", metavar="COMMIT", help="also count another commit's allocator")
    p.add_argument("--ops", type=int, default=3000, help="decisions per churn run")
    args = p.parse_args(argv)
    impls = [THIS] + ([load(args.against)] if args.against else [])
    head = " | ".join(i.name for i in impls)
    print(f"| case | bytecodes per decision: {head} |" + (" ratio |" if args.against else ""))
    print("|---|---|" + ("---|---|" if args.against else ""))
    for name, nodes, mix, policy, whole in CASES:
        counts = [per_decision(nodes, mix, policy, whole, args.ops, impl) for impl in impls]
        ratio = f" {counts[0] / counts[1]:.3f} |" if args.against else ""
        print(f"| {name} | {' | '.join(f'{c:,.0f}' for c in counts)} |{ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
