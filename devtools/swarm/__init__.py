"""A real multi-node Docker Swarm on one Linux machine, for integration tests.

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

This module only uses the standard library: it talks to the Docker Engine API (pinned to
v1.41, the version of docker.io 20.10) over the unix sockets itself, so it does not depend on
the ``docker`` CLI's version. ``Cluster.client()`` imports the ``docker`` SDK lazily.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import hashlib
import http.client
import io
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_WORKERS",
    "MANAGER_ADDR",
    "ROOTFS_LABEL",
    "TEST_IMAGE",
    "Cluster",
    "DockerAPI",
    "DockerAPIError",
    "HarnessError",
    "Node",
    "build_busybox_rootfs",
    "down",
    "down_if_unused",
    "ensure_test_image",
    "exclusive_use",
    "import_image",
    "load",
    "status",
    "unavailable_reason",
    "up",
    "use_shared",
]

DEFAULT_WORKERS: tuple[str, ...] = ("gpu-a", "gpu-b")
DEFAULT_STATE_DIR = Path(os.environ.get("GPUSPAWNER_SWARM_STATE_DIR", "/var/lib/gpuspawner-swarm"))
DEFAULT_RUN_DIR = Path(os.environ.get("GPUSPAWNER_SWARM_RUN_DIR", "/run/gpuspawner-swarm"))

TEST_IMAGE = "gpuspawner-test/busybox:latest"
# Label stored on imported images: sha256 of the imported tar, to tell a stale image.
ROOTFS_LABEL = "io.gpuspawner.test.rootfs-sha256"

# Network layout. Everything stays inside 10.213.77.0/24 (see module docstring).
BRIDGE = "gpusw0"
GW_BRIDGE = "gpuswgw0"  # kernel name of the manager's docker_gwbridge
SUBNET_BASE = "10.213.77."
BRIDGE_PREFIXLEN = 25
MANAGER_ADDR = SUBNET_BASE + "1"
GW_BRIDGE_SUBNET = SUBNET_BASE + "128/25"
FIRST_WORKER_OCTET = 2
MAX_WORKERS = 120  # .2 .. .121, well inside the /25
NETNS_PREFIX = "gpusw-"
VETH_PREFIX = "gpuswv"
SWARM_PORT = 2377

API_VERSION = "v1.41"  # docker.io 20.10

# Timeouts (seconds). Every wait in this module is bounded.
DAEMON_START_TIMEOUT = 60.0
DAEMON_STOP_GRACE = 15.0
DAEMON_KILL_WAIT = 30.0  # a SIGKILLed process in uninterruptible I/O takes a while on a busy machine
JOIN_TIMEOUT = 60.0
READY_TIMEOUT = 60.0
API_TIMEOUT = 30.0
# A daemon that is up answers /_ping at once, even on a loaded machine; one that is dead
# refuses the connection (or its socket is gone) at once. Only a daemon that is up but
# starved of CPU needs the time, so a generous timeout costs nothing when it is dead.
HEALTH_PING_TIMEOUT = 10.0
NODE_HOSTNAME_TIMEOUT = 30.0  # hostname_of(): a node that just joined has no description yet
BRINGUP_ATTEMPTS = 2  # a bring-up that fails for an environmental reason is retried once, from scratch
IMPORT_TIMEOUT = 120.0
CMD_TIMEOUT = 30.0

# Don't let hostnames look like anything but a plain DNS label; they also end up in
# namespace and directory names.
_HOSTNAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
_SUN_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1

_T0 = time.monotonic()


class HarnessError(RuntimeError):
    """The test cluster could not be brought up (or torn down) as asked."""


def _progress(msg: str, tag: str = "swarm") -> None:
    print(f"[{tag} +{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Data model
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Node:
    hostname: str
    addr: str
    docker_url: str
    role: str  # "manager" or "worker"
    netns: str | None = None  # None: the host's network namespace (the manager)

    @property
    def socket_path(self) -> str:
        return _url_to_path(self.docker_url)

    def api(self, timeout: float = API_TIMEOUT) -> DockerAPI:
        return DockerAPI(self.socket_path, timeout=timeout)

    def client(self, timeout: int = 60):
        """A ``docker.DockerClient`` for this node's daemon (imports the SDK lazily)."""
        import docker  # noqa: PLC0415 - optional dependency of the harness

        return docker.DockerClient(base_url=self.docker_url, version=API_VERSION[1:], timeout=timeout)


@dataclasses.dataclass
class Cluster:
    state_dir: Path
    run_dir: Path
    manager_url: str
    manager_addr: str
    nodes: dict[str, Node]
    image: str = TEST_IMAGE

    @property
    def manager(self) -> Node:
        return next(n for n in self.nodes.values() if n.role == "manager")

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.role == "worker"]

    def node(self, hostname: str | None = None) -> Node:
        return self.manager if hostname is None else self.nodes[hostname]

    def docker_url(self, hostname: str | None = None) -> str:
        return self.node(hostname).docker_url

    def api(self, hostname: str | None = None, timeout: float = API_TIMEOUT) -> DockerAPI:
        return self.node(hostname).api(timeout=timeout)

    def client(self, hostname: str | None = None, timeout: int = 60):
        """``docker.DockerClient`` for a node's daemon (default: the manager)."""
        return self.node(hostname).client(timeout=timeout)

    def hostname_of(self, node_id: str, timeout: float = NODE_HOSTNAME_TIMEOUT) -> str:
        """Swarm node ID -> hostname.

        A node that has just joined is listed before its agent has reported its
        description: wait (at most ``timeout`` s) for the hostname. An ID the swarm does
        not know (any more) raises ``HarnessError``."""
        return _wait_node_hostname(self.manager.api(), node_id, timeout)

    def env(self) -> dict[str, str]:
        """Environment for the docker CLI / SDK pointing at the manager."""
        return {"DOCKER_HOST": self.manager_url}

    def to_json(self) -> dict[str, Any]:
        return {
            "state_dir": str(self.state_dir),
            "run_dir": str(self.run_dir),
            "manager_url": self.manager_url,
            "manager_addr": self.manager_addr,
            "image": self.image,
            "nodes": {h: dataclasses.asdict(n) for h, n in self.nodes.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cluster:
        return cls(
            state_dir=Path(data["state_dir"]),
            run_dir=Path(data["run_dir"]),
            manager_url=data["manager_url"],
            manager_addr=data["manager_addr"],
            image=data.get("image", TEST_IMAGE),
            nodes={h: Node(**n) for h, n in data["nodes"].items()},
        )


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where one cluster's files live."""

    state_dir: Path
    run_dir: Path

    @property
    def state_file(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def daemon_json(self) -> Path:
        return self.state_dir / "daemon.json"

    @property
    def resolv_conf(self) -> Path:
        return self.state_dir / "resolv.conf"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    def data_root(self, name: str) -> Path:
        return self.state_dir / "nodes" / name

    def exec_root(self, name: str) -> Path:
        return self.run_dir / name

    def pidfile(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def sock(self, name: str) -> Path:
        return self.run_dir / f"{name}.sock"

    def log(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"


def _layout(state_dir: Path | str | None, run_dir: Path | str | None) -> _Layout:
    state = Path(state_dir) if state_dir is not None else DEFAULT_STATE_DIR
    if run_dir is None:
        run_dir = DEFAULT_RUN_DIR if state == DEFAULT_STATE_DIR else state / "run"
    return _Layout(state.absolute(), Path(run_dir).absolute())


def _url_to_path(url: str) -> str:
    if not url.startswith("unix://"):
        raise ValueError(f"not a unix socket URL: {url}")
    return url[len("unix://") :]


# --------------------------------------------------------------------------------------
# Minimal Docker Engine API client over a unix socket (stdlib only)
# --------------------------------------------------------------------------------------


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class DockerAPIError(HarnessError):
    def __init__(self, method: str, path: str, status: int, message: str):
        super().__init__(f"{method} {path} -> HTTP {status}: {message}")
        self.status = status
        self.message = message


class DockerAPI:
    """Just enough of the Docker Engine API for the harness."""

    def __init__(self, socket_path: str, timeout: float = API_TIMEOUT):
        self.socket_path = socket_path
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | Sequence[tuple[str, Any]] | None = None,
        body: Any = None,
        raw: bytes | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        url = f"/{API_VERSION}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        headers = {"Host": "docker"}
        data: bytes | None = None
        if raw is not None:
            data = raw
            headers["Content-Type"] = content_type
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = _UnixHTTPConnection(self.socket_path, timeout if timeout is not None else self.timeout)
        try:
            conn.request(method, url, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
        finally:
            conn.close()
        if resp.status >= 400:
            try:
                message = json.loads(payload).get("message", "")
            except ValueError:
                message = payload.decode(errors="replace")
            raise DockerAPIError(method, path, resp.status, message.strip())
        if not payload:
            return None
        if resp.getheader("Content-Type", "").startswith("application/json"):
            try:
                return json.loads(payload)
            except ValueError:
                pass  # some endpoints stream several JSON objects; return the text
        return payload.decode(errors="replace")

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)

    def ping(self, timeout: float = 2.0) -> bool:
        try:
            return self.request("GET", "/_ping", timeout=timeout) == "OK"
        except (OSError, http.client.HTTPException, DockerAPIError):
            return False


def _node_hostname(node: dict[str, Any]) -> str | None:
    """Hostname of a swarm node object; None while the node hasn't reported it yet."""
    return ((node.get("Description") or {}).get("Hostname")) or None


def _wait_node_hostname(api: DockerAPI, node_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            node = api.get(f"/nodes/{urllib.parse.quote(node_id, safe='')}")
        except DockerAPIError as e:
            if e.status == 404:
                raise HarnessError(f"swarm node {node_id} is not in the swarm (any more): {e.message}") from e
            raise
        host = _node_hostname(node)
        if host:
            return host
        if time.monotonic() >= deadline:
            state = (node.get("Status") or {}).get("State", "unknown")
            raise HarnessError(f"swarm node {node_id} ({state}) did not report its hostname within {timeout:.0f}s")
        time.sleep(0.2)


# --------------------------------------------------------------------------------------
# Small helpers: commands, processes, waiting
# --------------------------------------------------------------------------------------


def _run(cmd: Sequence[str], *, check: bool = True, timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(
            list(cmd), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, env=_env()
        )
    except subprocess.TimeoutExpired as e:
        raise HarnessError(f"command timed out after {timeout:.0f}s: {' '.join(cmd)}") from e
    if check and proc.returncode != 0:
        raise HarnessError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()}")
    return proc


def _env() -> dict[str, str]:
    """Environment for dockerd and tools: make sure the sbin dirs are on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    path = env.get("PATH", "").split(os.pathsep)
    for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if d not in path:
            path.append(d)
    env["PATH"] = os.pathsep.join(p for p in path if p)
    return env


def _which(name: str) -> str | None:
    return shutil.which(name, path=_env()["PATH"])


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) of a process, or None if it doesn't exist."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may contain spaces and parens: split after the last ')'.
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def _alive(pid: int) -> bool:
    st = _proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        # Zombies count as dead; reap the ones that are our own children.
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _descendants(roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        st = _proc_stat(pid)
        if st:
            children.setdefault(st[1], []).append(pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        for child in children.get(pid, ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_dead(pids: Iterable[int], timeout: float) -> set[int]:
    """Wait until all pids are gone; return the ones still alive at the deadline."""
    pending = {p for p in pids if p != os.getpid()}
    deadline = time.monotonic() + timeout
    while True:
        pending = {p for p in pending if _alive(p)}
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.1)


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------------------
# Preconditions
# --------------------------------------------------------------------------------------

_REQUIRED_TOOLS = ("dockerd", "containerd", "runc", "ip", "nsenter", "unshare", "sh", "mount", "umount", "hostname")


def unavailable_reason() -> str | None:
    """Why this machine can't run the cluster at all (None if it can)."""
    if sys.platform != "linux":
        return f"needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "needs root (network namespaces, bridges and dockerd)"
    missing = [t for t in _REQUIRED_TOOLS if _which(t) is None]
    if missing:
        return f"missing programs: {', '.join(missing)} (apt-get install docker.io iproute2 util-linux)"
    if _find_busybox() is None:
        return "no static busybox found (apt-get install busybox-static)"
    return None


def _find_busybox() -> str | None:
    for cand in (os.environ.get("GPUSPAWNER_BUSYBOX"), "/usr/bin/busybox", "/bin/busybox", _which("busybox")):
        if cand and os.path.isfile(cand) and _is_static_elf(cand):
            return cand
    return None


def _is_static_elf(path: str) -> bool:
    """True for an ELF executable without a PT_INTERP (dynamic loader) segment."""
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            if ident[:4] != b"\x7fELF":
                return False
            is64, little = ident[4] == 2, ident[5] == 1
            end = "<" if little else ">"
            if is64:
                (phoff,) = struct.unpack_from(end + "Q", ident, 0x20)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 0x36)
            else:
                (phoff,) = struct.unpack_from(end + "I", ident, 0x1C)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 0x2A)
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                (p_type,) = struct.unpack(end + "I", f.read(4))
                if p_type == 3:  # PT_INTERP
                    return False
            return True
    except (OSError, struct.error):
        return False


def _check_workers(workers: Sequence[str]) -> list[str]:
    workers = list(workers)
    if not workers:
        raise HarnessError("at least one worker is needed")
    if len(workers) > MAX_WORKERS:
        raise HarnessError(f"at most {MAX_WORKERS} workers")
    if len(set(workers)) != len(workers):
        raise HarnessError(f"duplicate worker hostnames: {workers}")
    for h in workers:
        if not _HOSTNAME_RE.match(h) or h == "manager":
            raise HarnessError(f"bad worker hostname {h!r} (lowercase letters, digits, '-'; not 'manager')")
    if socket.gethostname() in workers:
        raise HarnessError(f"worker hostname {socket.gethostname()!r} is this machine's (the manager's) hostname")
    return workers


def _check_paths(lay: _Layout, names: Iterable[str]) -> None:
    for name in names:
        # containerd's socket is the deepest unix socket dockerd creates under exec-root.
        longest = lay.exec_root(name) / "containerd" / "containerd-debug.sock"
        for p in (lay.sock(name), longest):
            if len(str(p)) > _SUN_PATH_MAX:
                raise HarnessError(f"socket path too long for a unix socket: {p}")


# --------------------------------------------------------------------------------------
# Expected cluster shape
# --------------------------------------------------------------------------------------


def _worker_addr(index: int) -> str:
    return f"{SUBNET_BASE}{FIRST_WORKER_OCTET + index}"


def _netns(hostname: str) -> str:
    return NETNS_PREFIX + hostname


def _veth(index: int) -> str:
    return f"{VETH_PREFIX}{FIRST_WORKER_OCTET + index}"


def _expected_cluster(lay: _Layout, workers: Sequence[str]) -> Cluster:
    manager_host = socket.gethostname()
    nodes = {manager_host: Node(manager_host, MANAGER_ADDR, f"unix://{lay.sock('manager')}", "manager", None)}
    for i, h in enumerate(workers):
        nodes[h] = Node(h, _worker_addr(i), f"unix://{lay.sock(h)}", "worker", _netns(h))
    return Cluster(
        state_dir=lay.state_dir,
        run_dir=lay.run_dir,
        manager_url=f"unix://{lay.sock('manager')}",
        manager_addr=MANAGER_ADDR,
        nodes=nodes,
    )


def _daemon_name(node: Node) -> str:
    return "manager" if node.role == "manager" else node.hostname


# --------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def _disable_ipv6(ifname: str, netns: str | None = None) -> None:
    """Keep a test link IPv4-only (no link-local address, no router solicitations).

    Best effort: without IPv6 in the kernel there is nothing to do."""
    knob = f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6"
    if netns is None:
        try:
            Path(knob).write_text("1")
        except OSError:
            pass
    else:
        # /proc/sys/net shows the network namespace of the process that opens it.
        _run(
            ["nsenter", f"--net=/var/run/netns/{netns}", "sh", "-c", f"[ ! -e {knob} ] || echo 1 > {knob}"], check=False
        )


def _setup_network(cluster: Cluster) -> None:
    _progress(f"network: bridge {BRIDGE} {MANAGER_ADDR}/{BRIDGE_PREFIXLEN}")
    _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    _disable_ipv6(BRIDGE)
    _run(["ip", "addr", "add", f"{MANAGER_ADDR}/{BRIDGE_PREFIXLEN}", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])
    for i, node in enumerate(cluster.workers):
        ns, veth = node.netns, _veth(i)
        assert ns is not None
        _progress(f"network: netns {ns} {node.addr} via {veth}")
        _run(["ip", "netns", "add", ns])
        # Create the pair with its far end directly inside the namespace, named eth0.
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        _disable_ipv6(veth)
        _run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
        _disable_ipv6("eth0", ns)
        _run(["ip", "-n", ns, "addr", "add", f"{node.addr}/{BRIDGE_PREFIXLEN}", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        # Deliberately no default route (see module docstring).


def _our_netns() -> list[str]:
    proc = _run(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(NETNS_PREFIX)]


def _our_links() -> list[str]:
    try:
        names = os.listdir("/sys/class/net")
    except OSError:
        return []
    return [n for n in names if n == BRIDGE or n == GW_BRIDGE or re.fullmatch(VETH_PREFIX + r"\d+", n)]


def _teardown_network() -> None:
    for ns in _our_netns():
        # A namespace only disappears when no process holds it; kill whatever is left.
        pids = [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).stdout.split() if p.isdigit()]
        if pids:
            _progress(f"killing {len(pids)} leftover process(es) in netns {ns}")
            _signal(pids, signal.SIGKILL)
            _wait_dead(pids, DAEMON_KILL_WAIT)
        _run(["ip", "netns", "delete", ns], check=False)
    for bridge in (GW_BRIDGE, BRIDGE):
        if _link_exists(bridge):
            # Ports of the bridge (veths whose other end is in a dying namespace).
            for port in (
                os.listdir(f"/sys/class/net/{bridge}/brif") if os.path.isdir(f"/sys/class/net/{bridge}/brif") else ()
            ):
                _run(["ip", "link", "delete", port], check=False)
    for link in _our_links():
        _run(["ip", "link", "delete", link], check=False)
    left = _our_links()
    if left:
        raise HarnessError(f"could not delete links: {left}")


# --------------------------------------------------------------------------------------
# dockerd processes
# --------------------------------------------------------------------------------------


# The manager shares the host's network namespace, which has a default route: without
# these, `docker service create` (the CLI asks the daemon for the image's registry
# digest) and the swarm task executor (it tries a pull before using the local image)
# make dockerd resolve and contact registry-1.docker.io.
_DOCKERD_ENV = {
    # Swarm tasks use the image present on the node without trying to pull it first.
    "DOCKER_SERVICE_PREFER_OFFLINE_IMAGE": "1",
    # Any registry request goes to a closed loopback port and fails at once. (dockerd
    # still resolves registry names itself, hence the resolv.conf in _start_daemon.)
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": f"localhost,127.0.0.0/8,{SUBNET_BASE}0/24",
}


# Run inside the new namespaces, before exec'ing dockerd. $1: hostname to set (empty:
# keep), $2: resolv.conf to bind over /etc/resolv.conf.
_NS_SCRIPT = (
    '{ [ -z "$1" ] || hostname "$1"; } && '
    '{ [ ! -e /etc/resolv.conf ] || mount --bind "$2" /etc/resolv.conf; } && '
    'shift 2 && exec "$@"'
)
_RESOLV_CONF = (
    "# gpuspawner test swarm: no name server outside this machine\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
)


def _dockerd_args(lay: _Layout, name: str, manager: bool) -> list[str]:
    args = [
        _which("dockerd") or "dockerd",
        f"--config-file={lay.daemon_json}",  # never read /etc/docker/daemon.json
        f"--data-root={lay.data_root(name)}",
        f"--exec-root={lay.exec_root(name)}",
        f"--pidfile={lay.pidfile(name)}",
        f"--host=unix://{lay.sock(name)}",
        # No --storage-driver: dockerd takes overlay2 where the data root's file system
        # allows it (a container starts at once) and falls back to vfs elsewhere (every
        # container start copies its whole image: ~15 s for the Jupyter image).
        # No iptables rules, no NAT, no ip_forward sysctl: the manager shares the host's
        # network namespace, and the workers don't need any of it.
        "--iptables=false",
        "--ip-masq=false",
        "--ip-forward=false",
        # Containers resolve names through their own loopback (and fail fast) instead of
        # the host's resolver: nothing in the cluster talks to addresses outside it.
        "--dns=127.0.0.1",
        # Containers are force-removed before the daemons stop; don't linger on shutdown.
        "--shutdown-timeout=5",
    ]
    if manager:
        # No docker0 (and no 172.17.0.0/16 route) in the host namespace.
        args.append("--bridge=none")
    return args


def _start_daemon(lay: _Layout, node: Node) -> int:
    """Start one dockerd, detached from this process; return its pid."""
    name = _daemon_name(node)
    lay.data_root(name).mkdir(parents=True, exist_ok=True)
    lay.exec_root(name).mkdir(parents=True, exist_ok=True)
    lay.logs_dir.mkdir(parents=True, exist_ok=True)
    cmd = _dockerd_args(lay, name, node.role == "manager")
    # Every dockerd gets its own mount namespace (slave: it still sees the host's mounts)
    # with /etc/resolv.conf replaced by one that points at loopback: dockerd resolves
    # registry names even with a proxy set (to check them against insecure-registry
    # CIDRs), and the manager shares the host's network, so the host's resolver would be
    # reachable. Its own mounts (netns files, container shm) also stay out of the host's
    # mount table and vanish with the namespace. Workers also get their network namespace
    # and their own UTS namespace (hostname). nsenter and unshare exec without forking and
    # sh execs dockerd, so the launched pid is dockerd's.
    prefix = [] if node.netns is None else [_which("nsenter") or "nsenter", f"--net=/var/run/netns/{node.netns}"]
    unshare = [_which("unshare") or "unshare", "--mount", "--propagation", "slave"]
    if node.netns is not None:
        unshare.append("--uts")
    cmd = (
        prefix
        + unshare
        + ["sh", "-c", _NS_SCRIPT, "sh", node.hostname if node.netns else "", str(lay.resolv_conf)]
        + cmd
    )
    log = lay.log(name)
    log.write_text(f"# {' '.join(cmd)}\n")
    env = {k: v for k, v in _env().items() if k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")}
    env.update(_DOCKERD_ENV)
    # Double fork through sh: dockerd must outlive this Python process (the CLI's `up`
    # returns with the cluster running) and must not be our child (no zombie bookkeeping,
    # no ResourceWarning from an un-waited Popen).
    launcher = 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'
    proc = subprocess.run(
        ["sh", "-c", launcher, "sh", str(log)] + cmd,
        capture_output=True,
        text=True,
        timeout=CMD_TIMEOUT,
        env=env,
        start_new_session=True,
    )
    if proc.returncode != 0 or not proc.stdout.strip().isdigit():
        raise HarnessError(f"could not launch dockerd for {node.hostname}: {proc.stderr}")
    return int(proc.stdout.strip())


def _wait_daemon(lay: _Layout, node: Node, pid: int) -> None:
    name = _daemon_name(node)
    api = node.api()
    deadline = time.monotonic() + DAEMON_START_TIMEOUT
    while True:
        if api.ping():
            return
        if not _alive(pid):
            raise HarnessError(
                f"dockerd for {node.hostname} exited during startup; log {lay.log(name)}:\n{_log_tail(lay.log(name))}"
            )
        if time.monotonic() >= deadline:
            raise HarnessError(
                f"dockerd for {node.hostname} did not answer on {node.docker_url} within "
                f"{DAEMON_START_TIMEOUT:.0f}s; log {lay.log(name)}:\n{_log_tail(lay.log(name))}"
            )
        time.sleep(0.1)


def _is_our_process(pid: int, lay: _Layout) -> bool:
    """dockerd / containerd / shims whose command line names our run or state dir."""
    argv = _cmdline(pid)
    if not argv or not os.path.basename(argv[0]).startswith(("dockerd", "containerd")):
        return False
    roots = (str(lay.run_dir) + "/", str(lay.state_dir) + "/")
    return any(r in arg for arg in argv for r in roots)


def _our_processes(lay: _Layout) -> set[int]:
    pids = {p for p in _all_pids() if _is_our_process(p, lay)}
    for name_file in lay.run_dir.glob("*.pid") if lay.run_dir.is_dir() else ():
        try:
            pid = int(name_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if _is_our_process(pid, lay):
            pids.add(pid)
    # Containers are children of the shims.
    return pids | _descendants(pids)


def _stop_daemons(lay: _Layout, graceful: bool = True) -> None:
    """Stop dockerds (SIGTERM, SIGKILL after a grace) and kill whatever they leave behind.

    containerd dies with its dockerd, but after a crash the shims and the containers
    under them live on: they are found by command line (our exec roots) and ancestry.
    """
    pids = _our_processes(lay)
    if not pids:
        return
    daemons = {p for p in pids if os.path.basename((_cmdline(p) or [""])[0]) == "dockerd"}
    if daemons and graceful:
        _progress(f"stopping {len(daemons)} dockerd(s)")
        _signal(daemons, signal.SIGTERM)
        left = _wait_dead(daemons, DAEMON_STOP_GRACE)
        if left:
            _progress(f"dockerd(s) {sorted(left)} still running after {DAEMON_STOP_GRACE:.0f}s: SIGKILL")
    rest = (pids | _our_processes(lay)) - {os.getpid()}
    rest = {p for p in rest if _alive(p)}
    if rest:
        _progress(f"killing {len(rest)} leftover process(es)")
        _signal(rest, signal.SIGKILL)
        still = _wait_dead(rest, DAEMON_KILL_WAIT)
        if still:
            raise HarnessError(f"processes survived SIGKILL: {sorted(still)}")


def _unmount_under(paths: Iterable[Path]) -> None:
    """Detach every mount (container shm, netns files, ...) below the given dirs."""
    prefixes = [str(p).rstrip("/") + "/" for p in paths]
    for _ in range(5):
        try:
            lines = Path("/proc/self/mountinfo").read_text().splitlines()
        except OSError:
            return
        mounts = []
        for line in lines:
            mp = line.split()[4].replace("\\040", " ")
            if any(mp.startswith(p) or mp + "/" == p for p in prefixes):
                mounts.append(mp)
        if not mounts:
            return
        for mp in sorted(set(mounts), key=len, reverse=True):
            _run(["umount", "-l", mp], check=False)


# --------------------------------------------------------------------------------------
# Swarm
# --------------------------------------------------------------------------------------


def _swarm_init(cluster: Cluster) -> str:
    api = cluster.manager.api()
    # Swarm would create docker_gwbridge itself, with a 172.x subnet and a route in the host
    # namespace. Create it first, without a host address (see module docstring).
    api.post(
        "/networks/create",
        body={
            "Name": "docker_gwbridge",
            "Driver": "bridge",
            "CheckDuplicate": True,
            "IPAM": {"Driver": "default", "Config": [{"Subnet": GW_BRIDGE_SUBNET}]},
            "Options": {
                "com.docker.network.bridge.name": GW_BRIDGE,
                "com.docker.network.bridge.enable_icc": "false",
                "com.docker.network.bridge.enable_ip_masquerade": "false",
                "com.docker.network.bridge.inhibit_ipv4": "true",
            },
        },
    )
    _disable_ipv6(GW_BRIDGE)
    _progress(f"swarm init on {MANAGER_ADDR}:{SWARM_PORT}")
    api.post(
        "/swarm/init",
        body={
            "ListenAddr": f"{MANAGER_ADDR}:{SWARM_PORT}",
            "AdvertiseAddr": MANAGER_ADDR,
            "Spec": {"Orchestration": {"TaskHistoryRetentionLimit": 2}},
        },
        timeout=JOIN_TIMEOUT,
    )
    return api.get("/swarm")["JoinTokens"]["Worker"]


def _swarm_join(lay: _Layout, node: Node, token: str) -> None:
    try:
        node.api().post(
            "/swarm/join",
            body={
                "ListenAddr": f"{node.addr}:{SWARM_PORT}",
                "AdvertiseAddr": node.addr,
                "RemoteAddrs": [f"{MANAGER_ADDR}:{SWARM_PORT}"],
                "JoinToken": token,
            },
            timeout=JOIN_TIMEOUT,
        )
    except DockerAPIError as e:
        if "continue in the background" in e.message:
            # dockerd gives up waiting for the join after 20 s (slow on a busy machine) but
            # keeps joining; _wait_ready waits for the node to show up Ready.
            _progress(f"{node.hostname}: join still in progress in the background")
            return
        log = lay.log(_daemon_name(node))
        raise HarnessError(f"{node.hostname} could not join the swarm: {e}; log {log}:\n{_log_tail(log)}") from e
    except (OSError, http.client.HTTPException) as e:
        log = lay.log(_daemon_name(node))
        raise HarnessError(f"{node.hostname} could not join the swarm: {e}; log {log}:\n{_log_tail(log)}") from e


def _node_problems(cluster: Cluster, timeout: float = 10.0) -> list[str]:
    """Why the swarm's node list doesn't match the cluster (empty list: all Ready)."""
    try:
        nodes = cluster.manager.api(timeout=timeout).get("/nodes")
    except (OSError, http.client.HTTPException, DockerAPIError) as e:
        return [f"manager: {e}"]
    problems = []
    seen = {}
    for n in nodes:
        state = (n.get("Status") or {}).get("State", "unknown")
        host = _node_hostname(n)
        if host is None:
            # A node that has just joined is in the list before its agent has reported
            # its description (hostname, ...): not ready yet, not an error.
            problems.append(f"node {n.get('ID', '?')[:12]} ({state}) has not reported its hostname yet")
            continue
        seen[host] = n
        want = cluster.nodes.get(host)
        if want is None:
            problems.append(f"unexpected node {host} ({state})")
            continue
        if state != "ready":
            problems.append(f"{host} is {state}")
        role = (n.get("Spec") or {}).get("Role")
        if role != want.role:
            problems.append(f"{host} has role {role}, expected {want.role}")
    for host in cluster.nodes:
        if host not in seen:
            problems.append(f"{host} not in swarm")
    return problems


def _wait_ready(lay: _Layout, cluster: Cluster, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        problems = _node_problems(cluster)
        if not problems:
            return
        if time.monotonic() >= deadline:
            log = lay.log("manager")
            raise HarnessError(
                f"swarm nodes not Ready after {timeout:.0f}s: {'; '.join(problems)}; "
                f"manager log {log}:\n{_log_tail(log)}"
            )
        time.sleep(0.2)


# --------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------


_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"


def _busybox_entries(busybox: str) -> list[tuple[str, str, Any, int]]:
    """The busybox root fs as (path, kind, content, mode), kind "dir", "file" (content:
    bytes, or a source path) or "symlink" (content: target); parents before children."""
    entries: dict[str, tuple[str, str, Any, int]] = {}

    def add_dir(rel: str, mode: int = 0o755) -> None:
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in entries:
                entries[d] = (d, "dir", None, mode if i == len(parts) else 0o755)

    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "home", "proc", "sys", "dev", "var/www"):
        add_dir(d)
    add_dir("tmp", 0o1777)
    entries["bin/busybox"] = ("bin/busybox", "file", busybox, 0o755)
    for rel in _run([busybox, "--list-full"]).stdout.split():
        rel = rel.strip("/")
        if not rel or "/" not in rel or rel in entries:  # skips e.g. "linuxrc"
            continue
        add_dir(rel.rsplit("/", 1)[0])
        entries[rel] = (rel, "symlink", "/bin/busybox", 0o777)
    entries["etc/passwd"] = ("etc/passwd", "file", _PASSWD.encode(), 0o644)
    entries["etc/group"] = ("etc/group", "file", _GROUP.encode(), 0o644)
    return [entries[k] for k in sorted(entries)]


def build_busybox_rootfs(dest: Path | str, busybox: str | None = None) -> Path:
    """Write a root file system with a static busybox and its applets as symlinks.

    ``dest`` is replaced. Layout: /bin/busybox, one symlink per applet where busybox
    installs it (/bin/sh, /usr/sbin/httpd, /usr/bin/env, ...), /etc/passwd and /etc/group
    (root, nobody), /tmp, /root, /var/www and the usual mount points. Add files to it and
    ``import_image`` it to make other test images.
    """
    busybox = busybox or _find_busybox()
    if busybox is None:
        raise HarnessError("no static busybox found (apt-get install busybox-static)")
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for rel, kind, content, mode in _busybox_entries(busybox):
        path = dest / rel
        if kind == "dir":
            path.mkdir()
        elif kind == "symlink":
            path.symlink_to(content)
            continue
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            shutil.copyfile(content, path)
        os.chmod(path, mode)
    return dest


def _tarinfo(name: str, kind: str, mode: int, size: int = 0, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE}[kind]
    info.mode, info.size, info.linkname = mode, size, target
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def _busybox_tar(busybox: str) -> bytes:
    """The same root fs as build_busybox_rootfs, as a tar made in memory (faster than
    writing ~300 symlinks to disk on every ``up``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_tarinfo(".", "dir", 0o755))
        for rel, kind, content, mode in _busybox_entries(busybox):
            if kind == "file":
                data = content if isinstance(content, bytes) else Path(content).read_bytes()
                tar.addfile(_tarinfo("./" + rel, kind, mode, size=len(data)), io.BytesIO(data))
            else:
                tar.addfile(_tarinfo("./" + rel, kind, mode, target=content or ""))
    return buf.getvalue()


def _rootfs_tar(rootfs: Path) -> bytes:
    """A reproducible tar of a directory (sorted, owned by root, fixed mtime)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(path: Path) -> None:
            arcname = "./" + str(path.relative_to(rootfs)) if path != rootfs else "."
            info = tar.gettarinfo(str(path), arcname=arcname)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
            if path.is_dir() and not path.is_symlink():
                for child in sorted(path.iterdir()):
                    add(child)

        add(rootfs)
    return buf.getvalue()


def _image_label(api: DockerAPI, name: str) -> str | None:
    try:
        info = api.get(f"/images/{urllib.parse.quote(name, safe='')}/json")
    except DockerAPIError as e:
        if e.status == 404:
            return None
        raise
    return ((info.get("Config") or {}).get("Labels") or {}).get(ROOTFS_LABEL)


def import_image(
    cluster: Cluster,
    name: str,
    rootfs_dir: Path | str,
    *,
    cmd: Sequence[str] = ("/bin/sh",),
    force: bool = False,
) -> list[str]:
    """``docker import`` a root fs directory as ``name`` on every node (each daemon has its
    own image store); return the hostnames it was imported on.

    Nodes that already have ``name`` made from the same content are skipped (the content
    hash is kept in the image label ``io.gpuspawner.test.rootfs-sha256``).
    """
    return _import_tar(cluster, name, _rootfs_tar(Path(rootfs_dir)), cmd=cmd, force=force)


def _import_tar(
    cluster: Cluster,
    name: str,
    tar: bytes | Path,
    *,
    cmd: Sequence[str] = ("/bin/sh",),
    force: bool = False,
    digest: str | None = None,
    changes: Sequence[str] = (),
    nodes: Sequence[Node] | None = None,
    timeout: float = IMPORT_TIMEOUT,
) -> list[str]:
    """Import ``tar`` (bytes, or the path of a tar file, read only if a node needs it) as
    ``name`` on ``nodes`` (default: every node). ``digest`` (default: the tar's sha256)
    is kept in the image label; a node whose image has it already is skipped.
    ``changes`` are Dockerfile instructions added to the default ENV PATH and CMD."""
    repo, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
    if digest is None:
        digest = hashlib.sha256(tar if isinstance(tar, bytes) else Path(tar).read_bytes()).hexdigest()
    changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"CMD {json.dumps(list(cmd))}",
        *changes,
        f"LABEL {ROOTFS_LABEL}={digest}",
    ]
    targets = [
        n
        for n in (nodes if nodes is not None else cluster.nodes.values())
        if force or _image_label(n.api(), name) != digest
    ]
    if not targets:
        return []
    data = tar if isinstance(tar, bytes) else Path(tar).read_bytes()
    if len(data) > 50 << 20:  # a big one takes a while: say so first
        _progress(f"importing {name} ({len(data) >> 20} MiB) on {', '.join(n.hostname for n in targets)}")

    def one(node: Node) -> str:
        api = node.api(timeout=timeout)
        # Errors come back as JSON messages in a 200 response: check the result instead.
        out = api.post(
            "/images/create",
            params=[("fromSrc", "-"), ("repo", repo), ("tag", tag)] + [("changes", c) for c in changes],
            raw=data,
            content_type="application/x-tar",
        )
        if _image_label(api, name) != digest:
            raise HarnessError(f"import of {name} on {node.hostname} failed: {str(out)[-2000:]}")
        return node.hostname

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(targets)) as pool:
        done = list(pool.map(one, targets))
    _progress(f"imported {name} ({len(data) // 1024} KiB) on {', '.join(done)}")
    return done


def ensure_test_image(cluster: Cluster) -> list[str]:
    """Make sure ``TEST_IMAGE`` (busybox) is on every node; return the nodes imported to."""
    busybox = _find_busybox()
    if busybox is None:
        raise HarnessError("no static busybox found (apt-get install busybox-static)")
    return _import_tar(cluster, TEST_IMAGE, _busybox_tar(busybox))


# --------------------------------------------------------------------------------------
# Locking and state file
# --------------------------------------------------------------------------------------

# One lock for the machine, not per state dir: the bridge, the namespaces and the
# addresses are machine-wide.
LOCK_FILE = Path("/run/lock/gpuspawner-swarm.lock" if os.path.isdir("/run/lock") else "/tmp/gpuspawner-swarm.lock")
LOCK_TIMEOUT = 300.0


@contextlib.contextmanager
def _lock(timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """Serialize up/down between processes (e.g. two test sessions at once)."""
    with open(LOCK_FILE, "a") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise HarnessError(f"another process holds {LOCK_FILE} for more than {timeout:.0f}s") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------
# Sharing the cluster between test sessions
# --------------------------------------------------------------------------------------

# Several test sessions on one machine (two developers, or a session started while another
# runs) share the one cluster. A session holds a shared lock on USERS_LOCK_FILE while it
# uses the cluster; what would pull the cluster from under another session (tearing it
# down at the end of a session, deliberately crashing and rebuilding it in a test) needs
# the lock exclusively. The kernel drops the lock when the process dies, so a killed
# session leaves nothing stale behind.
USERS_LOCK_FILE = LOCK_FILE.with_name("gpuspawner-swarm.users.lock")
EXCLUSIVE_USE_TIMEOUT = 900.0

# flock() locks belong to an open file: this process must use one, or it would wait for itself.
_users_file: io.TextIOWrapper | None = None
_users_mode = fcntl.LOCK_UN


def _users_lock(mode: int, timeout: float, what: str) -> None:
    """Take USERS_LOCK_FILE in ``mode`` (LOCK_SH or LOCK_EX), waiting at most ``timeout`` s.

    Converting a held lock is not atomic: while it waits, this process holds no lock."""
    global _users_file, _users_mode
    if _users_mode == mode:
        return
    if _users_file is None:
        _users_file = open(USERS_LOCK_FILE, "a")  # noqa: SIM115 - kept open for the process's life
    deadline = time.monotonic() + timeout
    said = False
    while True:
        try:
            fcntl.flock(_users_file, mode | fcntl.LOCK_NB)
            _users_mode = mode
            return
        except BlockingIOError:
            _users_mode = fcntl.LOCK_UN  # a failed conversion has dropped the old lock
            if time.monotonic() >= deadline:
                raise HarnessError(
                    f"{what}: other processes kept using the test swarm (lock {USERS_LOCK_FILE}) for "
                    f"more than {timeout:.0f}s"
                ) from None
            if not said:
                _progress(f"{what}: waiting for other test sessions to finish with the swarm")
                said = True
            time.sleep(0.5)


def _users_unlock() -> None:
    global _users_mode
    if _users_file is not None:
        fcntl.flock(_users_file, fcntl.LOCK_UN)
    _users_mode = fcntl.LOCK_UN


def use_shared(timeout: float = LOCK_TIMEOUT) -> None:
    """Mark this process as a user of the cluster, until ``down_if_unused`` or its exit.

    Waits only while another process uses the cluster exclusively (a rebuild or a
    ``down_if_unused``)."""
    _users_lock(fcntl.LOCK_SH, timeout, "using the swarm")


@contextlib.contextmanager
def exclusive_use(
    workers: Sequence[str] = DEFAULT_WORKERS,
    state_dir: Path | str | None = None,
    run_dir: Path | str | None = None,
    timeout: float = EXCLUSIVE_USE_TIMEOUT,
) -> Iterator[Cluster]:
    """For a test that breaks the cluster on purpose: wait until no other process uses
    it, make sure it is up (another session may have taken it down meanwhile), and keep
    other sessions out until the block ends. Then back to shared use."""
    had = _users_mode
    _users_lock(fcntl.LOCK_EX, timeout, "exclusive use of the swarm")
    try:
        yield up(workers, state_dir, run_dir)
    finally:
        if had == fcntl.LOCK_SH:
            _users_lock(fcntl.LOCK_SH, LOCK_TIMEOUT, "using the swarm")
        else:
            _users_unlock()


def down_if_unused(state_dir: Path | str | None = None, run_dir: Path | str | None = None) -> bool:
    """End this process's use of the cluster and tear it down unless another process
    still uses it (then it stays up for that one, whose own end takes it down).
    Returns whether it was torn down."""
    _users_unlock()
    try:
        _users_lock(fcntl.LOCK_EX, 0, "down")
    except HarnessError:
        return False
    try:
        down(state_dir, run_dir)
    finally:
        _users_unlock()
    return True


# --------------------------------------------------------------------------------------
# State file
# --------------------------------------------------------------------------------------


def load(state_dir: Path | str | None = None, run_dir: Path | str | None = None) -> Cluster | None:
    """The cluster recorded in state_dir (running or not), or None."""
    lay = _layout(state_dir, run_dir)
    try:
        return Cluster.from_json(json.loads(lay.state_file.read_text())["cluster"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _fingerprint(lay: _Layout, cluster: Cluster) -> str:
    """Hash of how the daemons are started: a change in the harness means a fresh cluster."""
    config = {
        "args": {h: _dockerd_args(lay, _daemon_name(n), n.role == "manager") for h, n in cluster.nodes.items()},
        "env": _DOCKERD_ENV,
        "namespaces": [_NS_SCRIPT, _RESOLV_CONF],
        "gw": [GW_BRIDGE, GW_BRIDGE_SUBNET, BRIDGE_PREFIXLEN],
    }
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def _saved_fingerprint(lay: _Layout) -> str | None:
    try:
        return json.loads(lay.state_file.read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def _save(lay: _Layout, cluster: Cluster) -> None:
    lay.state_dir.mkdir(parents=True, exist_ok=True)
    tmp = lay.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"cluster": cluster.to_json(), "fingerprint": _fingerprint(lay, cluster)}, indent=2))
    tmp.replace(lay.state_file)


def _health_problems(lay: _Layout, cluster: Cluster) -> list[str]:
    """Why a running cluster can't be reused as-is (empty list: healthy)."""
    problems = []
    if not _link_exists(BRIDGE):
        problems.append(f"bridge {BRIDGE} missing")
    netns = set(_our_netns())
    for node in cluster.nodes.values():
        if node.netns and node.netns not in netns:
            problems.append(f"netns {node.netns} missing")
        if not node.api().ping(timeout=HEALTH_PING_TIMEOUT):
            problems.append(f"dockerd for {node.hostname} not answering on {node.docker_url}")
    if problems:
        return problems
    for node in cluster.nodes.values():
        try:
            info = node.api().get("/info")
        except (OSError, http.client.HTTPException, DockerAPIError) as e:
            problems.append(f"{node.hostname}: {e}")
            continue
        if info.get("Name") != node.hostname:
            problems.append(f"dockerd at {node.docker_url} has hostname {info.get('Name')}, expected {node.hostname}")
        if (info.get("Swarm") or {}).get("LocalNodeState") != "active":
            problems.append(f"{node.hostname} is not in a swarm")
    return problems or _node_problems(cluster)


# --------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------


def up(
    workers: Sequence[str] = DEFAULT_WORKERS,
    state_dir: Path | str | None = None,
    run_dir: Path | str | None = None,
) -> Cluster:
    """Bring the cluster up (or reuse it if it is already up and healthy); return it.

    Anything half-made (namespaces, links, daemons, mounts, files from a crashed or
    different run) is torn down first. Raises ``HarnessError`` on failure, with the
    failing dockerd's log tail where there is one.
    """
    reason = unavailable_reason()
    if reason:
        raise HarnessError(f"cannot run a swarm here: {reason}")
    workers = _check_workers(workers)
    lay = _layout(state_dir, run_dir)
    wanted = _expected_cluster(lay, workers)
    _check_paths(lay, (_daemon_name(n) for n in wanted.nodes.values()))

    with _lock():
        return _up_locked(lay, wanted)


def _up_locked(lay: _Layout, wanted: Cluster) -> Cluster:
    t0 = time.monotonic()
    current = load(lay.state_dir, lay.run_dir)
    same_config = _saved_fingerprint(lay) == _fingerprint(lay, wanted)
    if current is not None and current.to_json() == wanted.to_json() and same_config:
        problems = _health_problems(lay, wanted)
        if not problems:
            ensure_test_image(wanted)
            _progress(f"cluster already up and healthy ({time.monotonic() - t0:.1f}s)")
            return wanted
        _progress("existing cluster unhealthy, recreating: " + "; ".join(problems))
    elif current is not None:
        _progress("existing cluster has a different shape or daemon configuration, recreating")

    # Whatever is there gets replaced, so no need for a graceful stop.
    _teardown(lay, graceful=False)
    for old_log in lay.logs_dir.glob("*.attempt*.log") if lay.logs_dir.is_dir() else ():
        old_log.unlink(missing_ok=True)
    failures: list[str] = []
    for attempt in range(1, BRINGUP_ATTEMPTS + 1):
        try:
            _create(lay, wanted)
            break
        except (HarnessError, OSError, http.client.HTTPException) as e:
            # Environmental failures (a daemon that died or did not answer in time, ...)
            # get one more try from scratch. Anything else (a bug here) fails at once.
            first_line = (str(e).splitlines() or [""])[0] or type(e).__name__
            failures.append(f"attempt {attempt}: {first_line}")
            last = attempt == BRINGUP_ATTEMPTS
            _progress(
                f"bring-up attempt {attempt}/{BRINGUP_ATTEMPTS} failed ({first_line}); "
                + ("cleaning up" if last else "tearing down and retrying from scratch")
                + "; dockerd logs are in "
                + str(lay.logs_dir)
            )
            cleaned = _cleanup_failed_bringup(lay)
            if last or not cleaned:
                if len(failures) > 1 and hasattr(e, "add_note"):
                    e.add_note("earlier bring-up attempts failed too: " + "; ".join(failures[:-1]))
                raise
            _keep_logs_of_attempt(lay, attempt)
        except BaseException:
            _progress("bring-up failed, cleaning up; dockerd logs are in " + str(lay.logs_dir))
            _cleanup_failed_bringup(lay)
            raise
    _progress(f"cluster up ({time.monotonic() - t0:.1f}s)")
    return wanted


def _cleanup_failed_bringup(lay: _Layout) -> bool:
    """Don't leave daemons and namespaces behind (the logs stay); False if that failed."""
    try:
        _teardown(lay, graceful=False)
    except Exception as e:  # noqa: BLE001 - the original error matters more
        _progress(f"cleanup after the failed bring-up failed too: {e}")
        return False
    return True


def _keep_logs_of_attempt(lay: _Layout, attempt: int) -> None:
    """logs/<name>.log -> logs/<name>.attempt<N>.log, before the next attempt overwrites them."""
    for log in lay.logs_dir.glob("*.log") if lay.logs_dir.is_dir() else ():
        if ".attempt" not in log.name:
            log.replace(log.with_name(f"{log.stem}.attempt{attempt}.log"))


def _create(lay: _Layout, cluster: Cluster) -> None:
    lay.state_dir.mkdir(parents=True, exist_ok=True)
    lay.run_dir.mkdir(parents=True, exist_ok=True)
    lay.daemon_json.write_text("{}\n")
    lay.resolv_conf.write_text(_RESOLV_CONF)
    _setup_network(cluster)

    nodes = list(cluster.nodes.values())
    _progress(f"starting {len(nodes)} dockerd(s)")
    pids = {n.hostname: _start_daemon(lay, n) for n in nodes}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        for f in [pool.submit(_wait_daemon, lay, n, pids[n.hostname]) for n in nodes]:
            f.result()
    _progress("all dockerds answer")

    token = _swarm_init(cluster)
    _progress(f"joining {', '.join(n.hostname for n in cluster.workers)}")
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cluster.workers)) as pool:
        for f in [pool.submit(_swarm_join, lay, n, token) for n in cluster.workers]:
            f.result()
    _wait_ready(lay, cluster)
    _progress("all nodes Ready")
    _save(lay, cluster)
    ensure_test_image(cluster)


def _remove_swarm_objects(cluster: Cluster) -> None:
    """Best effort: remove services, force-remove containers, leave the swarm."""
    manager = cluster.manager.api(timeout=10)
    if manager.ping():
        try:
            for svc in manager.get("/services") or []:
                manager.delete(f"/services/{svc['ID']}")
        except (OSError, http.client.HTTPException, DockerAPIError) as e:
            _progress(f"removing services: {e}")

    def clean_node(node: Node) -> None:
        api = node.api(timeout=10)
        if not api.ping():
            return
        try:
            for c in api.get("/containers/json", params={"all": "1"}) or []:
                api.delete(f"/containers/{c['Id']}", params={"force": "1", "v": "1"})
        except (OSError, http.client.HTTPException, DockerAPIError) as e:
            _progress(f"removing containers on {node.hostname}: {e}")
        if node.role == "worker":
            try:
                api.post("/swarm/leave", params={"force": "1"})
            except (OSError, http.client.HTTPException, DockerAPIError) as e:
                _progress(f"{node.hostname} leaving swarm: {e}")

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cluster.nodes)) as pool:
        list(pool.map(clean_node, cluster.nodes.values()))
    if manager.ping():
        try:
            manager.post("/swarm/leave", params={"force": "1"})
        except (OSError, http.client.HTTPException, DockerAPIError) as e:
            _progress(f"manager leaving swarm: {e}")


def _teardown(lay: _Layout, graceful: bool = True) -> None:
    """Remove everything the harness makes; graceful: via the API first (services,
    containers, swarm membership), then SIGTERM; otherwise straight to SIGKILL."""
    t0 = time.monotonic()
    cluster = load(lay.state_dir, lay.run_dir)
    if graceful and cluster is not None:
        _remove_swarm_objects(cluster)
    _stop_daemons(lay, graceful=graceful)
    _teardown_network()
    _unmount_under([lay.run_dir, lay.state_dir])
    for path in [lay.run_dir, lay.state_dir / "nodes", lay.state_file, lay.daemon_json, lay.resolv_conf]:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=False)
        elif path.exists() or path.is_symlink():
            path.unlink()
    if time.monotonic() - t0 > 0.5:
        _progress(f"teardown done ({time.monotonic() - t0:.1f}s)")


def down(state_dir: Path | str | None = None, run_dir: Path | str | None = None) -> None:
    """Tear the cluster down completely. Safe to call when nothing is up."""
    if os.geteuid() != 0:
        raise HarnessError("needs root")
    with _lock():
        _teardown(_layout(state_dir, run_dir), graceful=True)


def status(state_dir: Path | str | None = None, run_dir: Path | str | None = None) -> tuple[Cluster | None, list[str]]:
    """(recorded cluster or None, list of problems; empty when up and healthy)."""
    lay = _layout(state_dir, run_dir)
    cluster = load(lay.state_dir, lay.run_dir)
    if cluster is None:
        return None, ["no cluster recorded in " + str(lay.state_file)]
    return cluster, _health_problems(lay, cluster)


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.swarm", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--workers", default=",".join(DEFAULT_WORKERS), help="worker hostnames, comma-separated")
    parser.add_argument("--state-dir", default=None, help=f"default {DEFAULT_STATE_DIR}")
    parser.add_argument("--run-dir", default=None, help=f"default {DEFAULT_RUN_DIR} (or STATE_DIR/run)")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            cluster = up(tuple(w for w in args.workers.split(",") if w), args.state_dir, args.run_dir)
            print(_summary(cluster))
        elif args.command == "down":
            down(args.state_dir, args.run_dir)
            print("cluster down")
        else:
            cluster, problems = status(args.state_dir, args.run_dir)
            if cluster is None:
                print("status: down")
                return 1
            print(_summary(cluster))
            print("status: " + ("healthy" if not problems else "NOT healthy: " + "; ".join(problems)))
            return 0 if not problems else 1
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
