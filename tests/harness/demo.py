"""The local demo: a real JupyterHub with GPUSwarmSpawner on a three-node swarm.

    python -m tests.harness.demo --state-dir DIR          # start; Ctrl-C stops the hub
    python -m tests.harness.demo --state-dir DIR --down   # stop the hub, remove servers and the swarm

The swarm (a manager on this machine, workers gpu-a and gpu-b) comes from
tests.harness.swarm; its GPUs are simulated by examples/local/gpus.yaml. Servers are
real JupyterLab servers (tests.harness.jupyter_image), or with ``--server standin`` the
busybox stand-in that starts in a second. A second run reuses the swarm, the image and
the hub's database.
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
import time
from pathlib import Path

import yaml

from . import jupyter_image
from . import swarm as swarm_harness
from .hub import LOCAL_CONFIG, Hub, HubError

INVENTORY = LOCAL_CONFIG.parent / "gpus.yaml"


def _step(n: int, text: str) -> None:
    print(f"\n[{n}/3] {text}", flush=True)


def _gpu_summary() -> str:
    """'3 × NVIDIA GeForce GTX 1070 on gpu-a, ...' from the demo's inventory."""
    parts = []
    for host, devices in yaml.safe_load(INVENTORY.read_text()).items():
        for model, count in collections.Counter(d["model"] for d in devices).items():
            parts.append(f"{count} × {model} on {host}")
    return ", ".join(parts)


def _down(state_dir: Path) -> int:
    if Hub(state_dir).stop_leftover():
        print("Stopped the demo's JupyterHub.", flush=True)
    print("Removing the local swarm (servers, daemons, namespaces)...", flush=True)
    swarm_harness.down()
    print(f"Done. The server image stays cached in {jupyter_image.DEFAULT_CACHE} for the next `make demo`.")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--state-dir", type=Path, default=Path("demo-state"))
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--server", choices=["jupyter", "standin"], default="jupyter",
                        help="real JupyterLab servers (default), or the busybox stand-in")
    parser.add_argument("--down", action="store_true", help="tear everything down")
    args = parser.parse_args(argv)
    state_dir = args.state_dir.resolve()

    try:
        if args.down:
            return _down(state_dir)
        running = Hub(state_dir).leftover_pid()
        if running:
            print(f"The demo's JupyterHub already runs (pid {running}); `make demo-down` stops it.", file=sys.stderr)
            return 1
        Hub(state_dir).stop_leftover()  # a proxy left behind by a killed run

        _step(1, "Local swarm: a manager and workers gpu-a, gpu-b (first run: about a minute)")
        cluster = swarm_harness.up()
        if args.server == "jupyter":
            _step(2, "Server image: JupyterLab with jupyterhub-singleuser (first run: a few minutes; cached)")
            image = jupyter_image.ensure_on(cluster)
            servers = f"JupyterLab ({image})"
        else:
            _step(2, "Server image: the busybox stand-in")
            image, servers = swarm_harness.TEST_IMAGE, "stand-ins (busybox httpd showing NVIDIA_VISIBLE_DEVICES)"
    except swarm_harness.HarnessError as exc:
        print(f"\nThe demo could not start: {exc}", file=sys.stderr)
        return 1

    _step(3, f"JupyterHub on http://127.0.0.1:{args.port}")
    hub = Hub(state_dir, port=args.port, env={"GPUSPAWNER_DOCKER_URL": cluster.manager_url, "GPUSPAWNER_IMAGE": image})
    try:
        hub.start()
    except HubError as exc:
        print(f"JupyterHub did not start: {exc}", file=sys.stderr)
        return 1
    print(
        f"""
================================================================================
 Open {hub.url}/ and log in with any user name and any password
 ("admin" is an admin).

 The spawn form offers the simulated GPUs of {INVENTORY.relative_to(LOCAL_CONFIG.parents[2])}:
   {_gpu_summary()}
 Servers: {servers}.
 In a server's terminal, `echo $NVIDIA_VISIBLE_DEVICES` shows the GPUs it was given.

 Hub log:         {hub.log_path}
 What runs where: DOCKER_HOST={cluster.manager_url} docker service ls

 Ctrl-C stops the hub (servers keep running); `make demo-down` removes everything.
================================================================================
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
