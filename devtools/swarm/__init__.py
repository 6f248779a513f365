"""A real multi-node Docker Swarm on one Linux machine, for the integration tests and the demo.

Layout (one cluster per machine; needs root, ``dockerd`` from Debian's docker.io,
``ip``, ``nsenter``, ``unshare``, ``mount`` and a static busybox)::

    host network namespace
      bridge gpusw0 = 10.213.77.1/25          <- manager address, swarm listens on :2377
      dockerd "manager" (hostname = the machine's)   unix://<run_dir>/manager.sock
      veth gpuswv2 ---- netns gpusw-gpu-a: eth0 = 10.213.77.2, dockerd, hostname gpu-a
      veth gpuswv3 ---- netns gpusw-gpu-b: eth0 = 10.213.77.3, dockerd, hostname gpu-b
      (worker N, from 0, gets 10.213.77.(N+2); host side veth gpuswv<last octet>)

Each worker dockerd runs in its own network namespace (joined with ``nsenter --net``,
*not* ``ip netns exec``, which remounts /sys and breaks dockerd's cgroup detection) and its
own UTS namespace (``unshare --uts``) so that swarm sees it under its own hostname. The
worker namespaces have no default route: nothing there can reach anything but the bridge
subnet. Services that must be reached from the host (or reach the hub at 10.213.77.1) use
the ``host`` network and publish no ports; overlay and bridge networks have no NAT here.

The manager's dockerd shares the host's network namespace, so it is configured not to
touch the host's routes, iptables or sysctls:

* ``--iptables=false --ip-masq=false --ip-forward=false``: no rules, no ip_forward change;
* ``--bridge=none``: no docker0 (and no 172.17.0.0/16 route) on the host. A container on
  the manager that asks for the default ``bridge`` network runs with loopback only;
* ``docker_gwbridge`` (which swarm otherwise creates with a 172.x subnet and a host route)
  is created by the harness before ``swarm init`` as kernel bridge ``gpuswgw0`` with
  ``inhibit_ipv4``: its IPAM subnet is 10.213.77.128/25, but the host gets no address and no
  route for it. That is why gpusw0 is a /25: the whole cluster stays inside 10.213.77.0/24.

Nothing talks to addresses outside the cluster or loopback (checked with strace on the
daemons). By default dockerd resolves registry names (``docker service create`` from the CLI
asks the daemon for the image digest; swarm tasks try a pull before using the local image),
and the manager could reach the host's resolver. So every dockerd gets:

* ``DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1``: swarm tasks use the local image, no pull;
* ``HTTP(S)_PROXY=http://127.0.0.1:9``: any registry request fails at once on loopback;
* its own mount namespace (``unshare --mount --propagation slave``) in which
  ``/etc/resolv.conf`` is ``nameserver 127.0.0.1``; ``--dns=127.0.0.1`` does the same
  for containers. The daemon's own mounts (netns files, container shm) stay in that
  namespace and vanish with it.

Files:

* ``state_dir`` (default ``/var/lib/gpuspawner-swarm``, env ``GPUSPAWNER_SWARM_STATE_DIR``):
  ``cluster.json`` (what is running, and a fingerprint of the daemon configuration: a
  changed harness recreates the cluster), ``daemon.json`` (an empty dockerd config, so
  that /etc/docker/daemon.json is never read), ``resolv.conf``, ``nodes/<name>/`` data
  roots and ``logs/<name>.log`` (the dockerd logs; kept after ``down``
  for post-mortems, overwritten on the next start; when a bring-up attempt failed and
  was retried, that attempt's logs are ``logs/<name>.attempt<N>.log``).
* ``run_dir`` (default ``/run/gpuspawner-swarm``, env ``GPUSPAWNER_SWARM_RUN_DIR``; when a
  non-default ``state_dir`` is given, ``<state_dir>/run``): ``<name>.sock`` (the API
  sockets), ``<name>.pid`` and ``<name>/`` exec roots (containerd's socket lives there).
* ``/run/lock/gpuspawner-swarm.lock``: serializes ``up``/``down`` between processes.
* ``/run/lock/gpuspawner-swarm.users.lock``: test sessions sharing the cluster (see
  ``use_shared``, ``exclusive_use`` and ``down_if_unused``): one session neither tears
  the cluster down nor rebuilds it while another one uses it.

``<name>`` is ``manager`` for the manager and the hostname for a worker.

Usage::

    python -m devtools.swarm up [--workers gpu-a,gpu-b]
    python -m devtools.swarm status
    python -m devtools.swarm down

    from devtools import swarm
    cluster = swarm.up()            # reuses a healthy running cluster in well under 1 s
    cluster.manager_url             # "unix:///run/gpuspawner-swarm/manager.sock"
    cluster.nodes["gpu-b"]          # Node(hostname="gpu-b", addr="10.213.77.3", docker_url=..., role="worker")
    cluster.client("gpu-b")         # docker.DockerClient for that node's own daemon
    swarm.down()

The test image ``gpuspawner-test/busybox:latest`` (static busybox and its applets) is on
every node after ``up()``; ``import_image(cluster, name, rootfs_dir)`` adds others.

It talks to the daemons with docker-py over their unix sockets (engine.py: the API
version pinned to v1.41, docker.io 20.10's; every request bounded), never through the
``docker`` CLI, so it does not depend on the CLI's version.

Modules: ``netns`` (bridge, veths, namespaces), ``daemons`` (dockerd processes),
``membership`` (swarm init/join/readiness), ``images`` (root file systems, ``docker
import`` on every node), ``state`` (state file, locks), ``cluster`` (Node, Cluster),
``lifecycle`` (up, down, status, sharing), ``__main__`` (the CLI).
"""

from .cluster import Cluster, Node
from .errors import HarnessError
from .images import ROOTFS_LABEL, TEST_IMAGE, build_busybox_rootfs, ensure_test_image, import_image, import_tar
from .layout import DEFAULT_RUN_DIR, DEFAULT_STATE_DIR
from .lifecycle import DEFAULT_WORKERS, down, down_if_unused, exclusive_use, load, status, up, use_shared
from .netns import MANAGER_ADDR
from .preconditions import unavailable_reason
from .procs import tool_env
from .progress import progress

__all__ = [
    "DEFAULT_RUN_DIR",
    "DEFAULT_STATE_DIR",
    "DEFAULT_WORKERS",
    "MANAGER_ADDR",
    "ROOTFS_LABEL",
    "TEST_IMAGE",
    "Cluster",
    "HarnessError",
    "Node",
    "build_busybox_rootfs",
    "down",
    "down_if_unused",
    "ensure_test_image",
    "exclusive_use",
    "import_image",
    "import_tar",
    "load",
    "progress",
    "status",
    "tool_env",
    "unavailable_reason",
    "up",
    "use_shared",
]
