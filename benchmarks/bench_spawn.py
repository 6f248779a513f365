"""Spawn time on the real local swarm: GPUSwarmSpawner against plain SwarmSpawner.

    python -m benchmarks.bench_spawn [--pairs 10] [--json]

Two real hubs run side by side on the local three-node swarm (devtools.swarm),
with the same image, command and node (gpu-a): one with GPUSwarmSpawner asking for
one GPU, one with dockerspawner's plain SwarmSpawner pinned to gpu-a. Spawns
alternate between them; each is timed from the REST request to the hub reporting
the server ready, then stopped. Reports the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from devtools import swarm as swarm_harness
from devtools.hub import Hub

# The plain SwarmSpawner needs two things to work on the host network at all:
# no published port (use_internal_ip) and the node's address as the server's.
BASELINE_CONFIG = """
from dockerspawner import SwarmSpawner

class HostNetworkSwarmSpawner(SwarmSpawner):
    async def get_ip_and_port(self):
        return {addr!r}, self.port

c.JupyterHub.spawner_class = HostNetworkSwarmSpawner
for key in ("image", "cmd", "network_name", "client_kwargs"):
    setattr(c.SwarmSpawner, key, getattr(c.GPUSwarmSpawner, key))
c.SwarmSpawner.use_internal_ip = True
# A fresh port per server (as GPUSwarmSpawner hands out ports in turn): a port
# reused at once can still be held by the server that just stopped.
c.SwarmSpawner.pre_spawn_hook = lambda spawner: setattr(spawner, "port", 29000 + int(spawner.user.name[5:]))
c.SwarmSpawner.extra_placement_spec = {{"constraints": ["node.hostname == gpu-a"]}}
"""


def time_spawn(hub: Hub, user: str, options: dict) -> float:
    start = time.perf_counter()
    r = hub.spawn(user, options)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"spawn failed: {r.status_code} {r.text}")
    hub.wait_ready(user)
    elapsed = time.perf_counter() - start
    hub.stop_server(user)
    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    cluster = swarm_harness.up()
    env = {"GPUSPAWNER_DOCKER_URL": cluster.manager_url}
    addr = cluster.nodes["gpu-a"].addr
    with tempfile.TemporaryDirectory() as tmp:
        gpu_hub = Hub(Path(tmp) / "gpu", port=18600, env=env).start()
        base_hub = Hub(Path(tmp) / "base", port=18700, env=env, extra_config=BASELINE_CONFIG.format(addr=addr)).start()
        try:
            gpu_times, base_times = [], []
            for i in range(args.pairs):
                # Alternate which goes first, so neither always follows the other.
                order = [("gpu", gpu_hub), ("base", base_hub)]
                if i % 2:
                    order.reverse()
                for kind, hub in order:
                    if kind == "gpu":
                        gpu_times.append(time_spawn(hub, f"bench{i}", {"gpu_model": "NVIDIA GeForce GTX 1070"}))
                    else:
                        base_times.append(time_spawn(hub, f"bench{i}", {}))
                print(
                    f"pair {i + 1}: GPUSwarmSpawner {gpu_times[-1]:.3f} s, SwarmSpawner {base_times[-1]:.3f} s",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            gpu_hub.stop()
            base_hub.stop()
    result = {
        "pairs": args.pairs,
        "gpuswarmspawner_median_s": round(statistics.median(gpu_times), 3),
        "swarmspawner_median_s": round(statistics.median(base_times), 3),
        "ratio": round(statistics.median(gpu_times) / statistics.median(base_times), 3),
        "gpuswarmspawner_s": [round(t, 3) for t in gpu_times],
        "swarmspawner_s": [round(t, 3) for t in base_times],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"Spawn request -> ready server, median of {args.pairs} alternated pairs, same image and node:")
        print(f"  GPUSwarmSpawner {result['gpuswarmspawner_median_s']:.3f} s")
        print(f"  SwarmSpawner    {result['swarmspawner_median_s']:.3f} s")
        print(f"  ratio           {result['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
