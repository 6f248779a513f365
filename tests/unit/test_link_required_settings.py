"""``gpu_link_required`` checked at hub start: each malformed value stops the hub with
one line naming it, a model may be named by its alias, and the hub's allocator holds
placement to what it says.

Guards docs/topology.md, "What the admin can require": "A value the hub cannot use
stops it at start with one line naming it: a class it does not know, a count below 2, a
key that is not a model's name or "*", a model named twice (once under its alias)"."""

from __future__ import annotations

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.allocator.allocator import AllocationRefused, Request
from gpuspawner.hub.settings import GPUSettings, validate_config
from tests.unit.test_holdings import A100, World
from tests.unit.test_quota_settings import hub_config
from tests.unit.test_reclaim import TWO_GPUS


def config(required, **settings) -> Config:
    return hub_config(gpu_link_required=required, **settings)


@pytest.mark.parametrize(
    ("required", "settings", "says"),
    [
        (["nvlink"], {}, "gpu_link_required must be a mapping of GPU model (or '*') to {GPU count: link class}"),
        ({A100: {4: "nvswitch"}}, {}, f"gpu_link_required[{A100!r}][4] = 'nvswitch' is not a link class"),
        ({A100: {4: "NVLink"}}, {}, "choose one of: nvlink, switch, cpu"),
        ({A100: {1: "nvlink"}}, {}, f"gpu_link_required[{A100!r}]: 1 is not a GPU count of 2 or more (or '*')"),
        ({A100: {"4": "nvlink"}}, {}, "'4' is not a GPU count of 2 or more"),
        ({A100: {True: "nvlink"}}, {}, "True is not a GPU count"),
        ({A100: {2.0: "nvlink"}}, {}, "2.0 is not a GPU count"),
        ({A100: "nvlink"}, {}, f"gpu_link_required[{A100!r}] must map a GPU count (2 or more, or '*') to a link"),
        ({A100: {}}, {}, "must map a GPU count"),
        ({"<b>": {2: "cpu"}}, {}, "gpu_link_required: '<b>' is not a GPU model's name (or '*')"),
        ({4: {2: "cpu"}}, {}, "gpu_link_required: 4 is not a GPU model's name"),
        ({A100: {2: "cpu"}, "big": {4: "nvlink"}}, {"gpu_model_aliases": {A100: "big"}}, "names big twice"),
    ],
)
def test_a_malformed_requirement_stops_the_hub_with_one_line_naming_it(required, settings, says):
    with pytest.raises(SystemExit) as stopped:
        validate_config(config(required, **settings))
    message = str(stopped.value)
    assert message.startswith("gpuspawner configuration error: ") and "\n" not in message
    assert says in message, message
    if "gpu_model_aliases" not in settings:  # the setting's own check says the same
        with pytest.raises(TraitError, match=r"gpu_link_required"):
            GPUSettings(gpu_link_required=required)


def test_good_requirements_pass():
    validate_config(config({A100: {4: "nvlink", "*": "switch"}, "*": {2: "cpu"}}))
    validate_config(config({"big": {2: "nvlink"}}, gpu_model_aliases={A100: "big"}))
    validate_config(config({}))


def test_the_hub_holds_placement_to_it(tmp_path):
    """TWO_GPUS: two A100s whose node said nothing of their links; a pair of them may be
    required to be NVLinked, and then the hub gives none (named by its alias, too): not
    for good, as their node may yet say how they are linked."""
    w = World(tmp_path, inventory=TWO_GPUS, gpu_link_required={"big": {2: "nvlink"}}, gpu_model_aliases={A100: "big"})
    allocator = w.hub.holdings.allocator
    with pytest.raises(AllocationRefused) as refused:
        allocator.allocate("s", Request(model="big", count=2))
    assert refused.value.message == (
        "2 × big are given only as GPUs joined by NVLink, and no host has 2 such free now "
        "(gpu-b has 2 free, links not known)"
    )
    assert refused.value.status == 409
