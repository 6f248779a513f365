"""JupyterHub on the local three-node test swarm, with simulated GPUs.

Used by `make demo` and by the integration tests. The cluster comes from
devtools/swarm/: a manager on this machine and workers gpu-a and gpu-b,
on the bridge 10.213.77.0/25. Settings that differ between the demo and the
tests come from environment variables (GPUSPAWNER_*).
"""

import os

c = get_config()  # noqa: F821 (provided by JupyterHub)
here = os.path.dirname(os.path.abspath(__file__))
state = os.environ.get("GPUSPAWNER_STATE_DIR", os.getcwd())

c.JupyterHub.spawner_class = "gpuswarm"
c.GPUSwarmSpawner.gpu_inventory = os.environ.get("GPUSPAWNER_INVENTORY", os.path.join(here, "gpus.yaml"))
# "static" (gpus.yaml), or "agent": gpuspawner-agent on each node reports its GPUs.
c.GPUSwarmSpawner.gpu_inventory_source = os.environ.get("GPUSPAWNER_INVENTORY_SOURCE", "static").split(",")

# Try it with any user name and no password.
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {"admin"}

c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = int(os.environ.get("GPUSPAWNER_HUB_PORT", "8000"))
# Servers on the worker nodes reach the hub's API on the bridge address.
c.JupyterHub.hub_ip = os.environ.get("GPUSPAWNER_HUB_IP", "10.213.77.1")
c.JupyterHub.hub_port = int(os.environ.get("GPUSPAWNER_HUB_API_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{c.JupyterHub.port + 1}"
c.JupyterHub.db_url = "sqlite:///" + os.path.join(state, "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(state, "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = os.path.join(state, "jupyterhub-proxy.pid")
# gpuspawner's own lines (holdings, ledger, reclaim) go to the hub's log with the hub's format.
c.JupyterHub.logging_config = {"loggers": {"gpuspawner": {"level": "INFO", "handlers": ["console"]}}}
# Servers outlive a hub restart; the spawner rebuilds their GPU holdings.
c.JupyterHub.cleanup_servers = False
c.JupyterHub.cleanup_proxy = False

c.GPUSwarmSpawner.client_kwargs = {
    "base_url": os.environ.get("GPUSPAWNER_DOCKER_URL", "unix:///run/gpuspawner-swarm/manager.sock")
}
# Servers run in their node's network namespace, each at its own port.
c.GPUSwarmSpawner.network_name = "host"
# The server image (GPUSPAWNER_IMAGE): by default the busybox stand-in below, which starts
# in about a second (for the many plumbing tests); see "A real Jupyter server" further down.
STANDIN_IMAGE = "gpuspawner-test/busybox:latest"
c.GPUSwarmSpawner.image = os.environ.get("GPUSPAWNER_IMAGE", STANDIN_IMAGE)
# The stand-in server: busybox httpd at the port and prefix JupyterHub assigned,
# with a page that shows which GPUs the server was given. The shell stays PID 1
# and exits on SIGTERM, so a stopped server frees its port at once.
c.GPUSwarmSpawner.cmd = [
    "/bin/sh",
    "-c",
    'port="${JUPYTERHUB_SERVICE_URL##*:}"; port="${port%%/*}"; dir="/srv${JUPYTERHUB_SERVICE_PREFIX}"; '
    'mkdir -p "$dir" && echo "<h1>Stand-in server</h1><p>NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES</p>" '
    '> "$dir/index.html" || exit 1; trap "exit 0" TERM INT; httpd -f -p "$port" -h /srv & wait $!',
]
c.GPUSwarmSpawner.max_gpus_per_user = 2
c.GPUSwarmSpawner.extra_placement_spec = {"constraints": ["node.role == worker"]}
c.GPUSwarmSpawner.task_start_timeout = 30
c.Spawner.start_timeout = 45
c.Spawner.http_timeout = 20

# A real Jupyter server: any other image runs jupyterhub-singleuser (as Jupyter's own
# images do), e.g. the image of devtools/jupyter_image.py that `make demo` and the
# browser tests use; users land in JupyterLab. Python starts slowly on a small machine,
# and where dockerd falls back to the vfs storage driver every start copies the image.
if c.GPUSwarmSpawner.image != STANDIN_IMAGE:
    c.GPUSwarmSpawner.cmd = ["jupyterhub-singleuser"]
    c.Spawner.default_url = "/lab"
    c.GPUSwarmSpawner.task_start_timeout = 90
    c.Spawner.start_timeout = 150
    c.Spawner.http_timeout = 90

# An API token for scripts and tests, when given.
token = os.environ.get("GPUSPAWNER_API_TOKEN")
if token:
    c.JupyterHub.services.append({"name": "gpuspawner-admin", "api_token": token})
    c.JupyterHub.load_roles.append(
        {
            "name": "gpuspawner-admin",
            # access:servers: the tests talk to users' Jupyter servers with this token.
            "scopes": [
                "admin:users",
                "admin:servers",
                "users",
                "servers",
                "read:users",
                "read:metrics",
                "access:servers",
            ],
            "services": ["gpuspawner-admin"],
        }
    )

# Node agents report with a token whose role allows only that.
agent_token = os.environ.get("GPUSPAWNER_AGENT_TOKEN")
if agent_token:
    c.JupyterHub.services.append({"name": "gpuspawner-agent", "api_token": agent_token})
    c.JupyterHub.load_roles.append(
        {"name": "gpuspawner-agent", "scopes": ["custom:gpuspawner:report"], "services": ["gpuspawner-agent"]}
    )

# gpuspawner's endpoints and admin page; stops the hub at start if a setting is wrong.
from gpuspawner.hubconfig import configure  # noqa: E402

configure(c)
