"""The swarm service spec as data (pure, no I/O)."""

import pytest

from gpuspawner.labels import LabelError, ServerLabels, parse_labels
from gpuspawner.service_spec import build_service, enforcement_mode, share_enforcement, visible_devices

HOLDING = ServerLabels(
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
    cpu = ServerLabels(user="bob", server="", host="", uuids=(), model="", port=None)
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


def test_the_labels_read_back_as_the_holding():
    assert parse_labels(spec()["labels"]) == HOLDING
    assert parse_labels(spec(holding=SHARED)["labels"]) == SHARED


def test_a_holding_whose_labels_would_not_read_back_makes_no_service():
    with pytest.raises(LabelError, match="gpuspawner.user"):
        spec(holding=ServerLabels(user="", server="", host="", uuids=(), model="", port=None))


def test_swarm_does_not_restart_servers_behind_the_hubs_back():
    assert spec()["task_template"]["RestartPolicy"] == {"Condition": "none", "Delay": 0, "MaxAttempts": 0, "Window": 0}


# --------------------------------------------------------------------------
# Shares: labels, env and what enforces them
# --------------------------------------------------------------------------

SHARED = ServerLabels(
    user="bob", server="", host="gpu-a", uuids=("GPU-1", "GPU-2"), model="NVIDIA A100 80GB PCIe", port=None,
    milli=(600, 600),
)


def test_shares_label():
    assert spec(holding=SHARED)["labels"]["gpuspawner.shares"] == "0.6,0.6"
    assert "gpuspawner.shares" not in spec()["labels"]


def test_admin_labels_cannot_fake_shares():
    s = spec(holding=HOLDING, extra_create={"labels": {"gpuspawner.shares": "0.1", "team": "ml"}})
    assert "gpuspawner.shares" not in s["labels"] and s["labels"]["team"] == "ml"
    assert parse_labels(s["labels"]).milli is None  # read back whole, as it is
    s = spec(holding=SHARED, extra_create={"labels": {"gpuspawner.shares": "0.1,0.1"}})
    assert s["labels"]["gpuspawner.shares"] == "0.6,0.6"


def test_whole_devices_carry_only_the_shares_env():
    env, mounts = share_enforcement("mps", (1000, 1000), (81920, 81920))
    assert env == {"GPUSPAWNER_GPU_SHARES": "1,1"} and mounts == []
    assert share_enforcement("hami", (), ()) == ({}, [])


def test_no_enforcement_gives_hints_only():
    env, mounts = share_enforcement("none", (700, 600), (81920, 81920))
    assert env == {
        "GPUSPAWNER_GPU_SHARES": "0.7,0.6",
        "GPUSPAWNER_GPU_ISOLATION": "none",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.6",
    }
    assert mounts == []


def test_mps_limits_per_device():
    env, mounts = share_enforcement("mps", (700, 600), (81920, 40960), mps_pipe_dir="/run/mps")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=57344MB,1=24576MB"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60"  # one value per client: its smallest share
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps" and env["GPUSPAWNER_GPU_ISOLATION"] == "mps"
    assert mounts == [{"Target": "/run/mps", "Source": "/run/mps", "Type": "bind", "ReadOnly": False}]
    _, mounts = share_enforcement("mps", (500,), (8192,), mps_shm_dir="/run/mps-shm")
    assert {"Target": "/dev/shm", "Source": "/run/mps-shm", "Type": "bind", "ReadOnly": False} in mounts


def test_hami_limits_per_device():
    env, mounts = share_enforcement("hami", (650, 650), (81920, 81920), hami_library="/opt/hami/libvgpu.so")
    assert env["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "53248m"
    assert env["CUDA_DEVICE_SM_LIMIT_0"] == env["CUDA_DEVICE_SM_LIMIT"] == "65"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env  # HAMi already shows the limit as the device's memory
    assert mounts == [
        {"Target": "/usr/local/vgpu/libvgpu.so", "Source": "/opt/hami/libvgpu.so", "Type": "bind", "ReadOnly": True},
        {"Target": "/tmp/vgpulock", "Source": "/tmp/vgpulock", "Type": "bind", "ReadOnly": False},
    ]


def test_small_shares_round_down_but_never_to_zero():
    env, _ = share_enforcement("hami", (5, 333), (8192, 8192))
    assert (env["CUDA_DEVICE_SM_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_1"]) == ("1", "33")
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("40m", "2727m")


@pytest.mark.parametrize("args, kw, message", [
    (("vgpu", (500,), (8192,)), {}, "Unknown GPU share enforcement 'vgpu'; choose one of: none, mps, hami"),
    (("mps", (500,), ()), {}, "1 shares for 0 devices"),
    (("hami", (500,), (8192,)), {"hami_library": "libvgpu.so"}, "must be an absolute path"),
    (("mps", (500,), (8192,)), {"mps_pipe_dir": "mps"}, "must be an absolute path"),
])
def test_bad_enforcement_settings(args, kw, message):
    with pytest.raises(ValueError) as info:
        share_enforcement(*args, **kw)
    assert message in str(info.value)


def test_enforcement_env_goes_into_the_spec():
    env, mounts = share_enforcement("hami", SHARED.milli, (81920, 81920))
    s = spec(holding=SHARED, env=env, mounts=mounts, extra_container={"env": {"LD_PRELOAD": "/evil.so"}})
    container = s["task_template"]["ContainerSpec"]
    assert "LD_PRELOAD=/usr/local/vgpu/libvgpu.so" in container["Env"]
    assert container["Mounts"][0]["Target"] == "/usr/local/vgpu/libvgpu.so"


def test_enforcement_mode_per_host():
    assert enforcement_mode("mps", "gpu-a") == "mps"
    setting = {"gpu-a": "hami", "*": "mps"}
    assert (enforcement_mode(setting, "gpu-a"), enforcement_mode(setting, "gpu-b")) == ("hami", "mps")
    assert enforcement_mode({"gpu-a": "hami"}, "gpu-b") == "none"
    with pytest.raises(ValueError, match="GPU share enforcement for 'gpu-b' is 'vgpu'; choose one of: none, mps, hami"):
        enforcement_mode({"gpu-a": "hami", "gpu-b": "vgpu"}, "gpu-a")
    with pytest.raises(ValueError, match="Unknown GPU share enforcement 'MPS'"):
        enforcement_mode("MPS", "gpu-a")
    with pytest.raises(ValueError, match="must be a mode or a mapping"):
        enforcement_mode(["mps"], "gpu-a")
