"""The example configs load, and validate_config stops a bad one at hub start."""

import pytest
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from devtools import demo
from devtools.hub import REPO, Hub
from gpuspawner import validate_config
from gpuspawner.allocator.allocator import POLICIES, Allocator, Request
from gpuspawner.core.access import AccessRules
from gpuspawner.core.inventory_files import load_inventory


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


def test_the_demos_hub_config_passes_the_hubs_checks_on_the_demos_gpus(monkeypatch, tmp_path):
    """`make demo`'s hub: examples/local plus the demo's own lines, which come after its
    configure(c), so they are checked here as a hub start checks its settings."""
    path = Hub(tmp_path, extra_config=demo.hub_config()).write_config()
    c = load_config(path, monkeypatch)
    validate_config(c)  # raises SystemExit naming what is wrong
    assert c.GPUSwarmSpawner.gpu_sharing == demo.HUB_SETTINGS["gpu_sharing"]
    assert c.GPUSwarmSpawner.gpu_access == demo.HUB_SETTINGS["gpu_access"]
    models = {g.model for g in load_inventory(str(demo.INVENTORY))}
    assert {demo.SHARED, demo.RESERVED} <= models
    rules = AccessRules.parse(c.GPUSwarmSpawner.gpu_access, default_max_gpus=c.GPUSwarmSpawner.max_gpus_per_user)
    assert rules.unknown_models(models) == [] and set(rules.groups) <= set(c.JupyterHub.load_groups)
    # The banner: the student may have the shared model only, 1 at most; alice and bob, 1.2 of it.
    (student,) = c.JupyterHub.load_groups["students"]["users"]
    access = rules.effective(g for g, members in c.JupyterHub.load_groups.items() if student in members["users"])
    assert access.allows(demo.SHARED) and not access.allows(demo.RESERVED) and access.max_gpus == 1
    assert f"{student} is in the group students, which may have the {demo.SHARED} only, 1 at most." in demo._to_try(
        "http://hub", None
    )
    assert rules.effective([]).max_gpus >= 1.2
    assert demo.RESERVATION["group"] in c.JupyterHub.load_groups  # a reservation's group must exist


def test_the_demos_share_example_books_what_its_banner_says():
    """The banner: alice 0.2 of the shared model, then bob 1.2: one device at 0.80, one at 0.60."""
    alloc = Allocator(load_inventory(str(demo.INVENTORY)), sharing=demo.HUB_SETTINGS["gpu_sharing"])
    alloc.allocate("alice", Request(demo.SHARED, owner="alice", milli=200))
    alloc.allocate("bob", Request(demo.SHARED, owner="bob", milli=1200))
    gpus = [g.uuid for g in load_inventory(str(demo.INVENTORY)) if g.model == demo.SHARED]
    booked = sorted((sum(alloc.booked_on(uuid).values()) for uuid in gpus), reverse=True)
    assert booked == [800, 600, 0]
    assert "0.2 share of the" in demo._to_try("http://hub", None) and "at 0.80 (alice 0.2, bob 0.6), one at 0.60" in (
        demo._to_try("http://hub", None)
    )


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
