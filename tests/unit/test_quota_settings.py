"""``gpu_quotas`` checked at hub start: each malformed value stops the hub with one line
naming it, and nothing is half-applied (the hub does not start); quotas that add up to
more than the GPUs there are only warn, and a running hub names them, with groups
JupyterHub does not have.

Guards docs/quotas.md, "Checked at start" (every case it lists, and the priority classes'), and "Where to see
them": "Quotas that add up to more GPUs of a model than its nodes have now, quotas of a
model no node has, and groups JupyterHub does not have are named there"."""

from __future__ import annotations

import logging

import pytest
from traitlets.config import Config

from gpuspawner.core.quotas import parse_quotas
from gpuspawner.hub.settings import validate_config
from tests.unit.test_holdings import A100, World
from tests.unit.test_reclaim import TWO_GPUS

GTX = "NVIDIA GeForce GTX 1070"


def hub_config(**settings) -> Config:
    """A hub's config with TWO_GPUS and ``settings`` of c.GPUSwarmSpawner."""
    c = Config()
    c.JupyterHub.spawner_class = "gpuspawner.GPUSwarmSpawner"
    c.GPUSwarmSpawner.gpu_inventory = TWO_GPUS
    for key, value in settings.items():
        setattr(c.GPUSwarmSpawner, key, value)
    return c


def config(quotas, **settings) -> Config:
    return hub_config(gpu_quotas=quotas, **settings)


@pytest.mark.parametrize(
    ("quotas", "settings", "says"),
    [
        (["lab-a"], {}, "gpu_quotas must be a dict"),
        ({"": {A100: 1}}, {}, "a group must be a JupyterHub group's name"),
        ({"lab-a": 4}, {}, "gpu_quotas['lab-a'] must map a GPU model to its quota"),
        ({"lab-a": {"<script>": 1}}, {}, "'<script>' is not a GPU model's name"),
        ({"lab-a": {A100: {"gpus": 1, "notice": 3}}}, {}, "unknown keys notice"),
        ({"lab-a": {A100: {"borrow": 1}}}, {}, "needs gpus"),
        ({"lab-a": {A100: 0}}, {}, "must be a number of GPUs above 0, up to 100000, got 0"),
        ({"lab-a": {A100: "2"}}, {}, "got '2'"),
        ({"lab-a": {A100: True}}, {}, "got True"),
        ({"lab-a": {A100: float("nan")}}, {}, "got nan"),
        ({"lab-a": {A100: 10**400}}, {}, "a number of about 400 digits"),
        ({"lab-a": {A100: 0.0005}}, {}, "a whole number of thousandths"),
        ({"lab-a": {A100: {"gpus": 1, "borrow": -1}}}, {}, "['borrow'] must be a number of GPUs from 0"),
        ({"lab-a": {A100: {"gpus": 1, "lend": 2}}}, {}, "lend (2) is more than the quota itself (1)"),
        ({"lab-a": {A100: {"gpus": 1, "notice_minutes": -1}}}, {}, "['notice_minutes'] must be a number from 0"),
        ({"lab-a": {A100: 1, "big": 1}}, {"gpu_model_aliases": {A100: "big"}}, "names big twice"),
        ({"lab-a": {A100: 0.5}}, {}, "is a share total (0.5 of NVIDIA A100 80GB PCIe), but gpu_sharing does not"),
        ({"lab-a": {GTX: 1}}, {}, f"names {GTX!r}, a model the inventory does not have"),
        ({}, {"gpu_priority_classes": ["exam"]}, "gpu_priority_classes must be a dict"),
        ({}, {"gpu_priority_classes": {"exam": {"groups": []}}}, "['groups'] must be a list of JupyterHub group names"),
        ({}, {"gpu_priority_classes": {"exam": {"groups": ["e"], "rank": 1.5}}}, "['rank'] must be a whole number"),
        ({}, {"gpu_priority_classes": {"exam": {"groups": ["e"], "preemptible": "no"}}}, "must be true or false"),
        ({}, {"gpu_priority_classes": {"exam": {"groups": ["e"], "level": 1}}}, "unknown keys level"),
        (
            {},
            {"gpu_priority_classes": {"a": {"groups": ["lab"]}, "b": {"groups": ["lab"]}}},
            "the group 'lab' is in both 'a' and 'b'",
        ),
    ],
)
def test_a_malformed_quota_stops_the_hub_with_one_line_naming_it(quotas, settings, says):
    with pytest.raises(SystemExit) as stopped:
        validate_config(config(quotas, **settings))
    message = str(stopped.value)
    assert message.startswith("gpuspawner configuration error: ") and "\n" not in message
    assert says in message, message


def test_good_quotas_pass_and_more_than_there_are_only_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="JupyterHub"):
        validate_config(config({"lab-a": {A100: 2}, "lab-b": {A100: {"gpus": 1, "borrow": 1, "lend": 0}}}))
    assert f"quotas of {A100} add up to 3 (lab-a 2, lab-b 1), more than the 2 there are" in caplog.text
    shared = config({"lab-a": {A100: 1.5}}, gpu_sharing={A100: {"quantum": 0.25}})
    validate_config(shared)  # a share total of a shared model
    agents = config({"lab-a": {GTX: 1}}, gpu_inventory_source=["static", "agent"])
    validate_config(agents)  # an agent may report the model later
    assert parse_quotas({"lab-a": {"big": 1}}, {A100: "big"})[0].model == "big"


def test_a_running_hub_names_quotas_it_cannot_meet_and_groups_it_does_not_have(tmp_path):
    w = World(tmp_path, inventory=TWO_GPUS, gpu_quotas={"lab-a": {A100: 2}, "ghosts": {A100: 1}, "gtx": {GTX: 1}})
    problems = w.hub.quotas.problems(lambda group: group != "ghosts")
    texts = [p for p, _ in problems]
    assert f"quotas of {A100} add up to 3 (lab-a 2, ghosts 1), more than the 2 there are" in texts
    assert f"quotas of {GTX} (gtx 1): no node has that model now" in texts
    assert "gpu_quotas names the group 'ghosts', which JupyterHub does not have" in texts
    assert all(fix for _, fix in problems)
    assert w.hub.quotas.problems(lambda group: None) == problems[:2]  # not known: not named

    def unreadable(group):
        raise RuntimeError("JupyterHub's database is away")

    # Whether a group exists could not be read: not named as missing ("could not find out").
    assert [p for p, _ in w.hub.quotas.problems(unreadable)] == texts[:2]
