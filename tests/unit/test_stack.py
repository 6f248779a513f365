"""examples/stack: the Dockerfile and the locally built hub image agree, the stack file
holds what docs/deploy.md promises, and the local variant (devtools/stack.py) swaps in
only this machine's stand-ins. The stack itself runs in tests/integration/test_stack_swarm.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from devtools import stack, stack_images
from gpuspawner import __version__

STACK = yaml.safe_load((stack.STACK_DIR / "stack.yml").read_text())


def test_the_dockerfile_and_the_local_hub_image_say_the_same():
    settings = stack_images.dockerfile_settings(stack_images.DOCKERFILE.read_text())
    recipe = stack_images.hub_recipe()
    assert settings["from"] == f"debian:{stack_images.debian_image.SUITE}-slim"
    assert settings["packages"] == list(recipe.packages)
    # The same packages: the local image pins the jupyterhub installed here (the lowest-versions
    # run has another), the Dockerfile a release; both pin this gpuspawner.
    assert [r.split("==")[0] for r in settings["requirements"]] == [r.split("==")[0] for r in recipe.requirements]
    assert f"gpuspawner[postgres]=={__version__}" in settings["requirements"]
    assert settings["changes"] == list(recipe.changes)
    assert settings["cmd"] == list(recipe.cmd)
    assert f"python3 -m venv {recipe.venv}" in stack_images.DOCKERFILE.read_text()
    # The stack runs the image of this release.
    assert {STACK["services"][s]["image"].rsplit(":", 1)[1] for s in ("hub", "agent")} == {__version__}


def test_the_dockerfile_parser_reads_continued_lines_and_several_commands():
    text = 'FROM x\nRUN apt-get update \\\n && apt-get install -y --no-install-recommends a b \\\n && true\nCMD ["c"]\n'
    assert stack_images.dockerfile_settings(text) == {
        "from": "x",
        "packages": ["a", "b"],
        "requirements": [],
        "changes": [],
        "cmd": ["c"],
    }


def test_every_password_and_token_is_a_swarm_secret():
    hub, db = STACK["services"]["hub"], STACK["services"]["postgres"]
    assert {s["target"] for s in hub["secrets"]} == {
        "postgres_password",
        "cookie_secret",
        "proxy_auth_token",
        "admin_token",
        "login_password",
    }
    assert all(s["mode"] == 0o400 for s in hub["secrets"])
    proxy = STACK["services"]["proxy"]
    assert proxy["secrets"] == [s for s in hub["secrets"] if s["target"] == "proxy_auth_token"]
    assert "$$(cat /run/secrets/proxy_auth_token)" in proxy["command"][-1]  # $$: docker stack's escape
    assert all(STACK["secrets"][s["source"]] == {"external": True} for s in hub["secrets"] + db["secrets"])
    assert {f"gpuspawner-{n}" for n in stack.SECRETS} == set(STACK["secrets"])
    values = " ".join(str(v) for s in STACK["services"].values() for v in s.get("environment", {}).values())
    assert "PASSWORD=" not in values and "TOKEN=" not in values
    assert db["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"


def test_the_services_have_health_checks_placement_and_the_overlay_network():
    """Guards docs/upgrading.md: "The hub's service is replaced (`stop-first`: never two hubs at once)"."""
    services = STACK["services"]
    assert {n: s["deploy"]["placement"]["constraints"] for n, s in services.items()} == {
        "hub": ["node.role == manager"],
        "proxy": ["node.role == manager"],
        "postgres": ["node.labels.gpuspawner.db == true"],
        "agent": ["node.labels.gpu == true"],
    }
    assert "healthcheck" in services["hub"] and "healthcheck" in services["postgres"]
    assert all(s["networks"] == ["gpuspawner"] for s in services.values())
    assert STACK["networks"]["gpuspawner"] == {"name": "gpuspawner", "driver": "overlay", "attachable": True}
    assert services["hub"]["environment"]["GPUSPAWNER_NETWORK"] == "gpuspawner"
    assert services["agent"]["deploy"]["mode"] == "global"
    assert services["hub"]["deploy"]["update_config"]["order"] == "stop-first"
    # The proxy publishes the port and stays up while the hub restarts.
    assert "ports" not in services["hub"] and services["proxy"]["ports"][0]["published"] == 8000


def test_the_database_stops_at_once_and_cleanly_and_never_runs_twice_on_its_volume():
    """Swarm starts a stop-first update's new task once the old one has stopped, or after a
    minute regardless (swarmkit's restart supervisor): the grace must end well before.

    Guards docs/deploy.md, "How a database restart behaves": "The database's service stops
    with SIGINT, PostgreSQL's fast shutdown" and "update_config is stop-first, and the grace
    period, 30 s, is well under the minute swarm waits for an old task to stop before it
    starts the new one regardless"."""
    db = STACK["services"]["postgres"]
    assert db["stop_signal"] == "SIGINT"
    assert db["stop_grace_period"] == "30s"
    assert db["deploy"]["update_config"]["order"] == "stop-first"
    assert db["deploy"]["replicas"] == 1 and db["volumes"] == ["pgdata:/var/lib/postgresql/data"]


def test_the_local_stack_swaps_in_only_this_machines_stand_ins(tmp_path):
    (tmp_path / "swarm").mkdir()
    (tmp_path / "swarm" / "daemon.json").write_text("{}")
    cluster = SimpleNamespace(manager_url="unix:///run/x/manager.sock", state_dir=tmp_path / "swarm")
    images = {"hub": "h:1", "postgres": "p:1", "server": "s:1"}
    local = stack.local_stack(cluster, tmp_path, images, Path("/lib-dir"), Path("/gpus"))
    hub, proxy, db, agent = (local["services"][n] for n in ("hub", "proxy", "postgres", "agent"))
    assert (hub["image"], proxy["image"], db["image"], agent["image"]) == ("h:1", "h:1", "p:1", "h:1")
    assert hub["deploy"]["placement"]["constraints"] == proxy["deploy"]["placement"]["constraints"]
    assert hub["deploy"]["placement"]["constraints"] == ["node.hostname == gpu-a"]
    assert hub["volumes"] == ["/run/x/manager.sock:/var/run/docker.sock"]
    assert hub["environment"]["GPUSPAWNER_SERVER_IMAGE"] == "s:1"
    assert agent["environment"]["FAKE_NVML_DEVICES"] == "/opt/gpus/{{.Node.Hostname}}.txt"
    assert json.loads((tmp_path / "docker-etc" / "daemon.json").read_text()) == {}
    # The rest is the file as users get it.
    for name in ("hub", "proxy", "postgres", "agent"):
        for key in ("secrets", "networks", "healthcheck", "ports", "stop_signal", "stop_grace_period"):
            assert local["services"][name].get(key) == STACK["services"][name].get(key), (name, key)
        assert local["services"][name]["deploy"].get("update_config") == STACK["services"][name]["deploy"].get(
            "update_config"
        )
    command = STACK["services"]["agent"]["command"]
    interval = command.index("--interval") + 1
    assert agent["command"] == command[:interval] + ["2"] + command[interval + 1 :]  # reports come faster
    assert {k: v for k, v in hub["environment"].items() if k in STACK["services"]["hub"]["environment"]} == {
        k: v for k, v in STACK["services"]["hub"]["environment"].items() if k != "GPUSPAWNER_SERVER_IMAGE"
    } | {"GPUSPAWNER_SERVER_IMAGE": "s:1"}
    assert local["networks"] == STACK["networks"] and local["secrets"] == STACK["secrets"]


def stack_config(monkeypatch, secrets_dir: Path, **env):
    from tests.unit.test_examples import load_config

    return load_config(
        stack.STACK_DIR / "jupyterhub_config.py", monkeypatch, GPUSPAWNER_SECRETS_DIR=str(secrets_dir), **env
    )


def write_secrets(folder: Path, skip: str = "") -> dict[str, str]:
    values = {name.replace("-", "_"): "ab" * 32 for name in stack.SECRETS if name.replace("-", "_") != skip}
    folder.mkdir(exist_ok=True)
    for name, value in values.items():
        (folder / name).write_text(value + "\n")
    return values


def test_the_stack_config_reads_every_secret_and_the_environment(monkeypatch, tmp_path):
    write_secrets(tmp_path)
    (tmp_path / "postgres_password").write_text("p@ss:word\n")
    c = stack_config(
        monkeypatch, tmp_path, GPUSPAWNER_SERVER_CONSTRAINTS="node.labels.jupyter == true, node.role == worker"
    )
    assert c.JupyterHub.db_url == "postgresql+psycopg://jupyterhub:p%40ss%3Aword@postgres:5432/jupyterhub"
    assert c.GPUSwarmSpawner.gpu_db_url == c.JupyterHub.db_url  # the ledger shares the hub's database
    assert c.JupyterHub.cookie_secret == bytes.fromhex("ab" * 32)
    assert c.ConfigurableHTTPProxy.auth_token == "ab" * 32
    assert c.JupyterHub.services == [{"name": "gpuspawner-admin", "api_token": "ab" * 32}]
    assert c.JupyterHub.hub_connect_ip == "hub" and c.GPUSwarmSpawner.network_name == "gpuspawner"
    # The proxy is a service of its own; servers reach the hub's API through it.
    assert c.ConfigurableHTTPProxy.should_start is False
    assert c.ConfigurableHTTPProxy.api_url == "http://proxy:8001"
    assert c.Spawner.hub_connect_url == "http://proxy:8000"
    assert c.GPUSwarmSpawner.use_internal_ip is True and c.GPUSwarmSpawner.extra_endpoint_spec == {"mode": "dnsrr"}
    assert c.GPUSwarmSpawner.extra_placement_spec == {
        "constraints": ["node.labels.jupyter == true", "node.role == worker"]
    }
    assert c.JupyterHub.cleanup_servers is False
    assert c.GPUSwarmSpawner.gpu_inventory_source == ["agent"]


def test_the_stack_config_can_keep_the_ledger_elsewhere(monkeypatch, tmp_path):
    write_secrets(tmp_path)
    c = stack_config(monkeypatch, tmp_path, GPUSPAWNER_LEDGER_URL="postgresql+psycopg://jupyterhub@db2:5432/ledger")
    assert c.GPUSwarmSpawner.gpu_db_url == f"postgresql+psycopg://jupyterhub:{'ab' * 32}@db2:5432/ledger"


def test_a_missing_secret_stops_the_hub_with_its_name(monkeypatch, tmp_path):
    write_secrets(tmp_path, skip="cookie_secret")
    with pytest.raises(SystemExit, match=f"the swarm secret cookie_secret is missing \\({tmp_path}/cookie_secret\\)"):
        stack_config(monkeypatch, tmp_path)


def test_the_alerts_name_metrics_the_hub_serves():
    from gpuspawner import metrics

    alerts = yaml.safe_load((stack.STACK_DIR / "alerts.yml").read_text())
    exprs = " ".join(rule["expr"] for group in alerts["groups"] for rule in group["rules"])
    named = set(re.findall(r"\bgpuspawner_[a-z_]+", exprs))
    served = {name for name, _ in metrics._GAUGES} | {
        f"{m._name}_total" for m in (metrics.DOUBLE_BOOKINGS, metrics.REFUSED)
    }
    assert named and named <= served, named - served


def test_the_refusals_alert_leaves_out_access_and_budget_refusals():
    """Those are the rules working, not GPUs missing: the alert names the other reasons only."""
    alerts = yaml.safe_load((stack.STACK_DIR / "alerts.yml").read_text())
    (expr,) = [r["expr"] for g in alerts["groups"] for r in g["rules"] if r["alert"] == "GPURefusalsHigh"]
    reasons = set(re.search(r'reason=~"([^"]+)"', expr)[1].split("|"))
    source = (Path(__file__).resolve().parents[2] / "gpuspawner" / "spawn" / "spawner.py").read_text()
    used = set(re.findall(r'REFUSED\.labels\("(\w+)"', source))  # access, budget
    used |= set(re.findall(r'REFUSED\.labels\("(\w+)" if exc\.retry else "(\w+)"', source)[0])  # capacity, request
    assert reasons == {"capacity", "request"} and reasons | {"access", "budget"} == used


def test_stack_up_tells_the_admin_where_everything_is(tmp_path):
    nodes = {"gpu-b": SimpleNamespace(docker_url="unix:///run/x/gpu-b.sock")}
    cluster = SimpleNamespace(manager_url="unix:///run/x/manager.sock", nodes=nodes)
    text = stack.guide(cluster, tmp_path, "http://10.0.0.2:8000")
    folder = tmp_path / "secrets"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert all((folder / name).stat().st_mode & 0o777 == 0o600 for name in stack.SECRETS)
    password = (folder / "login-password").read_text()
    assert f"http://10.0.0.2:8000  any user name, password {password}" in text
    assert f"--token-file {folder}/admin-token" in text
    assert "DOCKER_HOST=unix:///run/x/manager.sock docker stack services gpuspawner" in text
    assert f"DOCKER_HOST=unix:///run/x/gpu-b.sock examples/stack/database.sh backup {tmp_path}/backup.sql" in text
    assert f"database.sh restore {tmp_path}/backup.sql" in text and "gpuspawner_hub=0" in text
    assert "python -m devtools.stack down" in text


def test_readme_gives_the_stacks_address_on_the_local_swarm():
    from devtools.swarm import lifecycle, netns

    hub_node = lifecycle.DEFAULT_WORKERS.index(stack.HUB_NODE)
    cluster = SimpleNamespace(nodes={stack.HUB_NODE: SimpleNamespace(addr=netns.worker_addr(hub_node))})
    text = " ".join((stack.REPO / "docs" / "tutorial.md").read_text().split())
    assert f"Its hub is at the proxy's node, {stack.hub_url(cluster)}," in text


class FakeSwarm:
    """The docker SDK objects devtools.stack.down reads and removes, as a deployed stack has
    them: its four services, a user's server on its network, its secrets, labels and volume."""

    def __init__(self):
        self.net = SimpleNamespace(name="gpuspawner", id="net1", remove=lambda: None)
        stack_label = {"label": f"com.docker.stack.namespace={stack.STACK_NAME}"}
        self.services = {
            stack_label["label"]: [
                SimpleNamespace(name=f"gpuspawner_{n}") for n in ("hub", "proxy", "postgres", "agent")
            ],
            "gpuspawner.user": [self.service("jupyter-alice", "net1"), self.service("elsewhere-bob", "other")],
        }
        self.secrets = [self.named(f"gpuspawner-{n}", self.secrets_left) for n in stack.SECRETS]
        self.secrets.append(self.named("someone-elses", self.secrets_left))
        self.nodes = [self.node("gpu-a", {"gpu": "true"}), self.node("gpu-b", {"gpu": "true", "gpuspawner.db": "true"})]
        self.volumes = {"gpu-b": [self.named("gpuspawner_pgdata", lambda v: self.gone.append(v))]}
        self.gone: list[str] = []
        self.stack_removed = False

    def secrets_left(self, name):
        self.gone.append(name)

    @staticmethod
    def named(name, on_remove):
        return SimpleNamespace(name=name, remove=lambda: on_remove(name))

    def service(self, name, network):
        spec = {"Spec": {"TaskTemplate": {"Networks": [{"Target": network}]}}}
        return SimpleNamespace(name=name, attrs=spec, remove=lambda: self.gone.append(name))

    def node(self, hostname, labels):
        node = SimpleNamespace(attrs={"Description": {"Hostname": hostname}, "Spec": {"Labels": dict(labels)}})
        node.update = lambda spec: node.attrs.update(Spec=spec)
        return node

    def client(self, node=None):
        services = SimpleNamespace(
            list=lambda filters: (
                [] if self.stack_removed and "namespace" in filters["label"] else self.services[filters["label"]]
            )
        )
        nets = SimpleNamespace(list=lambda names: [] if self.stack_removed else [self.net])
        return SimpleNamespace(
            services=services,
            networks=nets,
            secrets=SimpleNamespace(list=lambda: [s for s in self.secrets if s.name not in self.gone]),
            nodes=SimpleNamespace(list=lambda: self.nodes),
            volumes=SimpleNamespace(
                list=lambda filters: [v for v in self.volumes.get(node, []) if v.name not in self.gone]
            ),
        )

    def docker(self, cluster, *args, check=True, timeout=120):
        assert args == ("stack", "rm", stack.STACK_NAME)
        self.stack_removed = True


def test_stack_down_says_what_it_removes_the_database_volume_included(monkeypatch, tmp_path, capsys):
    world = FakeSwarm()
    monkeypatch.setattr(stack, "docker", world.docker)
    monkeypatch.setattr(stack.swarm_harness, "status", lambda: (world, []))
    monkeypatch.setattr(stack.swarm_harness, "up", lambda *a: pytest.fail("down never starts the test swarm"))
    assert stack.main(["down", "--state-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "removed the gpuspawner stack's services: gpuspawner_agent, gpuspawner_hub, gpuspawner_postgres, gpuspawner_proxy",
        "removed the servers its hub started: jupyter-alice",
        "removed the overlay network gpuspawner",
        "removed the swarm secrets " + ", ".join(sorted(f"gpuspawner-{n}" for n in stack.SECRETS)),
        "removed the node labels gpu=true and gpuspawner.db=true",
        "removed the database's volume gpuspawner_pgdata on gpu-b: the hub's database and the GPU ledger",
    ]
    assert "gpuspawner_pgdata" in world.gone and "elsewhere-bob" not in world.gone and "someone-elses" not in world.gone
    assert all(n.attrs["Spec"]["Labels"] == {} for n in world.nodes)
    # Again: nothing is left to remove, and it says so.
    assert stack.main(["down", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "nothing to remove\n"


def test_stack_down_can_keep_the_database_and_leaves_a_swarm_that_is_not_up_alone(monkeypatch, tmp_path, capsys):
    world = FakeSwarm()
    monkeypatch.setattr(stack, "docker", world.docker)
    monkeypatch.setattr(stack.swarm_harness, "status", lambda: (world, []))
    assert stack.main(["down", "--keep-data", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "(kept: the database's volume gpuspawner_pgdata on gpu-b)"
    assert "gpuspawner_pgdata" not in world.gone
    monkeypatch.setattr(stack.swarm_harness, "status", lambda: (None, ["no cluster recorded in /x/state.json"]))
    monkeypatch.setattr(stack.swarm_harness, "up", lambda *a: pytest.fail("down never starts the test swarm"))
    assert stack.main(["down"]) == 0
    assert capsys.readouterr().out == (
        "the test swarm is not up (no cluster recorded in /x/state.json): nothing of the gpuspawner stack was removed\n"
    )
