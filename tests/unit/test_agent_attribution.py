"""The agent traces each GPU process to its container's swarm service (fake /proc and
fake dockerd lookups), and the hub's report validation takes only well-formed holders."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from gpuspawner.agent.attribution import SERVICE_LABEL, Attributor, DockerLabels, container_id
from gpuspawner.core.reports import ReportError, parse_report
from tests.unit.test_reports import device, report

CID = "4f701f36483a981eba27c31c2ce96971fea18ab9230179ef6fca70c13849e687"
OTHER = "a" * 64


def write_proc(root, pid, cgroup):
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup)


@pytest.mark.parametrize(
    "text",
    [
        f"12:memory:/docker/{CID}\n0::/docker/{CID}\n",  # cgroup v1, cgroupfs driver
        f"0::/system.slice/docker-{CID}.scope\n",  # cgroup v2, systemd driver
        f"0::/docker/{CID}/init.scope\n",  # a nested cgroup inside the container
    ],
)
def test_the_container_id_is_read_from_each_cgroup_layout(text):
    assert container_id(text) == CID


@pytest.mark.parametrize("text", ["0::/\n", "0::/user.slice/session-3.scope\n", "0::/docker/abc\n", ""])
def test_a_process_in_no_container_has_no_container_id(text):
    assert container_id(text) is None


def test_processes_get_the_service_of_their_container_and_lookups_are_cached(tmp_path):
    write_proc(tmp_path, 101, f"0::/docker/{CID}\n")
    write_proc(tmp_path, 102, f"0::/docker/{CID}\n")
    write_proc(tmp_path, 103, "0::/init.scope\n")  # on the node itself
    write_proc(tmp_path, 104, f"0::/docker/{OTHER}\n")  # a container that is no service
    asked = []

    def lookup(cid):
        asked.append(cid)
        return {SERVICE_LABEL: "jupyter-alice"} if cid == CID else {"maintainer": "x"}

    procs = [{"pid": p, "used_mib": 10} for p in (101, 102, 103, 104, 105)]  # 105: gone already
    out = Attributor(tmp_path, lookup).attribute({"devices": [{"processes": procs}]})
    holders = [p["holder"] for p in out["devices"][0]["processes"]]
    assert holders == [{"service": "jupyter-alice"}, {"service": "jupyter-alice"}, None, None, None]
    assert asked == [CID, OTHER]


def test_a_failed_lookup_is_not_remembered(tmp_path):
    write_proc(tmp_path, 7, f"0::/docker/{CID}\n")
    answers = [None, {SERVICE_LABEL: "jupyter-bob"}]
    attributor = Attributor(tmp_path, lambda cid: answers.pop(0))
    assert attributor.holder(7) is None  # dockerd did not answer
    assert attributor.holder(7) == {"service": "jupyter-bob"}


@pytest.fixture
def fake_dockerd(tmp_path):
    """A unix socket that answers like dockerd's GET /containers/ID/json."""
    path = str(tmp_path / "docker.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    requests = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                line = conn.recv(4096).decode().split("\r\n", 1)[0]
                requests.append(line)
                if f"/containers/{CID}/json" in line:
                    body = json.dumps({"Id": CID, "Config": {"Labels": {SERVICE_LABEL: "jupyter-carol"}}})
                    status = "200 OK"
                else:
                    body, status = '{"message":"No such container"}', "404 Not Found"
                conn.sendall(
                    f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}".encode()
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, requests
    server.close()


def test_labels_come_from_dockerd_over_its_socket(fake_dockerd):
    path, requests = fake_dockerd
    assert DockerLabels(path)(CID) == {SERVICE_LABEL: "jupyter-carol"}
    assert DockerLabels(path)(OTHER) is None  # 404
    assert requests == [f"GET /containers/{CID}/json HTTP/1.1", f"GET /containers/{OTHER}/json HTTP/1.1"]


def test_no_dockerd_means_no_labels(tmp_path):
    assert DockerLabels(str(tmp_path / "missing.sock"))(CID) is None


# ---- the hub's side: validation of what a node says ----


def test_the_hub_reads_each_process_with_its_service():
    procs = [
        {"pid": 101, "used_mib": 512, "holder": {"service": "jupyter-alice"}},
        {"pid": 102, "used_mib": None, "holder": None},
        {"pid": 103, "used_mib": 3},  # an older agent: no holder at all
    ]
    [dev] = parse_report(json.dumps(report(device(0, "GPU-1", processes=procs)))).devices
    assert dev.processes == 3
    assert [(p.pid, p.used_mib, p.service) for p in dev.compute] == [
        (101, 512, "jupyter-alice"),
        (102, None, None),
        (103, 3, None),
    ]


@pytest.mark.parametrize(
    "proc, field",
    [
        ({"pid": 0, "used_mib": 1}, "processes[0].pid"),
        ({"pid": "1", "used_mib": 1}, "processes[0].pid"),
        ({"used_mib": 1}, "missing 'pid'"),
        ({"pid": 1, "used_mib": -1}, "processes[0].used_mib"),
        ({"pid": 1, "holder": {"service": "a b"}}, "processes[0].holder.service"),
        ({"pid": 1, "holder": {"service": "x" * 64}}, "processes[0].holder.service"),
        ({"pid": 1, "holder": "jupyter-alice"}, "processes[0].holder: expected a JSON object"),
        ({"pid": 1, "holder": {}}, "missing 'service'"),
        (7, "processes[0]: expected a JSON object"),
    ],
)
def test_a_bad_process_is_refused_with_the_field_named(proc, field):
    body = json.dumps(report(device(0, "GPU-1", processes=[proc])))
    with pytest.raises(ReportError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_report(body)
