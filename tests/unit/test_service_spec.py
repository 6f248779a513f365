"""The swarm service spec as data (pure, no I/O)."""

import copy
import posixpath

import pytest
from docker.types import ContainerSpec, DriverConfig, Mount, Placement, Resources, RestartPolicy, TaskTemplate
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.cluster.service_spec import (
    ENFORCEMENT_MODES,
    GUARDED_ENV,
    PINS_A_NODE,
    admin_conflicts,
    build_service,
    enforcement_mode,
    guarded_env,
    share_enforcement,
    visible_devices,
)
from gpuspawner.core.device_access import guarded_name
from gpuspawner.core.labels import Held, LabelError, parse_labels, to_labels
from gpuspawner.core.sharing import entitled_mib

HOLDING = Held(
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
    cpu = Held(user="bob", server="", host="", uuids=(), model="", port=None)
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
        spec(holding=Held(user="", server="", host="", uuids=(), model="", port=None))


def test_swarm_does_not_restart_servers_behind_the_hubs_back():
    """Guards docs/how-it-works.md, "What admin settings cannot change": "restart_policy is none"."""
    assert spec()["task_template"]["RestartPolicy"] == {"Condition": "none", "Delay": 0, "MaxAttempts": 0, "Window": 0}


# --------------------------------------------------------------------------
# Shares: labels, env and what enforces them
# --------------------------------------------------------------------------

SHARED = Held(
    user="bob",
    server="",
    host="gpu-a",
    uuids=("GPU-1", "GPU-2"),
    model="NVIDIA A100 80GB PCIe",
    port=None,
    milli=(600, 600),
)


def test_shares_label():
    assert spec(holding=SHARED)["labels"]["gpuspawner.shares"] == "0.6,0.6"
    assert "gpuspawner.shares" not in spec()["labels"]


def test_admin_labels_cannot_fake_shares():
    """Guards docs/how-it-works.md, "What admin settings cannot change": "the service's name, one
    replica, the gpuspawner.* labels"."""
    s = spec(holding=HOLDING, extra_create={"labels": {"gpuspawner.shares": "0.1", "team": "ml"}})
    assert "gpuspawner.shares" not in s["labels"] and s["labels"]["team"] == "ml"
    assert not parse_labels(s["labels"]).shared  # read back whole, as it is
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
        "GPUSPAWNER_GPU_MEMORY_MIB": "57344,49152",
        "GPUSPAWNER_GPU_ISOLATION": "none",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.6",
    }
    assert mounts == []


def test_each_share_carries_the_memory_it_comes_with_in_mib_as_the_hub_measures_it():
    for mode in ENFORCEMENT_MODES:  # whatever enforces it
        env, _ = share_enforcement(mode, (700, 333), (81920, 16160))
        assert env["GPUSPAWNER_GPU_MEMORY_MIB"] == "57344,5381"  # rounded down, as entitled_mib
        assert env["GPUSPAWNER_GPU_MEMORY_MIB"].split(",") == [
            str(entitled_mib(81920, 700)),
            str(entitled_mib(16160, 333)),
        ]
    env, _ = share_enforcement("none", (500, 500), (81920, 0))  # a device whose memory the hub does not know
    assert "GPUSPAWNER_GPU_MEMORY_MIB" not in env and env["GPUSPAWNER_GPU_SHARES"] == "0.5,0.5"


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


@pytest.mark.parametrize(
    "args, kw, message",
    [
        (("vgpu", (500,), (8192,)), {}, "Unknown GPU share enforcement 'vgpu'; choose one of: none, mps, hami"),
        (("mps", (500,), ()), {}, "1 shares for 0 devices"),
        (("hami", (500,), (8192,)), {"hami_library": "libvgpu.so"}, "must be an absolute path"),
        (("mps", (500,), (8192,)), {"mps_pipe_dir": "mps"}, "must be an absolute path"),
    ],
)
def test_bad_enforcement_settings(args, kw, message):
    with pytest.raises(ValueError) as info:
        share_enforcement(*args, **kw)
    assert message in str(info.value)


def test_enforcement_env_goes_into_the_spec():
    env, mounts = share_enforcement("hami", SHARED.milli, (81920, 81920))
    s = spec(
        holding=SHARED,
        enforcement=(env, mounts),
        mounts=["/data:/data"],
        extra_container={"env": {"LD_PRELOAD": "/evil.so"}},
    )
    container = s["task_template"]["ContainerSpec"]
    assert "LD_PRELOAD=/usr/local/vgpu/libvgpu.so" in container["Env"]
    assert "GPUSPAWNER_GPU_SHARES=0.6,0.6" in container["Env"]
    assert "GPUSPAWNER_GPU_MEMORY_MIB=49152,49152" in container["Env"]
    assert [m["Target"] for m in container["Mounts"]] == ["/data", "/usr/local/vgpu/libvgpu.so", "/tmp/vgpulock"]


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


# --------------------------------------------------------------------------
# What no admin setting changes: hostile extra_* settings, in both spellings
# --------------------------------------------------------------------------

CPU = Held(user="carol", server="", host="", uuids=(), model="", port=None)
HAMI = share_enforcement("hami", SHARED.milli, (81920, 81920))
HOLDINGS = {"gpu": (HOLDING, ({}, [])), "cpu": (CPU, ({}, [])), "shared": (SHARED, HAMI)}


def assert_guarantees(s, holding, enforcement=({}, [])):
    """Exactly our host constraint, NVIDIA_*/GPUSPAWNER_* env, enforcement
    mounts and gpuspawner.* labels; no restarts; one task, under our name."""
    task = s["task_template"]
    pins = [c for c in task.get("Placement", {}).get("Constraints", []) if PINS_A_NODE.match(c)]
    assert pins == ([f"node.hostname=={holding.host}"] if holding.host else [])
    env = dict(item.split("=", 1) for item in task["ContainerSpec"]["Env"])
    ours = guarded_env(holding, "compute,utility", enforcement[0])
    assert {k: v for k, v in env.items() if k in ours or guarded_name(k)} == ours
    assert all(k in ours or not k.startswith(GUARDED_ENV) or k.startswith(HARMLESS) for k in env)
    mounts = task["ContainerSpec"].get("Mounts", [])
    assert not [m for m in mounts if gpu_device_path(m.get("Source")) or gpu_device_path(m.get("Target"), True)]
    assert "generic" not in repr(task.get("Resources", {})).lower()
    theirs = mounts[: len(mounts) - len(enforcement[1])]
    assert mounts[len(theirs) :] == list(enforcement[1])
    assert not {m["Target"] for m in theirs} & {m["Target"] for m in enforcement[1]}
    assert {k: v for k, v in s["labels"].items() if k.startswith("gpuspawner.")} == to_labels(holding)
    assert task["RestartPolicy"] == {"Condition": "none", "Delay": 0, "MaxAttempts": 0, "Window": 0}
    assert s["name"] == "jupyter-alice" and "mode" not in s


HARMLESS = ("NVIDIA_REQUIRE_", "NVIDIA_DISABLE_REQUIRE", "NVIDIA_DRIVER_CAPABILITIES")


def gpu_device_path(path, target=False):
    """A path that is (or, as a source, holds) a GPU's device nodes."""
    if not isinstance(path, str) or not path.startswith("/"):
        return False
    path = posixpath.normpath("/" + path.lstrip("/"))
    return path.startswith(("/dev/nvidia", "/dev/dri")) or (not target and path in ("/", "/dev"))


ALL_GPUS = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all", "GPUSPAWNER_GPU_SHARES": "0.1"}
OTHER_GPUS = ["NVIDIA_VISIBLE_DEVICES=GPU-9", "NVIDIA_MIG_CONFIG_DEVICES=all", "LD_PRELOAD=/evil.so"]
ELSEWHERE = ["node.hostname==gpu-z", "NODE.HOSTNAME == gpu-b", "node.id==abc123"]
RESTART = [RestartPolicy(condition="any"), {"Condition": "on-failure"}, {"condition": "any", "max_attempts": 3}]
FAKE_LABELS = {"gpuspawner.host": "gpu-z", "gpuspawner.devices": "GPU-9", "gpuspawner.shares": "0.1"}

GENERIC = [{"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 2}}]
DEVICE_MOUNTS = [
    "/dev/nvidia0:/dev/nvidia0",
    "/dev:/host/dev:ro",
    "/srv/fake:/dev/nvidia3",
    {"Source": "//dev/./dri", "Target": "/dri", "Type": "bind"},
    {"source": "/dev/../dev/nvidia-uvm", "target": "/x", "type": "bind"},
    Mount("/gpu", "gpus", driver_config=DriverConfig("local", {"type": "none", "o": "bind", "device": "/dev"})),
]

HOSTILE = {
    # (b) devices: all for a CPU-only server, others for a GPU server
    "environment": dict(env=ALL_GPUS),
    "container env dict": dict(extra_container={"env": ALL_GPUS}),
    "container Env list": dict(extra_container={"Env": OTHER_GPUS}),
    "container mounts over ours": dict(extra_container={"mounts": ["/evil.so:/usr/local/vgpu/libvgpu.so:ro"]}),
    "container Mounts over ours": dict(
        extra_container={"Mounts": [{"Target": "/tmp/vgpulock", "Source": "/x", "Type": "bind"}]}
    ),
    "task container_spec": dict(extra_task={"container_spec": ContainerSpec(image="img", env=ALL_GPUS)}),
    "task container_spec kwargs": dict(extra_task={"container_spec": {"env": OTHER_GPUS}}),
    "task ContainerSpec": dict(extra_task={"ContainerSpec": {"Env": ALL_GPUS, "Image": "img"}}),
    "create task_template": dict(
        extra_create={
            "task_template": TaskTemplate(
                container_spec=ContainerSpec(image="img", env=OTHER_GPUS),
                placement=ELSEWHERE,
                restart_policy=RestartPolicy(condition="any"),
            )
        }
    ),
    "create task_template built": dict(
        extra_create={
            "task_template": {
                "ContainerSpec": {"Env": ALL_GPUS},
                "Placement": {"Constraints": ELSEWHERE},
                "RestartPolicy": RESTART[1],
            }
        }
    ),
    # (a) the host constraint dropped or replaced
    "placement constraints": dict(extra_placement={"constraints": ELSEWHERE}),
    "placement Constraints": dict(extra_placement={"Constraints": ELSEWHERE[:1]}),
    "placement empty": dict(extra_placement=Placement(constraints=[])),
    "task placement": dict(extra_task={"placement": Placement(constraints=ELSEWHERE)}),
    "task placement list": dict(extra_task={"placement": ELSEWHERE}),
    "task placement kwargs": dict(extra_task={"placement": {"constraints": []}}),
    "task Placement": dict(extra_task={"Placement": {"Constraints": ELSEWHERE, "Preferences": []}}),
    "resources kwargs": dict(resources={"cpu_limit": 10**9, "generic_resources": {"gpu": 1}}),
    "resources generic built": dict(resources={"Reservations": {"GenericResources": GENERIC}}),
    "task resources generic": dict(extra_task={"resources": Resources(generic_resources=["NVIDIA-GPU=GPU-9"])}),
    "task Resources lower case": dict(extra_task={"Resources": {"reservations": {"genericresources": GENERIC}}}),
    # (e) device nodes mounted: by the spawner's volumes, the container spec or the task's
    "volumes of devices": dict(mounts=["/dev/nvidia1:/dev/nvidia1", Mount("/host", "/", type="bind")]),
    "container device mounts": dict(extra_container={"mounts": DEVICE_MOUNTS}),
    "container Mounts devices": dict(extra_container={"Mounts": DEVICE_MOUNTS[2:]}),
    "container MOUNTS key": dict(extra_container={"MOUNTS": DEVICE_MOUNTS[:1]}),
    "task container_spec devices": dict(extra_task={"container_spec": {"mounts": DEVICE_MOUNTS[1:3]}}),
    "resources built": dict(resources={"Limits": {"NanoCPUs": 10**9}}),
    "task resources": dict(extra_task={"resources": Resources(cpu_limit=10**9)}),
    # (c) labels, name, mode
    "create labels": dict(extra_create={"labels": FAKE_LABELS}),
    "create name": dict(extra_create={"name": "jupyter-mallory"}),
    "create mode": dict(extra_create={"mode": "global"}),
    "create mode built": dict(extra_create={"mode": {"Replicated": {"Replicas": 3}}}),
    # (d) restarts
    **{f"task restart {i}": dict(extra_task={"restart_policy": r}) for i, r in enumerate(RESTART)},
    "task RestartPolicy": dict(extra_task={"RestartPolicy": RESTART[0]}),
}


@pytest.mark.parametrize("holding", HOLDINGS)
@pytest.mark.parametrize("hostile", HOSTILE)
def test_no_admin_setting_changes_the_guarantees(hostile, holding):
    """Guards docs/security.md, "An admin (of JupyterHub, or its configuration)": "the host constraint,
    the NVIDIA_*/GPUSPAWNER_* env, the labels and the restart policy are applied last".

    Guards docs/how-it-works.md, "What admin settings cannot change": "the enforcement's env and
    mounts win"."""
    labels, enforcement = HOLDINGS[holding]
    kwargs = copy.deepcopy(HOSTILE[hostile])
    assert_guarantees(spec(holding=labels, enforcement=enforcement, **kwargs), labels, enforcement)
    assert kwargs == HOSTILE[hostile]  # the admin's settings are read, never changed


def test_admin_settings_merge_into_ours():
    """Guards docs/how-it-works.md, "What admin settings cannot change": "is merged into the others
    (your env, mounts and constraints are kept) instead of replacing them"."""
    s = spec(
        env={"JUPYTERHUB_API_TOKEN": "t"},
        mounts=["/data:/data"],
        extra_container={"env": {"KEEP": "yes", "JUPYTERHUB_API_TOKEN": "theirs"}, "user": "1000"},
        extra_placement={"constraints": ["node.role==worker"], "preferences": [("spread", "node.labels.rack")]},
        extra_task={
            "ContainerSpec": {"Env": ["ALSO=1"], "Dir": "/work"},
            "placement": ["node.labels.gpu==yes", "node.hostname==gpu-z"],
            "log_driver": {"Name": "json"},
        },
        extra_create={"labels": {"team": "ml"}},
    )
    task = s["task_template"]
    container = task["ContainerSpec"]
    assert container["Image"] == "img" and container["Args"] == ["run"]
    assert (container["User"], container["Dir"]) == ("1000", "/work")
    assert {"KEEP=yes", "ALSO=1", "JUPYTERHUB_API_TOKEN=t"} <= set(container["Env"])
    assert container["Mounts"][0]["Target"] == "/data"
    assert task["Placement"]["Constraints"] == ["node.role==worker", "node.labels.gpu==yes", "node.hostname==gpu-b"]
    assert task["Placement"]["Preferences"] == [{"Spread": {"SpreadDescriptor": "node.labels.rack"}}]
    assert task["LogDriver"] == {"Name": "json"}
    assert s["labels"]["team"] == "ml"


def test_an_admins_whole_container_spec_keeps_our_command_and_a_cpu_server_sees_no_gpu():
    s = spec(holding=CPU, extra_task={"container_spec": ContainerSpec(image="cuda", env={"KEEP": "yes"})})
    container = s["task_template"]["ContainerSpec"]
    assert (container["Image"], container["Args"]) == ("cuda", ["run"])
    assert {"KEEP=yes", "NVIDIA_VISIBLE_DEVICES=void", "A=1"} <= set(container["Env"])


ADMIN_ENV = st.dictionaries(
    st.sampled_from(
        [
            "NVIDIA_VISIBLE_DEVICES",
            "NVIDIA_DRIVER_CAPABILITIES",
            "NVIDIA_MIG_CONFIG_DEVICES",
            "NVIDIA_IMEX_CHANNELS",
            "NVIDIA_REQUIRE_CUDA",
            "GPUSPAWNER_GPU_SHARES",
            "LD_PRELOAD",
            "CUDA_DEVICE_MEMORY_LIMIT_0",
            "KEEP",
        ]
    ),
    st.sampled_from(["all", "GPU-9", "GPU-1", "void", "0.1", "/evil.so"]),
)
ANY_ENV = ADMIN_ENV | ADMIN_ENV.map(lambda env: [f"{k}={v}" for k, v in env.items()])
CONSTRAINTS = st.lists(st.sampled_from([*ELSEWHERE, "node.hostname==gpu-b", "node.role==worker"]), max_size=3)
MOUNTS = st.lists(
    st.sampled_from(["/evil.so:/usr/local/vgpu/libvgpu.so:ro", "/x:/tmp/vgpulock", "/data:/data", *DEVICE_MOUNTS])
)


def either(**fields):
    """Optional keys, each in the snake_case and the built spelling."""
    both = {}
    for key, values in fields.items():
        both[key] = both["".join(p.capitalize() for p in key.split("_"))] = values
    return st.fixed_dictionaries({}, optional=both)


RESOURCES = either(
    generic_resources=st.sampled_from([{"gpu": 1}, ["NVIDIA-GPU=GPU-9"], GENERIC]), cpu_limit=st.just(10**9)
)
CONTAINER = either(env=ANY_ENV, mounts=MOUNTS, user=st.just("1000"))
PLACEMENT = CONSTRAINTS | either(constraints=CONSTRAINTS)
TASK = either(
    container_spec=CONTAINER,
    placement=PLACEMENT,
    restart_policy=either(condition=st.sampled_from(["none", "any", "on-failure"])),
    resources=RESOURCES | st.just({"Reservations": {"GenericResources": GENERIC}}),
)
CREATE = st.fixed_dictionaries(
    {},
    optional={
        "name": st.just("jupyter-mallory"),
        "mode": st.sampled_from(["global", {"Global": {}}]),
        "task_template": TASK,
        "labels": st.dictionaries(st.sampled_from([*FAKE_LABELS, "team"]), st.sampled_from(["gpu-z", "GPU-9", "0.1"])),
    },
)


@settings(max_examples=300, deadline=None)
@given(
    holding=st.sampled_from(list(HOLDINGS)),
    env=ADMIN_ENV,
    extra_container=CONTAINER,
    extra_placement=PLACEMENT.map(lambda p: {"constraints": p} if isinstance(p, list) else p),
    extra_task=TASK,
    extra_create=CREATE,
    mounts=MOUNTS,
    resources=RESOURCES.map(lambda r: {k: v for k, v in r.items() if k.islower()}),
)
def test_guarantees_hold_for_any_admin_settings(holding, **admin):
    """Guards docs/security.md, "An admin (of JupyterHub, or its configuration)": "the host constraint,
    the NVIDIA_*/GPUSPAWNER_* env, the labels and the restart policy are applied last".

    Guards docs/how-it-works.md, "What admin settings cannot change": "Then gpuspawner's own are
    applied last"."""
    labels, enforcement = HOLDINGS[holding]
    assert_guarantees(spec(holding=labels, enforcement=enforcement, **admin), labels, enforcement)


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"environment": ALL_GPUS}, "environment sets NVIDIA_VISIBLE_DEVICES"),
        ({"extra_container_spec": {"Env": OTHER_GPUS}}, "extra_container_spec sets NVIDIA_VISIBLE_DEVICES"),
        ({"extra_container_spec": {"env": {"GPUSPAWNER_GPU_SHARES": "1"}}}, "extra_container_spec sets GPUSPAWNER_"),
        (
            {"extra_task_spec": {"container_spec": ContainerSpec(image="i", env=ALL_GPUS)}},
            "extra_task_spec container_spec sets NVIDIA_VISIBLE_DEVICES",
        ),
        ({"extra_task_spec": {"ContainerSpec": {"Env": OTHER_GPUS}}}, "extra_task_spec container_spec sets NVIDIA_"),
        (
            {"extra_placement_spec": {"constraints": ELSEWHERE[:1]}},
            "extra_placement_spec constraint 'node.hostname==gpu-z'",
        ),
        (
            {"extra_placement_spec": Placement(constraints=ELSEWHERE[2:])},
            "extra_placement_spec constraint 'node.id==abc123'",
        ),
        (
            {"extra_task_spec": {"placement": ELSEWHERE[1:2]}},
            "extra_task_spec placement constraint 'NODE.HOSTNAME == gpu-b'",
        ),
        ({"extra_task_spec": {"Placement": {"Constraints": ELSEWHERE}}}, "extra_task_spec placement constraint"),
        ({"extra_task_spec": {"restart_policy": RESTART[0]}}, "extra_task_spec restart_policy condition 'any'"),
        ({"extra_task_spec": {"RestartPolicy": RESTART[1]}}, "extra_task_spec restart_policy condition 'on-failure'"),
        ({"extra_task_spec": {"restart_policy": {"condition": "sometimes"}}}, "restart_policy condition 'sometimes'"),
        ({"extra_create_kwargs": {"name": "x"}}, "extra_create_kwargs sets 'name'"),
        ({"extra_create_kwargs": {"task_template": {}}}, "extra_create_kwargs sets 'task_template'"),
        ({"extra_create_kwargs": {"mode": "global"}}, "extra_create_kwargs sets 'mode'"),
        ({"extra_create_kwargs": {"labels": FAKE_LABELS}}, "extra_create_kwargs labels 'gpuspawner.host'"),
        ({"environment": {"NVIDIA_IMEX_CHANNELS": "all"}}, "environment sets NVIDIA_IMEX_CHANNELS"),
        ({"environment": {"NVIDIA_MIG_MONITOR_DEVICES": "all"}}, "environment sets NVIDIA_MIG_MONITOR_DEVICES"),
        ({"environment": {"NVIDIA_GDS": "enabled"}}, "environment sets NVIDIA_GDS"),
        ({"extra_resources_spec": {"generic_resources": {"gpu": 1}}}, "extra_resources_spec asks for swarm generic"),
        (
            {"extra_resources_spec": {"Reservations": {"GenericResources": GENERIC}}},
            "extra_resources_spec asks for swarm generic resources ([{'DiscreteResourceSpec'",
        ),
        (
            {"extra_task_spec": {"resources": Resources(generic_resources={"ssd": 1})}},
            "extra_task_spec resources asks for swarm generic resources",
        ),
        (
            {"extra_task_spec": {"Resources": {"reservations": {"genericresources": GENERIC}}}},
            "extra_task_spec resources asks for swarm generic resources",
        ),
        ({"extra_container_spec": {"mounts": DEVICE_MOUNTS[:1]}}, "extra_container_spec mounts source /dev/nvidia0"),
        ({"extra_container_spec": {"mounts": DEVICE_MOUNTS[1:2]}}, "extra_container_spec mounts source /dev:"),
        ({"extra_container_spec": {"mounts": DEVICE_MOUNTS[2:3]}}, "extra_container_spec mounts target /dev/nvidia3"),
        ({"extra_container_spec": {"Mounts": DEVICE_MOUNTS[3:4]}}, "extra_container_spec mounts source /dev/dri:"),
        ({"extra_container_spec": {"MOUNTS": DEVICE_MOUNTS[4:5]}}, "mounts source /dev/nvidia-uvm"),
        ({"extra_container_spec": {"mounts": DEVICE_MOUNTS[5:]}}, "extra_container_spec mounts volume device /dev:"),
        ({"extra_container_spec": {"mounts": ["/:/host:ro"]}}, "extra_container_spec mounts source /:"),
        (
            {"extra_task_spec": {"container_spec": {"mounts": DEVICE_MOUNTS[:1]}}},
            "extra_task_spec container_spec mounts source /dev/nvidia0",
        ),
        ({"volumes": {"/dev/nvidia0": "/dev/nvidia0"}}, "volumes mounts source /dev/nvidia0"),
        ({"extra_container_spec": {"mounts": 0}}, "extra_container_spec is not a spec docker-py can build"),
        ({"extra_task_spec": {"force_update": "x"}}, "extra_task_spec is not a spec docker-py can build"),
        ({"volumes": {"/data": {"bind": "/dev/nvidiactl"}}}, "volumes mounts target /dev/nvidiactl"),
        ({"read_only_volumes": {"/dev/dri/renderD128": "/dri"}}, "read_only_volumes mounts source /dev/dri/renderD128"),
    ],
)
def test_settings_that_could_only_conflict_are_named(settings, named):
    """Guards docs/security.md, "An admin (of JupyterHub, or its configuration)": "a setting that could
    only conflict stops the hub at start with one line", "set any other NVIDIA_* variable", "mount a
    GPU's device nodes" and "ask for swarm generic resources, of any kind".

    Guards docs/how-it-works.md, "What admin settings cannot change": "A setting that could only
    conflict with these is refused by validate_config(c) at hub start, with one line naming it"."""
    problems = admin_conflicts(settings)
    assert problems and named in problems[0] and all("\n" not in p for p in problems)


def test_settings_that_merge_are_not_conflicts():
    """Guards docs/how-it-works.md, "What admin settings cannot change": "Everything else is overridden
    only where it overlaps"."""
    assert (
        admin_conflicts(
            {
                "environment": {"KEEP": "yes", "LD_PRELOAD": "/usr/lib/libtcmalloc.so", **HARMLESS_ENV},
                "volumes": {"jupyterhub-user-{username}": "/home/jovyan", "/dev/shm": "/dev/shm"},
                "read_only_volumes": {"/data/nvidia": {"bind": "/data", "mode": "ro"}},
                "extra_container_spec": {
                    "env": {"CUDA_VISIBLE_DEVICES": "0"},
                    "user": "1000",
                    "mounts": ["nvidia-cache:/cache", "/dev/null:/etc/motd", "/srv/devices:/devices"],
                },
                "extra_placement_spec": {"constraints": ["node.role==worker", "node.hostname!=gpu-z"]},
                "extra_task_spec": {
                    "restart_policy": RestartPolicy(condition="none"),
                    "placement": ["node.labels.a==b"],
                },
                "extra_create_kwargs": {"labels": {"team": "ml"}, "endpoint_spec": {}},
                "extra_resources_spec": {"cpu_limit": 1, "mem_limit": "4G"},
            }
        )
        == []
    )
    assert admin_conflicts({"extra_create_kwargs": lambda spawner: {"name": "x"}}) == []  # checked once evaluated


HARMLESS_ENV = {
    "NVIDIA_REQUIRE_CUDA": "cuda>=12.0",
    "NVIDIA_REQUIRE_DRIVER": "driver>=535",
    "NVIDIA_DISABLE_REQUIRE": "1",
    "NVIDIA_DRIVER_CAPABILITIES": "all",
}


@pytest.mark.parametrize("holding", HOLDINGS)
def test_harmless_nvidia_env_reaches_the_container_and_ours_still_wins(holding):
    """Guards docs/security.md, "An admin (of JupyterHub, or its configuration)": "they can only narrow
    what a container gets" and "nor change a GPU server's NVIDIA_DRIVER_CAPABILITIES".

    Guards docs/how-it-works.md, "What admin settings cannot change": "except the ones that can only
    narrow what a container gets"."""
    labels, enforcement = HOLDINGS[holding]
    s = spec(holding=labels, enforcement=enforcement, extra_container={"env": HARMLESS_ENV})
    env = dict(item.split("=", 1) for item in s["task_template"]["ContainerSpec"]["Env"])
    ours = guarded_env(labels, "compute,utility", enforcement[0])
    assert {k: env[k] for k in HARMLESS_ENV} == {**HARMLESS_ENV, **{k: v for k, v in ours.items() if k in HARMLESS_ENV}}
    assert env["NVIDIA_VISIBLE_DEVICES"] == visible_devices(labels.uuids)
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == ("compute,utility" if labels.uuids else "all")
