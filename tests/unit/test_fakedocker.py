"""The fake Docker API behaves as the swarm manager does, seen through the real Swarm seam."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import docker.errors
import pytest
import requests

from gpuspawner.cluster.service_spec import build_service, visible_devices
from gpuspawner.cluster.swarm import TASK_FAILED, Swarm, SwarmError
from gpuspawner.core.labels import Held
from tests.fakedocker import FakeDocker, api_error

HOLDING = Held(user="alice", server="", host="gpu-b", uuids=("GPU-1", "GPU-2"), model="A100", port=None)


def service(name="jupyter-alice", holding=HOLDING, **kw):
    env = {"NVIDIA_VISIBLE_DEVICES": visible_devices(holding.uuids)}
    return build_service(name=name, image="img", command=["run"], env=env, holding=holding, **kw)


@pytest.fixture
def fake():
    return FakeDocker(nodes=["manager", "gpu-a", "gpu-b"])


def run(coro_fn, fake):
    """Run ``coro_fn(swarm)`` against the fake through a real thread pool, as the hub does."""

    async def main():
        with ThreadPoolExecutor(2) as pool:
            return await coro_fn(Swarm(fake, pool))

    return asyncio.run(main())


def test_nodes_read_as_the_swarm_reads_them(fake):
    fake.set_node("gpu-a", state="down")
    fake.set_node("gpu-b", availability="drain")
    nodes = {n.hostname: n for n in run(lambda s: s.nodes(), fake)}
    assert list(nodes) == ["manager", "gpu-a", "gpu-b"]
    assert nodes["manager"].schedulable and nodes["manager"].addr == "10.0.0.1"
    assert not nodes["gpu-a"].ready and nodes["gpu-b"].availability == "drain"
    assert len({n.id for n in nodes.values()}) == 3 and all(len(n.id) == 25 for n in nodes.values())


def test_a_service_from_its_creation_to_its_tasks_end(fake):
    async def scenario(swarm: Swarm):
        created = await swarm.create_service(**service())
        [task] = await swarm.tasks("jupyter-alice")
        assert task["Status"]["State"] == "new" and task["ServiceID"] == created["ID"]
        assert task["NodeID"] == fake._node("gpu-b").id  # the hostname constraint placed it
        fake.run_all()
        [task] = await swarm.tasks(created["ID"])  # by ID as well as by name
        assert task["Status"]["State"] == "running" and task["DesiredState"] == "running"
        [listed] = await swarm.services("gpuspawner.devices")
        assert listed["Spec"]["Labels"]["gpuspawner.devices"] == "GPU-1,GPU-2"

        assert await swarm.remove_service("jupyter-alice") is True
        assert await swarm.services("gpuspawner.devices") == []
        with pytest.raises(SwarmError) as gone:
            await swarm.tasks("jupyter-alice")
        assert gone.value.not_found
        # The container still runs: by id, the task is still there.
        [lingering] = await swarm._call("tasks", filters={"id": [task["ID"]]})
        assert lingering["Status"]["State"] == "running" and lingering["DesiredState"] == "shutdown"
        assert fake.running_containers() == {task["ID"]: ("jupyter-alice", "gpu-b", "GPU-1,GPU-2")}
        assert not await swarm.wait_tasks_ended([task["ID"]], timeout=0)

        fake.exit_container(task["ID"])
        [ended] = await swarm._call("tasks", filters={"id": [task["ID"]]})
        assert ended["Status"]["State"] == "shutdown" and ended["Status"]["State"] in TASK_FAILED
        assert fake.running_containers() == {}
        fake.reap()
        assert await swarm._call("tasks", filters={"id": [task["ID"]]}) == []
        assert await swarm.wait_tasks_ended([task["ID"]], timeout=0)
        assert await swarm.remove_service("jupyter-alice") is False  # a 404: already gone

    run(scenario, fake)
    assert [m for m, _, _ in fake.calls] == [
        "create_service",
        "tasks",
        "tasks",
        "services",
        "remove_service",
        "services",
        "tasks",
        "tasks",
        "tasks",
        "tasks",
        "tasks",
        "tasks",
        "remove_service",
    ]


def test_inspect_service_gives_the_published_port_and_then_404(fake):
    fake.create_service(**service(publish_port=8888))
    ports = fake.inspect_service("jupyter-alice")["Endpoint"]["Ports"]
    assert ports == [{"PublishMode": "ingress", "Protocol": "tcp", "PublishedPort": 30000, "TargetPort": 8888}]
    fake.remove_service("jupyter-alice")
    with pytest.raises(docker.errors.NotFound) as exc:
        fake.inspect_service("jupyter-alice")
    assert exc.value.status_code == 404 and exc.value.response.status_code == 404


def test_env_is_read_from_the_container_spec(fake):
    fake.create_service(**service())
    [(name, host, devices)] = fake.running_containers().values()
    assert (name, host, devices) == ("jupyter-alice", "gpu-b", "GPU-1,GPU-2")
    assert fake.inspect_service("jupyter-alice")["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"] == "img"


def test_a_second_service_of_the_same_name_is_a_409(fake):
    fake.create_service(**service())
    with pytest.raises(SwarmError) as exc:
        run(lambda s: s.create_service(**service()), fake)
    assert exc.value.status == 409 and not exc.value.not_found
    assert isinstance(exc.value.__cause__, docker.errors.APIError)
    assert fake.service_names() == ["jupyter-alice"]


def test_without_a_host_the_first_worker_runs_it_and_without_a_node_it_waits(fake):
    cpu = Held(user="bob", server="", host="", uuids=(), model="", port=None)
    fake.create_service(**service("jupyter-bob", cpu))
    assert fake.running_containers()[fake.task_ids("jupyter-bob")[0]] == ("jupyter-bob", "gpu-a", "void")

    fake.set_node("gpu-b", state="down")
    fake.create_service(**service())
    [task_id] = fake.task_ids("jupyter-alice")
    [task] = fake.tasks(filters={"id": task_id})
    assert task["Status"]["State"] == "pending" and "no suitable node" in task["Status"]["Err"]
    fake.run_all()
    assert fake.tasks(filters={"id": task_id})[0]["Status"]["State"] == "pending"
    fake.set_node("gpu-b", state="ready")
    fake.run_all()
    assert fake.tasks(filters={"id": task_id})[0]["Status"]["State"] == "running"


def test_task_failures_and_exits_carry_their_reason(fake):
    fake.create_service(**service())
    [task_id] = fake.task_ids("jupyter-alice")
    fake.advance(task_id, "preparing")
    assert (
        fake.tasks(filters={"service": "jupyter-alice", "desired-state": "running"})[0]["Status"]["State"]
        == "preparing"
    )
    fake.fail(task_id, "rejected", "invalid mount config")
    status = fake.tasks(filters={"id": [task_id]})[0]["Status"]
    assert (status["State"], status["Err"]) == ("rejected", "invalid mount config")
    assert fake.running_containers() == {}
    with pytest.raises(ValueError):
        fake.advance(task_id, "sleeping")


def test_a_container_that_exits_by_itself(fake):
    fake.create_service(**service())
    [task_id] = fake.task_ids("jupyter-alice")
    fake.run_all()
    fake.exit_container(task_id, exit_code=137)
    status = fake.tasks(filters={"service": "jupyter-alice"})[0]["Status"]
    assert status["State"] == "failed" and "137" in status["Err"]
    fake.reap()  # the service still exists: its task stays
    assert fake.task_ids("jupyter-alice") == [task_id]


def test_injected_faults(fake):
    fake.create_service(**service())
    fake.fail_next("remove_service", status=500, message="raft: no leader")
    with pytest.raises(SwarmError) as exc:
        run(lambda s: s.remove_service("jupyter-alice"), fake)
    assert exc.value.status == 500 and "no leader" in str(exc.value)
    assert fake.service_names() == ["jupyter-alice"]  # not done

    fake.fail_next("remove_service", status=None, applied=True)  # done, but the answer was lost
    with pytest.raises(SwarmError) as exc:
        run(lambda s: s.remove_service("jupyter-alice"), fake)
    assert exc.value.status is None and fake.service_names() == []

    fake.unreachable = True
    with pytest.raises(SwarmError, match="cannot reach"):
        run(lambda s: s.nodes(), fake)
    with pytest.raises(requests.ConnectionError):
        fake.tasks(filters={"id": ["x"]})
    fake.unreachable = False
    assert len(run(lambda s: s.nodes(), fake)) == 3


def test_what_it_does_not_model_is_refused_loudly(fake):
    with pytest.raises(NotImplementedError):
        fake.tasks(filters={"label": "x"})
    with pytest.raises(NotImplementedError):
        fake.create_service(**service(extra_placement={"constraints": ["node.labels.gpu==true"]}))


def test_api_error_is_what_docker_py_raises():
    assert type(api_error(404, "service x not found")) is docker.errors.NotFound
    assert type(api_error(409, "conflict")) is docker.errors.APIError
    assert api_error(500, "boom").explanation == "boom"


def test_dockerspawner_reads_the_fake_as_it_reads_a_daemon(fake):
    """SwarmSpawner's own calls (inspect_service, tasks with desired-state) against the fake."""
    from types import SimpleNamespace

    from dockerspawner import SwarmSpawner

    class Spawner(SwarmSpawner):
        _client, _executor = fake, ThreadPoolExecutor(1)  # its class-wide client and executor

    spawner = Spawner(user=SimpleNamespace(name="alice", id=1, url="/user/alice/"))

    async def scenario():
        assert await spawner.get_object() is None and spawner.object_id == ""
        fake.create_service(**service(spawner.service_name))
        fake.run_all()
        assert await spawner.poll() is None
        service_id = fake.inspect_service("jupyter-alice")["ID"]
        assert spawner.service_id == service_id
        assert (await spawner.get_task())["Status"]["State"] == "running"
        await spawner.remove_object()
        assert await spawner.poll() == 0  # dockerspawner reads the 404 as gone
        assert fake.calls_to("remove_service") == [((service_id,), {})]

    try:
        asyncio.run(scenario())
    finally:
        Spawner._executor.shutdown()
    assert ("inspect_service", ("jupyter-alice",), {}) in fake.calls


def test_a_swarm_built_from_a_connection_connects_at_its_first_call_off_the_loop_and_once(fake):
    import threading

    calls = []

    def connect():
        calls.append(threading.current_thread())
        return fake, None

    async def main():
        swarm = Swarm(connect)
        assert calls == []  # nothing at construction (configure(c) runs as the hub reads its config)
        await asyncio.gather(swarm.nodes(), swarm.nodes())
        return await swarm.nodes()

    nodes = asyncio.run(main())
    assert [n.hostname for n in nodes] == ["manager", "gpu-a", "gpu-b"]
    assert 1 <= len(calls) <= 2 and threading.main_thread() not in calls  # two racing first calls may both connect


def test_a_daemon_that_cannot_be_reached_at_the_first_call_is_a_swarm_error_and_the_next_call_tries_again(fake):
    answers = [docker.errors.DockerException("Error while fetching server API version"), (fake, None)]

    def connect():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def main():
        swarm = Swarm(connect)
        with pytest.raises(SwarmError, match="cannot reach the swarm manager"):
            await swarm.nodes()
        return await swarm.nodes()

    assert len(asyncio.run(main())) == 3
