"""JupyterHub with gpuspawner on a Docker Swarm with GPU nodes: the hub run by hand.

The recommended deployment is the stack in examples/stack/ (the hub, its proxy and
PostgreSQL as swarm services; docs/deploy.md), with the GPUs reported by each node's
agent. This file is the alternative for a hub run directly on a swarm manager, with a
static inventory file: adapt the image, the network and the inventory.
"""

import os

from gpuspawner.hubconfig import configure

c = get_config()  # noqa: F821 (provided by JupyterHub)

c.JupyterHub.spawner_class = "gpuswarm"
c.GPUSwarmSpawner.gpu_inventory = os.environ.get("GPUSPAWNER_INVENTORY", "/etc/jupyterhub/gpus.yaml")

# Who may hold what.
c.GPUSwarmSpawner.max_gpus_per_user = 2
c.GPUSwarmSpawner.allocation_policy = "frag"  # the default; or "pack", "spread"
c.GPUSwarmSpawner.allow_host_choice = False

# The single-user image: a CUDA-enabled Jupyter image with the hub's jupyterhub version.
c.GPUSwarmSpawner.image = "quay.io/jupyter/pytorch-notebook:cuda12-latest"
# An attachable overlay network that the hub's own service is on (docker network create
# --driver overlay --attachable jupyterhub).
c.GPUSwarmSpawner.network_name = "jupyterhub"
c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_connect_ip = "jupyterhub"

# Your own placement rules are kept; gpuspawner adds node.hostname == <the chosen host>.
c.GPUSwarmSpawner.extra_placement_spec = {"constraints": ["node.labels.jupyter == true"]}
c.GPUSwarmSpawner.mem_limit = "32G"

# Servers outlive a hub restart; the hub rebuilds who holds which GPU from the swarm.
c.JupyterHub.cleanup_servers = False
c.Spawner.start_timeout = 120
c.GPUSwarmSpawner.task_start_timeout = 100

# gpuspawner's endpoints, admin page and metrics; fail at hub start, with the file and
# the problem, if the inventory or a setting is wrong.
configure(c)
