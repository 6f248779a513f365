"""The local demo: a real JupyterHub with GPUSwarmSpawner on a three-node swarm.

    python -m tests.harness.demo --state-dir DIR          # start; Ctrl-C stops the hub
    python -m tests.harness.demo --state-dir DIR --down   # remove servers and the swarm

The swarm (a manager on this machine, workers gpu-a and gpu-b) comes from
tests.harness.swarm; its GPUs are simulated by examples/local/gpus.yaml.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from . import swarm as swarm_harness
from .hub import LOCAL_CONFIG, Hub, HubError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--state-dir", type=Path, default=Path("demo-state"))
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--down", action="store_true", help="tear everything down")
    args = parser.parse_args(argv)

    if args.down:
        print("Removing the local swarm (servers, daemons, namespaces)...", flush=True)
        swarm_harness.down()
        print("Done.")
        return 0

    print("Starting the local three-node swarm (first run: about a minute)...", flush=True)
    cluster = swarm_harness.up()
    hub = Hub(args.state_dir.resolve(), port=args.port, env={"GPUSPAWNER_DOCKER_URL": cluster.manager_url})
    print("Starting JupyterHub...", flush=True)
    try:
        hub.start()
    except HubError as exc:
        print(f"JupyterHub did not start: {exc}", file=sys.stderr)
        return 1
    print(
        f"""
JupyterHub is running at {hub.url}/
  Log in with any user name and any password ("admin" is an admin).
  The spawn form offers the simulated GPUs of {LOCAL_CONFIG.parent / 'gpus.yaml'}:
  3 × NVIDIA GeForce GTX 1070 on gpu-a, 2 × NVIDIA A100 80GB PCIe on gpu-b.
  Hub log: {hub.log_path}
  See what runs where: DOCKER_HOST={cluster.manager_url} docker service ls

Press Ctrl-C to stop the hub (servers keep running); `make demo-down` removes everything.
""",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while hub.proc.poll() is None:
            time.sleep(1)
        print(f"JupyterHub exited:\n{hub.log_tail(20)}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SystemExit):
        print("\nStopping JupyterHub...", flush=True)
        return 0
    finally:
        hub.stop()


if __name__ == "__main__":
    sys.exit(main())
