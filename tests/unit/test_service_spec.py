"""The swarm service spec as data (pure, no I/O)."""

from gpuspawner.service_spec import Holding, build_service, holding_from_labels, holding_labels, visible_devices

HOLDING = Holding(
    user="alice", server="", host="gpu-b", uuids=("GPU-1", "GPU-2"), model="NVIDIA A100 80GB PCIe", port=20001
)


def spec(**kw):
    args = dict(name="jupyter-alice", image="img", command=["run"], env={"A": "1"}, holding=HOLDING)
    args.update(kw)
    return build_service(**args)


def test_visible_devices():
    assert visible_devices(("GPU-1", "GPU-2")) == "GPU-1,GPU-2"
    assert visible_devices(()) == "void"


def test_host_constraint_is_added_to_the_admins_own():
    s = spec(extra_placement={"constraints": ["node.role == worker"], "preferences": None})
    assert s["task_template"]["Placement"]["Constraints"] == ["node.role == worker", "node.hostname==gpu-b"]


def test_no_host_no_constraint():
    cpu = Holding(user="bob", server="", host="", uuids=(), model="", port=None)
    s = spec(holding=cpu)
    assert "Constraints" not in s["task_template"].get("Placement", {})
    assert s["labels"]["gpuspawner.devices"] == ""


def test_our_env_and_labels_win_over_the_admins():
    s = spec(
        env={"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2"},
        extra_container={"env": ["NVIDIA_VISIBLE_DEVICES=all", "KEEP=yes"]},
        extra_create={"labels": {"gpuspawner.devices": "GPU-9", "team": "ml"}},
    )
    env = s["task_template"]["ContainerSpec"]["Env"]
    assert "NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2" in env and "KEEP=yes" in env
    assert "NVIDIA_VISIBLE_DEVICES=all" not in env
    assert s["labels"]["gpuspawner.devices"] == "GPU-1,GPU-2"
    assert s["labels"]["team"] == "ml"


def test_published_port_only_when_asked():
    assert spec()["endpoint_spec"].get("Ports") is None
    ports = spec(publish_port=8888)["endpoint_spec"]["Ports"]
    assert ports == [{"Protocol": "tcp", "TargetPort": 8888, "PublishedPort": None}]


def test_network_and_name():
    s = spec(network="host")
    assert s["task_template"]["Networks"] == [{"Target": "host"}]
    assert s["name"] == "jupyter-alice"


def test_labels_round_trip():
    assert holding_from_labels(holding_labels(HOLDING)) == HOLDING
    assert holding_from_labels({"other": "x"}) is None


def test_swarm_does_not_restart_servers_behind_the_hubs_back():
    assert spec()["task_template"]["RestartPolicy"] == {"Condition": "none", "Delay": 0, "MaxAttempts": 0, "Window": 0}
