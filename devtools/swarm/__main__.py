"""``python -m devtools.swarm up|down|status``: the local test swarm from the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __doc__ as package_doc
from .cluster import Cluster
from .errors import HarnessError
from .layout import DEFAULT_RUN_DIR, DEFAULT_STATE_DIR
from .lifecycle import DEFAULT_WORKERS, down, status, up
from .netns import SWARM_PORT


def _summary(cluster: Cluster) -> str:
    lines = ["nodes:"]
    for n in cluster.nodes.values():
        where = "host netns" if n.netns is None else f"netns {n.netns}"
        lines.append(f"  {n.hostname:<12} {n.role:<8} {n.addr:<13} {n.docker_url}  ({where})")
    lines += [
        f"manager: {cluster.manager_url}  (swarm at {cluster.manager_addr}:{SWARM_PORT})",
        f"image:   {cluster.image} on every node",
        f"try:     DOCKER_HOST={cluster.manager_url} docker node ls",
    ]
    return "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    cluster, problems = status(args.state_dir, args.run_dir)
    if cluster is None:
        print("status: down")
        return 1
    print(_summary(cluster))
    print("status: " + ("healthy" if not problems else "NOT healthy: " + "; ".join(problems)))
    return 0 if not problems else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.swarm", description=(package_doc or "").split("\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--workers", default=",".join(DEFAULT_WORKERS), help="worker hostnames, comma-separated")
    parser.add_argument("--state-dir", default=None, help=f"default {DEFAULT_STATE_DIR}")
    parser.add_argument("--run-dir", default=None, help=f"default {DEFAULT_RUN_DIR} (or STATE_DIR/run)")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            print(_summary(up(tuple(w for w in args.workers.split(",") if w), args.state_dir, args.run_dir)))
        elif args.command == "down":
            down(args.state_dir, args.run_dir)
            print("cluster down")
        else:
            return _status(args)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
