"""The production stack (examples/stack/stack.yml on the real test swarm, as
test_stack_swarm.py deploys it) under the faults a site meets: the proxy's task killed, the
database's service restarted while users spawn, and a backup restored after a server
started. What is checked is what users and admins meet: through the published port, in the
swarm, in the hub's log and in the ledger. Each step prints how long it took (``-s``)."""

from __future__ import annotations

import json
import threading
import time

import requests

from devtools import stack as stack_harness
from tests.integration.stack_support import (
    A100,
    DB_SERVICE,
    HUB_SERVICE,
    PROXY_SERVICE,
    RESTART_BOUND,
    TIMES,
    UUIDS,
    allocation_rows,
    container_of,
    database_sh,
    docker_time,
    holders,
    hub_answers_server,
    login,
    open_allocations,
    opened,
    stack_fixture,  # noqa: F401 - the module's stack
    task_of,
)
from tests.integration.support import services_of

# Two of the hub's reconcile rounds and a little: what it takes to stop a server it does not know.
TWO_ROUNDS = 2 * stack_harness.RECONCILE_INTERVAL + 5


def test_a_proxy_task_that_dies_leaves_every_server_reachable_within_a_minute(stack, swarm):
    """The proxy's container killed (a crash, an OOM or a node's reboot does the same): swarm
    starts a new task with a new address and no routes. The hub puts the routes back, and each
    server reaches the hub through the new proxy: an open session and a fresh login both
    answer within a minute of the proxy serving again.

    Guards docs/deploy.md, "How a proxy restart behaves": "the hub puts every route back at its
    next check of the proxy's routes" and "Measured on the test swarm"."""
    hub, state = stack
    password = stack_harness.secret_values(state)["login-password"]
    assert hub.spawn("alice", {"gpu_model": A100, "gpu_count": 1}).status_code in (201, 202)
    assert hub.spawn("bob", {}).status_code in (201, 202)
    hub.wait_ready("alice", timeout=200)
    hub.wait_ready("bob", timeout=200)
    sessions = {user: login(hub, user, password) for user in ("alice", "bob")}
    for user, session in sessions.items():
        assert session.get(hub.url + f"/user/{user}/api/status", timeout=30).status_code == 200

    proxy = swarm.client().services.get(PROXY_SERVICE)
    old = container_of(swarm, proxy)
    t0 = time.monotonic()
    old.kill()
    stack_harness.wait_serving(hub.url, 120)  # the hub's API through a new proxy task
    serving = time.monotonic()
    TIMES["proxy killed to a new proxy serving"] = serving - t0
    assert container_of(swarm, proxy).id != old.id

    def answers(user: str) -> tuple[int | str, int | str]:
        try:
            kept = sessions[user].get(hub.url + f"/user/{user}/api/status", timeout=30).status_code
        except requests.RequestException as e:
            kept = repr(e)
        return kept, opened(hub, user, password)

    for user in ("alice", "bob"):
        while (seen := answers(user)) != (200, 200):
            assert time.monotonic() - serving < RESTART_BOUND, f"{user}'s server (open session, fresh login): {seen}"
            time.sleep(1)
    TIMES["proxy killed to every server answering an open session and a fresh login"] = time.monotonic() - t0
    for user in ("alice", "bob"):
        hub.stop_server(user, timeout=120)
    assert open_allocations(swarm) == []


def db_containers(swarm) -> list:
    """Every container of the database's service on its node, running or not, oldest first."""
    found = swarm.client(stack_harness.DB_NODE).containers.list(
        all=True, filters={"label": f"com.docker.swarm.service.name={DB_SERVICE}"}
    )
    return sorted(found, key=lambda c: c.attrs["Created"])


def db_answers(container) -> bool:
    return container.exec_run(["pg_isready", "-q", "-U", "jupyterhub", "-d", "jupyterhub"]).exit_code == 0


def json_message(body: str) -> str:
    """The "message" of a JSON error body, or "" (JupyterHub and gpuspawner answer with one)."""
    try:
        return str(json.loads(body).get("message") or "")
    except (ValueError, AttributeError):
        return ""


# What PostgreSQL writes at a start that must recover from a stop that was not clean.
NOT_CLEAN = ("database system was not properly shut down", "automatic recovery in progress")


def test_a_database_restart_stops_it_cleanly_never_runs_two_and_leaves_no_server_behind(stack, swarm):
    """`docker service update --force` on the database while users spawn: the old server
    stops at its stop signal (SIGINT), at once and cleanly, before the new one starts on the
    volume; the new one starts without recovery; every spawn is answered with a server that
    runs or a refusal with its message, and a server that runs is one the hub knows, ready.

    Guards docs/deploy.md, "How a database restart behaves": "Two servers never run on the
    volume at once" and "the next start needs no recovery".

    Guards docs/reliability.md, "The production stack as a whole": "A spawn asked while the
    database is down waits for it" and "every spawn is answered with its server or a refusal"."""
    hub, state = stack
    users = [f"dbr{i}" for i in range(9)]
    for user in users:
        hub.ensure_user(user)
    [old] = [c for c in db_containers(swarm) if c.status == "running"]
    answers: dict[str, tuple[int | str, str, float]] = {}
    running_at_once: list[int] = []
    done = threading.Event()

    def spawn(i: int, user: str) -> None:  # one user's spawn, asked i × 0.6 s after the old server stopped
        time.sleep(i * 0.6)
        options = {"gpu_model": A100, "gpu_count": 1} if i % 3 == 0 else {}
        asked = time.monotonic()
        try:
            r = hub.api("POST", f"/users/{user}/server", json=options)
            answers[user] = (r.status_code, r.text, time.monotonic() - asked)
        except requests.RequestException as e:
            answers[user] = (repr(e), "", time.monotonic() - asked)

    def sample() -> None:  # the database's containers that run, every 0.2 s
        while not done.is_set():
            running_at_once.append(sum(c.status == "running" for c in db_containers(swarm)))
            time.sleep(0.2)

    # The spawns are asked over 5 s from the moment the old server has stopped, while the
    # hub cannot reach a database. (A request that is using the database at the instant
    # the old server stops fails as JupyterHub fails it: docs/reliability.md says so.)
    spawns = [threading.Thread(target=spawn, args=(i, user)) for i, user in enumerate(users)]
    sampler = threading.Thread(target=sample)
    sampler.start()
    t0, wall0 = time.monotonic(), time.time()
    stack_harness.docker(swarm, "service", "update", "--force", "--detach", DB_SERVICE)
    try:
        while (old.reload() or old.status) == "running":
            assert time.monotonic() - t0 < 60, "the old database server did not stop"
            time.sleep(0.1)
        for thread in spawns:
            thread.start()
        while True:
            new = [c for c in db_containers(swarm) if c.id != old.id and c.status == "running"]
            if new and db_answers(new[0]):
                break
            assert time.monotonic() - t0 < 120, f"the database is not back: {stack_harness.service_errors(swarm)}"
            time.sleep(0.2)
        back = time.monotonic() - t0
    finally:
        for thread in spawns:
            if thread.ident is not None:  # started
                thread.join()
        done.set()
        sampler.join()
    old.reload()
    [new] = new
    new.reload()
    stopped, started = docker_time(old.attrs["State"]["FinishedAt"]), docker_time(new.attrs["State"]["StartedAt"])
    TIMES["database restart: the old server stopped after the command"] = stopped - wall0
    TIMES["database restart: the command to the new server answering"] = back
    TIMES["database restart: the longest wait for a spawn's answer"] = max(a[2] for a in answers.values())
    assert set(answers) == set(users)
    print(f"\ndatabase restart: spawns answered {sorted((u, a[0], round(a[2], 1)) for u, a in answers.items())}")
    # SIGINT: a fast shutdown, exit 0, long before the grace (30 s) ends in a SIGKILL.
    assert old.attrs["State"]["ExitCode"] == 0, old.attrs["State"]
    assert stopped - wall0 < 15, f"the old server took {stopped - wall0:.1f} s to stop"
    assert "received fast shutdown request" in old.logs().decode()
    # One server on the volume at a time: the new one started after the old one had stopped.
    assert started >= stopped, f"the new server started {stopped - started:.1f} s before the old one stopped"
    assert max(running_at_once) == 1, running_at_once
    log = new.logs().decode()
    assert not [line for line in NOT_CLEAN if line in log], log

    if any(status == 500 for status, _, _ in answers.values()):  # what the hub met, for the failure below
        print(stack_harness.hub_log(swarm, 600))
    try:
        check_each_spawn(hub, swarm, users, answers)
    finally:
        hub.stop_all_servers()
    assert all(services_of(swarm, user) == [] for user in users)
    assert open_allocations(swarm) == []


def check_each_spawn(hub, swarm, users: list[str], answers: dict) -> None:
    """Each spawn: a server that runs, ready and known to the hub; or a refusal with its
    message and nothing left running for it."""
    deadline = time.monotonic() + 300
    for user, (status, body, _) in answers.items():
        if status in (201, 202):
            while (model := hub.server_model(user)) is not None and not model.get("ready"):
                assert time.monotonic() < deadline, f"{user}'s spawn never ended: {model}"
                time.sleep(0.5)
        else:
            assert isinstance(status, int) and status in (400, 409, 503) and json_message(body), (user, status, body)
    running = {}
    for user in users:
        model, services = hub.server_model(user), services_of(swarm, user)
        assert bool(services) == bool(model and model.get("ready")), (user, answers.get(user), model, services)
        if services:
            assert answers[user][0] in (201, 202), (user, answers[user])
            running[user] = [s.id for s in services]
    assert running, answers  # the line of spawns ran through the restart: some started
    # Two reconcile rounds: a service the hub did not know would be stopped by now.
    time.sleep(TWO_ROUNDS)
    assert {u: [s.id for s in services_of(swarm, u)] for u in users if services_of(swarm, u)} == running


def test_a_backup_restored_into_a_new_database_gives_the_hub_its_state_back(stack, swarm):
    """Guards docs/backup.md: "The restarted hub finds its servers, and who holds which GPU"
    (dump, stop the hub, drop the database, load the dump, start the hub; it serves the same
    holders and open allocations); "Servers started after the backup": "JupyterHub removes its
    route from the proxy as it starts", "so the server's own requests to the hub are refused",
    "The restarted hub stops it" and "with one WARNING in the hub's log naming its user and
    server" (erin's, started after the dump: stopped within two reconcile rounds, its ledger row
    from its service's creation to its container's exit, with its end reason)."""
    hub, state = stack
    assert hub.spawn("alice", {"gpu_model": A100, "gpu_count": 1}).status_code in (201, 202)
    hub.wait_ready("alice", timeout=200)
    before, ledger = holders(hub), open_allocations(swarm)
    assert [user for user, _, _ in ledger] == ["alice"]
    db_node, _ = task_of(swarm, swarm.client().services.get(DB_SERVICE))
    dump = state / "backup.sql"
    database_sh(swarm, db_node, "backup", str(dump))
    assert dump.stat().st_mode & 0o777 == 0o600 and "gpuspawner_allocations" in dump.read_text()
    # erin starts a server after the backup: the restored database will not have it.
    assert hub.spawn("erin", {"gpu_model": A100, "gpu_count": 1}).status_code in (201, 202)
    hub.wait_ready("erin", timeout=200)
    (erin,) = services_of(swarm, "erin")
    erin_created = docker_time(erin.attrs["CreatedAt"])
    assert hub_answers_server(swarm, erin) == "200"

    stack_harness.docker(swarm, "service", "scale", f"{HUB_SERVICE}=0", timeout=180)
    restored = database_sh(swarm, db_node, "restore", str(dump))
    assert restored.stdout.strip() == f"restored from {dump}", restored.stdout  # nothing else
    stack_harness.docker(swarm, "service", "scale", f"{HUB_SERVICE}=1", "--detach")
    stack_harness.wait_serving(hub.url, 240)
    started = time.monotonic()
    while set(hub.api("GET", "/gpuspawner/alloc-map").json()) != set(stack_harness.WORKERS):
        assert time.monotonic() - started < 120, "the agents did not report to the hub"
        time.sleep(0.5)
    assert (hub.server_model("alice") or {}).get("ready")
    assert hub.api("GET", "/users/erin").status_code == 404  # JupyterHub does not know her, nor her server
    assert "Deleting stale route /user/erin/" in stack_harness.hub_log(swarm, 5000)
    assert hub_answers_server(swarm, erin) == "403"  # its API token is not in the restored database

    # Stopped within two reconcile rounds, with one WARNING naming her server.
    while services_of(swarm, "erin"):
        assert time.monotonic() - started < TWO_ROUNDS + 60, "erin's server, unknown to the hub, still runs"
        time.sleep(1)
    TIMES["restore: the restarted hub serving to erin's unknown server stopped"] = time.monotonic() - started
    while "erin" in {u for users in holders(hub).values() for u in users}:  # once her container has exited
        assert time.monotonic() - started < TWO_ROUNDS + 120, "erin's GPU did not come back"
        time.sleep(1)
    warnings = [
        line
        for line in stack_harness.hub_log(swarm, 5000).splitlines()
        if "erin's default server" in line and "does not have" in line
    ]
    assert len(warnings) == 1 and warnings[0].startswith("[W "), warnings
    [(reason, devices, row_start, row_end)] = allocation_rows(swarm, "erin")
    assert reason == "not in the hub's database" and devices in UUIDS["gpu-b"]
    assert abs(row_start - erin_created) < 1 and row_end is not None and row_end > row_start

    assert holders(hub) == before and open_allocations(swarm) == ledger
    hub.stop_server("alice", timeout=120)
    assert open_allocations(swarm) == []
