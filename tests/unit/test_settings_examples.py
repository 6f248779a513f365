"""Each dict-, list- or tuple-shaped setting of ``c.GPUSwarmSpawner`` shows an example in
its help (``Example::`` and an indented block, as docs/configuration.md and Sphinx render
it), and every example there is a configuration the hub takes: run against a fresh
``Config``, it passes the hub's start check and a spawner built from it holds the value."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from traitlets import Container, Dict, TraitError, TraitType, Union
from traitlets.config import Config

from devtools import configref
from gpuspawner.hub.settings import validate_config
from gpuspawner.spawn.spawner import GPUSwarmSpawner

TRAITS = GPUSwarmSpawner.class_traits(config=True)
OURS = [s.name for s in configref.settings()]


def shaped(trait: TraitType) -> bool:
    """A dict, list, set or tuple, or a union that may be one."""
    if isinstance(trait, Union):
        return any(shaped(t) for t in trait.trait_types)
    return isinstance(trait, (Dict, Container))


SHAPED = [name for name in OURS if shaped(TRAITS[name])]
EXAMPLES = [(name, i, code) for name in OURS for i, code in enumerate(configref.examples(TRAITS[name].help or ""))]


def taken(example: str) -> tuple[Config, GPUSwarmSpawner]:
    """The example run against a fresh Config, checked as the hub checks it at start
    (SystemExit naming the setting when it is bad), and a spawner configured by it
    (the traits' own checks: TraitError)."""
    c = Config()
    exec(example, {"c": c})  # noqa: S102 - the help's own example, from this tree
    validate_config(c)
    return c, GPUSwarmSpawner(config=c, user=SimpleNamespace(name="ann", id=1))


def test_every_dict_or_list_setting_shows_an_example():
    assert {"gpu_inventory", "gpu_sharing", "gpu_access", "gpu_quotas", "template_paths"} <= set(SHAPED)
    without = [name for name in SHAPED if not configref.examples(TRAITS[name].help or "")]
    assert without == [], f"settings whose help shows no Example:: block: {without}"


@pytest.mark.parametrize(("name", "index", "example"), EXAMPLES, ids=[f"{n}-{i}" for n, i, _ in EXAMPLES])
def test_each_example_is_a_configuration_the_hub_takes(name, index, example):
    assert f"c.GPUSwarmSpawner.{name} =" in example, "an example sets the setting it stands under"
    c, spawner = taken(example)
    assert name in c.GPUSwarmSpawner
    assert getattr(spawner, name) == c.GPUSwarmSpawner[name]


@pytest.mark.parametrize(
    "bad",
    [
        'c.GPUSwarmSpawner.gpu_quotas = {"lab-a": {"NVIDIA A100 80GB PCIe": 0}}',
        'c.GPUSwarmSpawner.gpu_sharing = {"NVIDIA A100 80GB PCIe": {"quantum": 2}}',
        'c.GPUSwarmSpawner.gpu_model_classes = {"empty": []}',
        'c.GPUSwarmSpawner.gpu_inventory = {"gpu-a": [{"uuid": "GPU-1", "model": "T4"}]}',
    ],
)
def test_an_example_the_hub_would_refuse_fails_the_check(bad):
    """The check the examples pass refuses a bad value, whichever of the hub's checks finds it."""
    with pytest.raises((SystemExit, TraitError)):
        taken(bad)
