"""The example configs load, and validate_config stops a bad one at hub start."""

import pytest
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from devtools.hub import REPO
from gpuspawner import validate_config
from gpuspawner.allocator.allocator import POLICIES


def load_config(path, monkeypatch, **env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return PyFileConfigLoader(path.name, path=str(path.parent)).load_config()


def test_example_config_loads_and_names_the_spawner(monkeypatch):
    c = load_config(
        REPO / "examples/jupyterhub_config.py", monkeypatch, GPUSPAWNER_INVENTORY=str(REPO / "examples/gpus.yaml")
    )
    assert c.JupyterHub.spawner_class == "gpuswarm"
    assert c.GPUSwarmSpawner.allocation_policy in POLICIES
    assert c.JupyterHub.cleanup_servers is False


def test_example_config_stops_on_a_missing_inventory(monkeypatch, tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SystemExit, match=rf"GPU inventory {missing}: cannot read it"):
        load_config(REPO / "examples/jupyterhub_config.py", monkeypatch, GPUSPAWNER_INVENTORY=str(missing))


def test_local_demo_config_loads(monkeypatch):
    c = load_config(REPO / "examples/local/jupyterhub_config.py", monkeypatch)
    assert c.GPUSwarmSpawner.network_name == "host"
    assert c.GPUSwarmSpawner.gpu_inventory.endswith("gpus.yaml")


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"allocation_policy": "best-fit"}, "Unknown allocation_policy 'best-fit'; choose one of: pack, spread"),
        ({"gpu_inventory": {"gpu-a": [{"uuid": "GPU-1", "model": "T4"}]}}, "gpu-a[0]: missing 'memory_mib'"),
        ({"max_gpus_per_user": -1}, "max_gpus_per_user must be a whole number"),
    ],
)
def test_validate_config_names_the_problem(settings, message):
    c = Config()
    for key, value in settings.items():
        setattr(c.GPUSwarmSpawner, key, value)
    with pytest.raises(SystemExit) as info:
        validate_config(c)
    assert message in str(info.value)


def test_validate_config_accepts_the_example_inventory():
    c = Config()
    c.GPUSwarmSpawner.gpu_inventory = str(REPO / "examples/gpus.yaml")
    validate_config(c)  # raises SystemExit if not


@pytest.mark.parametrize(
    "section, settings, message",
    [
        ("Spawner", {"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "environment sets NVIDIA_VISIBLE_DEVICES"),
        (
            "DockerSpawner",
            {"extra_container_spec": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}},
            "extra_container_spec sets NVIDIA_VISIBLE_DEVICES",
        ),
        (
            "SwarmSpawner",
            {"extra_task_spec": {"ContainerSpec": {"Env": {"GPUSPAWNER_GPU_SHARES": "1"}}}},
            "extra_task_spec container_spec sets GPUSPAWNER_GPU_SHARES",
        ),
        (
            "SwarmSpawner",
            {"extra_placement_spec": {"constraints": ["node.hostname==gpu-z"]}},
            "extra_placement_spec constraint 'node.hostname==gpu-z'",
        ),
        (
            "GPUSwarmSpawner",
            {"extra_task_spec": {"placement": {"Constraints": ["node.id == abc"]}}},
            "extra_task_spec placement constraint 'node.id == abc'",
        ),
        (
            "GPUSwarmSpawner",
            {"extra_task_spec": {"restart_policy": {"condition": "any"}}},
            "extra_task_spec restart_policy condition 'any'",
        ),
        ("DockerSpawner", {"extra_create_kwargs": {"name": "jupyter"}}, "extra_create_kwargs sets 'name'"),
        ("GPUSwarmSpawner", {"extra_create_kwargs": {"task_template": {}}}, "extra_create_kwargs sets 'task_template'"),
        (
            "GPUSwarmSpawner",
            {"extra_create_kwargs": {"labels": {"gpuspawner.devices": "GPU-1"}}},
            "extra_create_kwargs labels 'gpuspawner.devices'",
        ),
        (
            "SwarmSpawner",
            {"extra_resources_spec": {"generic_resources": {"NVIDIA-GPU": 1}}},
            "extra_resources_spec asks for swarm generic resources ({'NVIDIA-GPU': 1})",
        ),
        ("DockerSpawner", {"volumes": {"/dev/nvidia0": "/dev/nvidia0"}}, "volumes mounts source /dev/nvidia0"),
        ("DockerSpawner", {"read_only_volumes": {"/dev/dri": "/dev/dri"}}, "read_only_volumes mounts source /dev/dri"),
        (
            "SwarmSpawner",
            {"extra_container_spec": {"mounts": ["/dev:/host-dev:ro"]}},
            "extra_container_spec mounts source /dev",
        ),
        ("Spawner", {"environment": {"NVIDIA_IMEX_CHANNELS": "0"}}, "environment sets NVIDIA_IMEX_CHANNELS"),
    ],
)
def test_validate_config_refuses_settings_that_could_only_conflict(section, settings, message):
    c = Config()
    for key, value in settings.items():
        setattr(c[section], key, value)
    with pytest.raises(SystemExit) as info:
        validate_config(c)
    text = str(info.value)
    assert text.startswith("gpuspawner configuration error: ") and message in text and "\n" not in text


def test_validate_config_accepts_settings_that_merge():
    c = Config()
    c.Spawner.environment = {"KEEP": "yes", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_DRIVER_CAPABILITIES": "all"}
    c.DockerSpawner.volumes = {"jupyterhub-user-{username}": "/home/jovyan"}
    c.SwarmSpawner.extra_placement_spec = {"constraints": ["node.role==worker"]}
    c.GPUSwarmSpawner.extra_task_spec = {"restart_policy": {"condition": "none"}, "placement": ["node.labels.a==b"]}
    c.GPUSwarmSpawner.extra_create_kwargs = {"labels": {"team": "ml"}}
    validate_config(c)  # raises SystemExit if not
