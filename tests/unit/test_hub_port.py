"""gpuspawner/hub_port.py is the one place that touches JupyterHub's and
dockerspawner's private members: each member it lists exists in the versions
installed (CI runs this on the lowest versions setup.cfg allows and on the
newest), no other module touches one, and what it does with them works."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

import gpuspawner
from gpuspawner import hub_port
from gpuspawner.spawn.spawner import GPUSwarmSpawner
from tests.fakedocker import FakeDocker

PACKAGE = Path(gpuspawner.__file__).parent
MEMBERS = [(where, member) for where, members in hub_port.PRIVATE_MEMBERS.items() for member in members]


def _class(where: str) -> type:
    module, name = where.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("where, member", MEMBERS)
def test_each_private_member_used_exists_in_the_installed_version(where, member):
    cls = _class(where)
    # A class attribute, a method or a property; or an attribute its methods assign.
    assigned = re.search(rf"self\.{member}\s*=", inspect.getsource(cls))
    assert hasattr(cls, member) or assigned, f"{where} has no {member}: audit gpuspawner/hub_port.py"


def test_no_other_module_touches_a_private_member_of_jupyterhub_or_dockerspawner():
    members = {m for _, m in MEMBERS}
    touched = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "hub_port.py":
            continue
        text = path.read_text()
        found = {m for m in members if re.search(rf"\.{m}\b", text)}
        if "JupyterHub.instance(" in text:
            found.add("JupyterHub.instance()")
        if found:
            touched[path.relative_to(PACKAGE).as_posix()] = sorted(found)
    assert touched == {}


def fake_spawner_class():
    return type(
        "FakeSwarmSpawner", (GPUSwarmSpawner,), {"_client": FakeDocker(["manager"]), "_executor": ThreadPoolExecutor(1)}
    )


def test_the_docker_connection_is_dockerspawners_own_for_the_class():
    cls = fake_spawner_class()
    client, executor = hub_port.docker_connection(cls, Config())()
    assert client is cls._client and executor is cls._executor


def test_service_names_are_the_spawners_own():
    c = Config()
    c.GPUSwarmSpawner.prefix = "gpu"
    name_for = hub_port.service_names(GPUSwarmSpawner, c)
    named = SimpleNamespace(name="big", display_name="big", server=None, state=None)
    spawner = GPUSwarmSpawner(config=c, user=SimpleNamespace(name="ann", id=1), orm_spawner=named)
    assert name_for("ann", "big") == spawner.service_name and name_for("ann", "big").startswith("gpu-")


def test_admin_settings_are_evaluated_as_dockerspawner_would():
    spawner = GPUSwarmSpawner(
        user=SimpleNamespace(name="ann", id=1),
        extra_create_kwargs={"labels": {"owner": "{username}"}},  # a callable too, from dockerspawner 13
        volumes={"/data/{username}": "/home/jovyan/data"},
        read_only_volumes={"/datasets": "/datasets"},
    )
    settings = asyncio.run(hub_port.admin_settings(spawner))
    assert settings["extra_create_kwargs"] == {"labels": {"owner": "ann"}}
    assert settings["volumes"] == {"/data/ann": {"bind": "/home/jovyan/data", "mode": "rw"}}
    assert settings["read_only_volumes"] == {"/datasets": {"bind": "/datasets", "mode": "ro"}}


def test_no_hub_runs_in_a_test_process():
    assert hub_port.running_hub() is None
