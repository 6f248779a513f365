"""An in-process fake of the ``docker.APIClient`` calls the hub makes to a
swarm manager, behaving like the daemon where the hub's bookkeeping depends
on it.

Only the methods that ``gpuspawner.cluster.swarm.Swarm`` and dockerspawner's
``SwarmSpawner`` call are here, with docker-py's signatures: ``nodes``,
``services``, ``inspect_service``, ``create_service``, ``remove_service``,
``tasks`` and ``inspect_image``. Anything the fake does not model (a filter,
a constraint) raises NotImplementedError rather than answering wrongly.

Nothing happens on its own: tasks move only when the test says so
(:meth:`advance`, :meth:`run_all`, :meth:`fail`, :meth:`exit_container`,
:meth:`reap`), so each daemon-side change is a step that a scheduler can
place between the hub's calls. What the daemon does that matters most here:
a removed service is gone at once, but its tasks linger, queried by id, until
their containers exit.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import docker.errors
import requests

__all__ = ["API_CALLS", "FakeDocker", "FINAL_STATES", "api_error"]

FINAL_STATES = {"complete", "failed", "shutdown", "rejected", "orphaned", "remove"}
TASK_STATES = [
    "new",
    "allocated",
    "pending",
    "assigned",
    "accepted",
    "preparing",
    "ready",
    "starting",
    "running",
    *sorted(FINAL_STATES),
]
WAITING_STATES = set(TASK_STATES[: TASK_STATES.index("running")])


def api_error(status: int, message: str) -> docker.errors.APIError:
    """The exception docker-py raises for this HTTP status (NotFound for 404),
    with a real ``requests.Response`` behind it."""
    response = requests.Response()
    response.status_code = status
    response.reason = HTTPStatus(status).phrase
    response.url = "http+docker://localhost/fake"
    response._content = json.dumps({"message": message}).encode()
    try:
        docker.errors.create_api_error_from_http_exception(requests.HTTPError(message, response=response))
    except docker.errors.APIError as exc:
        return exc
    raise AssertionError("unreachable")


@dataclass
class _Node:
    id: str
    hostname: str
    addr: str
    manager: bool
    state: str = "ready"
    availability: str = "active"
    nano_cpus: int | None = None  # what the node says it has (None: nothing said)
    memory_bytes: int | None = None


@dataclass
class _Task:
    id: str
    service_id: str
    service_name: str
    spec: dict
    created: str
    node_id: str = ""
    state: str = "new"
    desired: str = "running"
    message: str = "created"
    err: str = ""
    exit_code: int | None = None
    env: dict = field(default_factory=dict)


class FakeDocker:
    """A swarm manager in memory. ``nodes``: hostnames, the first one the
    manager; services without a hostname constraint go to the first worker."""

    def __init__(self, nodes: list[str] = ("manager", "worker"), images: dict[str, list[str]] | None = None):
        self._ids = itertools.count(1)
        self._made_ns = time.time_ns()  # creation times count on from here
        self._lock = threading.RLock()  # a ThreadPoolExecutor may call in from several threads
        self._nodes = [_Node(self._id("node"), h, f"10.0.0.{i + 1}", manager=i == 0) for i, h in enumerate(nodes)]
        self._services: dict[str, dict] = {}  # ID -> service as inspect_service returns it
        self._tasks: dict[str, _Task] = {}
        self._images = images  # None: every image exists, with a default Cmd
        self._faults: list[tuple[str, int | None, str, bool]] = []
        self._next_port = 30000
        self.unreachable = False  # every call raises requests.ConnectionError
        self.calls: list[tuple[str, tuple, dict]] = []  # (method, args, kwargs) of every API call

    def _id(self, kind: str) -> str:
        return f"{kind}{next(self._ids):0{25 - len(kind)}d}"  # deterministic, 25 characters like the daemon's

    # -- the API --------------------------------------------------------------

    def _api(method: Callable) -> Callable:  # noqa: N805  (a decorator used in the class body)
        """Log the call, then apply the connection and injected faults."""

        def call(self, *args, **kwargs):
            with self._lock:
                self.calls.append((method.__name__, args, kwargs))
                if self.unreachable:
                    raise requests.ConnectionError(f"fake manager unreachable ({method.__name__})")
                fault = next((f for f in self._faults if f[0] == method.__name__), None)
                if fault is None:
                    return method(self, *args, **kwargs)
                self._faults.remove(fault)
                _, status, message, applied = fault
                if applied:
                    method(self, *args, **kwargs)
                if status is None:
                    raise requests.ConnectionError(message)
                raise api_error(status, message)

        call.__name__ = method.__name__
        call.__doc__ = method.__doc__
        call.docker_api = True  # type: ignore[attr-defined]  (what API_CALLS lists)
        return call

    @_api
    def nodes(self, filters=None) -> list[dict]:
        if filters:
            raise NotImplementedError(f"node filters {filters}")
        return [self._node_dict(n) for n in self._nodes]

    @_api
    def services(self, filters=None, status=None) -> list[dict]:
        found = list(self._services.values())
        for key, values in _filters(filters).items():
            if key == "label":
                found = [s for s in found if all(_label_matches(s["Spec"].get("Labels") or {}, v) for v in values)]
            elif key == "name":
                found = [s for s in found if s["Spec"]["Name"] in values]
            elif key == "id":
                found = [s for s in found if s["ID"] in values]
            else:
                raise NotImplementedError(f"service filter {key!r}")
        return copy.deepcopy(found)

    @_api
    def inspect_service(self, service, insert_defaults=None) -> dict:
        return copy.deepcopy(self._service(service))

    @_api
    def inspect_image(self, image) -> dict:
        if self._images is None:
            return {"Id": "sha256:fake", "Config": {"Cmd": ["jupyterhub-singleuser"]}}
        if image not in self._images:
            raise api_error(404, f"No such image: {image}")
        return {"Id": "sha256:fake", "Config": {"Cmd": list(self._images[image])}}

    @_api
    def create_service(
        self,
        task_template,
        name=None,
        labels=None,
        mode=None,
        update_config=None,
        networks=None,
        endpoint_config=None,
        endpoint_spec=None,
        rollback_config=None,
    ) -> dict:
        template = _plain(task_template)
        if not template.get("ContainerSpec", {}).get("Image"):
            raise docker.errors.DockerException("Missing mandatory Image key in ContainerSpec")  # docker-py's own check
        if mode not in (None, "replicated") and _plain(mode) != {"replicated": {"Replicas": 1}}:
            raise NotImplementedError(f"service mode {mode}")
        sid = self._id("svc")
        name = name or f"service{sid[-4:]}"
        if any(s["Spec"]["Name"] == name for s in self._services.values()):
            raise api_error(
                409,
                f"rpc error: code = AlreadyExists desc = name conflicts with an existing object: "
                f"service {name} already exists",
            )
        endpoint = _plain(endpoint_spec) or {}
        ports = []
        for port in endpoint.get("Ports") or []:
            port = {"PublishMode": "ingress", **port}
            if not port.get("PublishedPort"):
                port["PublishedPort"], self._next_port = self._next_port, self._next_port + 1
            ports.append(port)
        created = self._stamp()
        self._services[sid] = {
            "ID": sid,
            "Version": {"Index": 1},
            "CreatedAt": created,
            "UpdatedAt": created,
            "Spec": {
                "Name": name,
                "Labels": dict(labels or {}),
                "TaskTemplate": template,
                "Mode": {"Replicated": {"Replicas": 1}},
                "EndpointSpec": endpoint,
            },
            "Endpoint": {"Spec": endpoint, **({"Ports": ports} if ports else {})},
        }
        env = dict(
            item.split("=", 1) if "=" in item else (item, "") for item in template["ContainerSpec"].get("Env") or []
        )
        task = _Task(self._id("task"), sid, name, template, created, env=env)
        self._tasks[task.id] = task
        self._place(task)
        return {"ID": sid}

    @_api
    def remove_service(self, service) -> bool:
        """The service is gone at once; its tasks are told to shut down and
        linger until their containers exit (see :meth:`exit_container`)."""
        sid = self._service(service)["ID"]
        del self._services[sid]
        for task in self._tasks.values():
            if task.service_id == sid:
                task.desired = "shutdown"
        return True

    @_api
    def tasks(self, filters=None) -> list[dict]:
        found = list(self._tasks.values())
        for key, values in _filters(filters).items():
            if key == "id":
                found = [t for t in found if t.id in values]
            elif key == "service":  # by name or ID; an unknown (or removed) service is a 404
                ids = {self._service(v)["ID"] for v in values}
                found = [t for t in found if t.service_id in ids]
            elif key == "desired-state":
                found = [t for t in found if t.desired in values]
            elif key == "node":
                nodes = {n.id for n in self._nodes if n.id in values or n.hostname in values}
                found = [t for t in found if t.node_id in nodes]
            else:
                raise NotImplementedError(f"task filter {key!r}")
        return [self._task_dict(t) for t in found]

    # -- what the daemon and the containers do, when the test says so ----------

    def advance(self, task_id: str, state: str, message: str = "") -> None:
        """Move a task to ``state`` (any of the daemon's task states)."""
        with self._lock:
            if state not in TASK_STATES:
                raise ValueError(f"unknown task state {state!r}")
            task = self._tasks[task_id]
            if state not in WAITING_STATES and state not in FINAL_STATES and not task.node_id:
                raise ValueError(f"task {task_id} has no node to run on")
            task.state, task.message = state, message or state

    def run_all(self) -> None:
        """Every task of a live service that is not yet running starts (tasks
        without a node are placed first, if a node now suits them)."""
        with self._lock:
            for task in self._tasks.values():
                if task.desired == "running" and task.state in WAITING_STATES:
                    if not task.node_id:
                        self._place(task)
                    if task.node_id:
                        task.state, task.message, task.err = "running", "started", ""

    def fail(self, task_id: str, state: str = "failed", err: str = "task: non-zero exit (1)") -> None:
        """The task ends in ``state`` (failed, rejected, ...) with this error."""
        with self._lock:
            if state not in FINAL_STATES:
                raise ValueError(f"{state!r} is not a final task state")
            task = self._tasks[task_id]
            task.state, task.err, task.message = state, err, state

    def exit_container(self, task_id: str, exit_code: int = 0) -> None:
        """The task's container exits: shutdown if the swarm asked it to,
        otherwise complete (code 0) or failed. A task of a removed service
        stays listed by id until :meth:`reap`."""
        with self._lock:
            task = self._tasks[task_id]
            if task.state in FINAL_STATES:
                return
            if task.desired != "running":
                task.state = "shutdown"
            else:
                task.state = "complete" if exit_code == 0 else "failed"
                task.err = "" if exit_code == 0 else f"task: non-zero exit ({exit_code})"
            task.exit_code, task.message = exit_code, "finished"

    def exit_all(self) -> None:
        """Every container that may still run exits (code 0)."""
        with self._lock:
            for task_id in self.running_containers():
                self.exit_container(task_id)

    def reap(self) -> None:
        """The tasks of removed services whose containers have exited vanish."""
        with self._lock:
            self._tasks = {
                i: t for i, t in self._tasks.items() if t.service_id in self._services or t.state not in FINAL_STATES
            }

    def fail_next(
        self, method: str, status: int | None = 500, message: str = "injected fault", *, applied: bool = False
    ) -> None:
        """The next call of ``method`` raises: an APIError with ``status``, or
        requests.ConnectionError for ``status=None``. ``applied``: the call
        takes effect first (the daemon did it, the answer was lost)."""
        with self._lock:
            self._faults.append((method, status, message, applied))

    def set_node_resources(self, hostname: str, cpus: float, memory_gib: float) -> None:
        """What the node says it has (NanoCPUs, MemoryBytes)."""
        with self._lock:
            node = self._node(hostname)
            node.nano_cpus, node.memory_bytes = int(cpus * 10**9), int(memory_gib * 2**30)

    def set_node(self, hostname: str, *, state: str | None = None, availability: str | None = None) -> None:
        """A node goes down ("down") or comes back ("ready"), or is drained,
        paused or made active. Its tasks are not touched: the test says what
        happens to them."""
        with self._lock:
            node = self._node(hostname)
            node.state = state or node.state
            node.availability = availability or node.availability

    # -- for invariants and assertions ------------------------------------------

    def running_containers(self) -> dict[str, tuple[str, str, str]]:
        """{task_id: (service name, node hostname, NVIDIA_VISIBLE_DEVICES)} of
        every task whose container may still run (not in a final state),
        including the lingering tasks of removed services."""
        with self._lock:
            hostnames = {n.id: n.hostname for n in self._nodes}
            return {
                t.id: (t.service_name, hostnames.get(t.node_id, ""), t.env.get("NVIDIA_VISIBLE_DEVICES", ""))
                for t in self._tasks.values()
                if t.state not in FINAL_STATES
            }

    def service_names(self) -> list[str]:
        with self._lock:
            return [s["Spec"]["Name"] for s in self._services.values()]

    def task_ids(self, service: str) -> list[str]:
        """The tasks of a service, by name or ID, even a removed one."""
        with self._lock:
            return [t.id for t in self._tasks.values() if service in (t.service_name, t.service_id)]

    def calls_to(self, method: str) -> list[tuple[tuple, dict]]:
        return [(args, kwargs) for m, args, kwargs in self.calls if m == method]

    # -- internals ----------------------------------------------------------------

    def _stamp(self) -> str:
        """A creation time as the daemon writes it (RFC 3339 in UTC, to the nanosecond): this
        fake's own making, plus a nanosecond per id so far, so that stamps sort by creation,
        as the hub expects, and a service adopted now was created a moment ago."""
        seconds, ns = divmod(self._made_ns + next(self._ids), 10**9)
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ns:09d}Z"

    def _service(self, name_or_id: str) -> dict:
        for service in self._services.values():
            if name_or_id in (service["ID"], service["Spec"]["Name"]):
                return service
        raise api_error(404, f"service {name_or_id} not found")

    def _node(self, hostname: str) -> _Node:
        return next(n for n in self._nodes if n.hostname == hostname)

    def _place(self, task: _Task) -> None:
        """Pick a node as the scheduler would; none suitable: pending, with the reason."""
        constraints = (task.spec.get("Placement") or {}).get("Constraints") or []
        nodes = [
            n
            for n in self._nodes
            if n.state == "ready" and n.availability == "active" and all(_constraint_holds(n, c) for c in constraints)
        ]
        node = next((n for n in nodes if not n.manager), nodes[0] if nodes else None)
        if node is None:
            task.state, task.err = (
                "pending",
                f"no suitable node (scheduling constraints not satisfied on {len(self._nodes)} nodes)",
            )
        else:
            task.node_id, task.state, task.err = node.id, "new" if task.state == "new" else "assigned", ""

    def _node_dict(self, n: _Node) -> dict:
        raw = {
            "ID": n.id,
            "Version": {"Index": 1},
            "Spec": {"Role": "manager" if n.manager else "worker", "Availability": n.availability, "Labels": {}},
            "Description": {
                "Hostname": n.hostname,
                "Resources": {
                    k: v for k, v in (("NanoCPUs", n.nano_cpus), ("MemoryBytes", n.memory_bytes)) if v is not None
                },
            },
            "Status": {"State": n.state, "Addr": n.addr},
        }
        if n.manager:
            raw["ManagerStatus"] = {"Leader": True, "Reachability": "reachable", "Addr": f"{n.addr}:2377"}
        return raw

    def _task_dict(self, t: _Task) -> dict:
        status: dict[str, Any] = {"Timestamp": t.created, "State": t.state, "Message": t.message}
        if t.err:
            status["Err"] = t.err
        if t.state in ("running", *FINAL_STATES) and t.node_id:
            status["ContainerStatus"] = {"ContainerID": f"c{t.id}", "ExitCode": t.exit_code or 0}
        return {
            "ID": t.id,
            "Version": {"Index": 1},
            "CreatedAt": t.created,
            "UpdatedAt": t.created,
            "Labels": {},
            "Spec": copy.deepcopy(t.spec),
            "ServiceID": t.service_id,
            "Slot": 1,
            "NodeID": t.node_id,
            "Status": status,
            "DesiredState": t.desired,
        }


def _plain(value: Any) -> Any:
    """docker-py's spec types are dict subclasses; the daemon sees JSON."""
    return json.loads(json.dumps(value)) if value is not None else None


def _filters(filters: dict | None) -> dict[str, list[str]]:
    """As docker-py sends them: every value a list of strings."""
    return {k: [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in (filters or {}).items()}


def _label_matches(labels: dict, wanted: str) -> bool:
    key, sep, value = wanted.partition("=")
    return key in labels and (not sep or labels[key] == value)


def _constraint_holds(node: _Node, constraint: str) -> bool:
    for op in ("==", "!="):
        key, sep, value = constraint.partition(op)
        if sep:
            key, value = key.strip(), value.strip()
            actual = {
                "node.hostname": node.hostname,
                "node.id": node.id,
                "node.role": "manager" if node.manager else "worker",
            }.get(key)
            if actual is None:
                raise NotImplementedError(f"placement constraint {constraint!r}")
            return (actual == value) == (op == "==")
    raise NotImplementedError(f"placement constraint {constraint!r}")


API_CALLS = frozenset(name for name, fn in vars(FakeDocker).items() if getattr(fn, "docker_api", False))
"""The names of FakeDocker's Docker API methods (what a step label may name)."""
