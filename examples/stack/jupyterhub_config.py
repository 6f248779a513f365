"""JupyterHub with gpuspawner as a swarm service (examples/stack/stack.yml).

Everything site-specific comes from the service's environment (GPUSPAWNER_*) and every
secret from a swarm secret under /run/secrets, so this file is the same on every site
and in CI (tests/integration/test_stack_swarm.py deploys it). See docs/deploy.md.
"""

import os
from pathlib import Path

from sqlalchemy.engine import make_url

from gpuspawner.hub.database_wait import waiting_connections
from gpuspawner.hubconfig import configure

c = get_config()  # noqa: F821 (provided by JupyterHub)
env = os.environ.get
SECRETS = Path(env("GPUSPAWNER_SECRETS_DIR", "/run/secrets"))


def secret(name: str, required: bool = True) -> str | None:
    """A swarm secret's value (its file under /run/secrets), without the final newline."""
    path = SECRETS / name
    if not path.exists():
        if required:
            raise SystemExit(f"gpuspawner stack: the swarm secret {name} is missing ({path}); see docs/deploy.md")
        return None
    return path.read_text().strip()


# The hub and its proxy, services of their own on the overlay network: the proxy at 8000
# (published by the stack) and its API at 8001, the hub's API at 8081, which the proxy
# and the agents reach by the service's name. Users' servers reach the hub's API through
# the proxy, whose address a hub restart leaves alone (see stack.yml, service proxy).
c.JupyterHub.hub_bind_url = "http://0.0.0.0:8081"
c.JupyterHub.hub_connect_ip = env("GPUSPAWNER_HUB_HOST", "hub")
c.ConfigurableHTTPProxy.should_start = False
c.ConfigurableHTTPProxy.api_url = env("GPUSPAWNER_PROXY_API_URL", "http://proxy:8001")
c.Spawner.hub_connect_url = env("GPUSPAWNER_SERVERS_HUB_URL", "http://proxy:8000")
c.ConfigurableHTTPProxy.auth_token = secret("proxy_auth_token")
# A proxy task started again (a crash, a node's reboot) has no routes: the hub puts them
# back at its next check of the proxy's routes, which comes every last_activity_interval
# (JupyterHub's default, 300 s, left users' pages looping for minutes). Each check also
# reads the routes' activity; 10 s is a cheap request to the proxy.
c.JupyterHub.last_activity_interval = 10
c.JupyterHub.cookie_secret = bytes.fromhex(secret("cookie_secret"))

# The hub's database and gpuspawner's ledger: PostgreSQL (the stack's postgres service),
# the password from its secret. The ledger shares the database (its own tables and
# version table) unless GPUSPAWNER_LEDGER_URL names another.
db = make_url(env("GPUSPAWNER_DB_URL", "postgresql+psycopg://jupyterhub@postgres:5432/jupyterhub"))
db = db.set(password=secret("postgres_password"))
c.JupyterHub.db_url = db.render_as_string(hide_password=False)
# JupyterHub's connections wait out a restart of the database (up to 30 s) instead of
# failing users' requests (docs/deploy.md, "How a database restart behaves").
c.JupyterHub.db_kwargs = waiting_connections(c.JupyterHub.db_url)
ledger = env("GPUSPAWNER_LEDGER_URL")
c.GPUSwarmSpawner.gpu_db_url = (
    make_url(ledger).set(password=db.password).render_as_string(hide_password=False) if ledger else c.JupyterHub.db_url
)

# Servers outlive a hub restart: the restarted hub finds them (and who holds which GPU)
# in the swarm and the ledger.
c.JupyterHub.cleanup_servers = False

# Who logs in. Replace the dummy authenticator with your site's (oauthenticator, LDAP,
# ...): GPUSPAWNER_AUTHENTICATOR takes JupyterHub's name for it. The dummy one takes any
# user name with the password in the login_password secret.
c.JupyterHub.authenticator_class = env("GPUSPAWNER_AUTHENTICATOR", "dummy")
c.Authenticator.allow_all = True
c.Authenticator.admin_users = set(filter(None, env("GPUSPAWNER_ADMIN_USERS", "admin").split(",")))
if c.JupyterHub.authenticator_class == "dummy":
    c.DummyAuthenticator.password = secret("login_password")

# A token for admins' scripts, the `gpuspawner` command and Prometheus (docs/deploy.md).
c.JupyterHub.services = [{"name": "gpuspawner-admin", "api_token": secret("admin_token")}]
c.JupyterHub.load_roles = [
    {
        "name": "gpuspawner-admin",
        "scopes": ["admin:users", "admin:servers", "read:users", "read:metrics", "access:servers"],
        "services": ["gpuspawner-admin"],
    }
]

# The servers: on the stack's attachable overlay network, reached by their service's
# name. dnsrr: the name resolves to the task itself, without the swarm's virtual-IP
# load balancer (one replica needs none, and it works where the nodes' dockerd has no
# iptables rules).
c.JupyterHub.spawner_class = "gpuswarm"
c.GPUSwarmSpawner.image = env("GPUSPAWNER_SERVER_IMAGE", "quay.io/jupyter/pytorch-notebook:cuda12-latest")
c.GPUSwarmSpawner.network_name = env("GPUSPAWNER_NETWORK", "gpuspawner")
c.GPUSwarmSpawner.use_internal_ip = True
c.GPUSwarmSpawner.extra_endpoint_spec = {"mode": env("GPUSPAWNER_ENDPOINT_MODE", "dnsrr")}
constraints = env("GPUSPAWNER_SERVER_CONSTRAINTS", "node.role == worker")
c.GPUSwarmSpawner.extra_placement_spec = {"constraints": [x.strip() for x in constraints.split(",") if x.strip()]}
c.GPUSwarmSpawner.cmd = env("GPUSPAWNER_SERVER_CMD", "jupyterhub-singleuser").split()
c.Spawner.default_url = "/lab"
c.GPUSwarmSpawner.max_gpus_per_user = int(env("GPUSPAWNER_MAX_GPUS_PER_USER", "2"))

# Where the GPUs come from: the node agents (the stack's agent service), or a static
# inventory (a swarm config or file at GPUSPAWNER_INVENTORY), or both.
c.GPUSwarmSpawner.gpu_inventory_source = env("GPUSPAWNER_INVENTORY_SOURCE", "agent").split(",")
if "static" in c.GPUSwarmSpawner.gpu_inventory_source:
    c.GPUSwarmSpawner.gpu_inventory = env("GPUSPAWNER_INVENTORY", "/etc/jupyterhub/gpus.yaml")

# A server's image may be large and its first start slow: swarm pulls it on the node.
c.GPUSwarmSpawner.task_start_timeout = int(env("GPUSPAWNER_TASK_START_TIMEOUT", "100"))
c.Spawner.start_timeout = int(env("GPUSPAWNER_START_TIMEOUT", "120"))
c.Spawner.http_timeout = int(env("GPUSPAWNER_HTTP_TIMEOUT", "60"))
# How often the hub compares who holds which GPU with the services the swarm runs.
c.GPUSwarmSpawner.reconcile_interval = int(env("GPUSPAWNER_RECONCILE_INTERVAL", "60"))

# gpuspawner's endpoints, admin page and metrics; stops the hub at start, with one
# line, if a setting is wrong.
configure(c)
