"""Requests for any of several GPU models: ``gpu_model`` as a list (REST) or the
name of one of the admin's ``gpu_model_classes``; parsed strictly (pure), placed
by the real spawner over the fake swarm, and offered in the form."""

from __future__ import annotations

import pytest
from jupyterhub.spawner import SpawnException

from gpuspawner.core.options import OptionsError, parse_user_options
from tests.unit.test_form_template import _TreeBuilder
from tests.unit.test_holdings import A100, World, driven

GTX = "NVIDIA GeForce GTX 1070"
MODELS = [A100, GTX, "NVIDIA Tesla T4"]
CLASSES = {"any big GPU": [A100, "NVIDIA H100 80GB HBM3"], "any GPU": [A100, GTX]}


def parse(options, models=MODELS, **kw):
    return parse_user_options(
        options, models=models, hosts=["gpu-a", "gpu-b"], max_count=2, allow_host_choice=False, classes=CLASSES, **kw
    )


def test_a_list_or_a_class_asks_for_any_of_its_models():
    assert parse({"gpu_model": [A100, GTX, A100]}).models == (A100, GTX)
    assert parse({"gpu_model": "any GPU", "gpu_count": 2}).models == (A100, GTX)
    one = parse({"gpu_model": "any big GPU"})  # the H100 is not in this inventory: the A100 alone, still "any of"
    assert (one.model, one.models) == (None, (A100,))
    shared = parse({"gpu_model": "any GPU", "gpu_share": 0.5}, sharing={A100: {"quantum": 0.25}, GTX: {"quantum": 0.5}})
    assert (shared.milli, shared.models) == (500, (A100, GTX))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"gpu_model": []}, "gpu_model's list is empty; choose one of:"),
        ({"gpu_model": [A100, "NVIDIA B200"]}, "Unknown GPU model 'NVIDIA B200' in gpu_model's list; choose one of:"),
        ({"gpu_model": [A100, 7]}, "Unknown GPU model 7 in gpu_model's list"),
        ({"gpu_model": "any GPU", "gpu_wait": True}, "gpu_wait needs one GPU model, not several"),
        ({"gpu_model": "any GPU", "gpu_count": 0}, "gpu_count 0 means CPU-only"),
        ({"gpu_model": "nothing like it"}, "Unknown GPU model 'nothing like it'; choose one of: "),
    ],
)
def test_bad_lists_and_classes_are_refused_with_a_sentence(options, message):
    with pytest.raises(OptionsError) as exc:
        parse(options)
    assert str(exc.value).startswith(message)


def test_a_class_none_of_whose_models_the_user_may_use_is_refused():
    with pytest.raises(OptionsError, match="No GPU model of 'any big GPU' is offered to you right now"):
        parse({"gpu_model": "any big GPU"}, models=[GTX])


TWO_MODELS = {
    "gpu-a": [{"uuid": "GPU-a0", "model": GTX, "memory_mib": 8192}],
    "gpu-b": [{"uuid": "GPU-b0", "model": A100, "memory_mib": 81920}],
}


async def test_a_class_gets_whichever_of_its_models_is_free(tmp_path):
    w = World(tmp_path, inventory=TWO_MODELS, gpu_model_classes=CLASSES)
    await w.started(w.spawner("alice", {"gpu_model": A100}))
    bob = w.spawner("bob", {"gpu_model": "any GPU"})
    await w.started(bob)
    assert w.owner.get(bob.service_name).held.model == GTX
    with pytest.raises(SpawnException) as exc:
        await w.spawner("carol", {"gpu_model": [A100, GTX]}).start()
    assert exc.value.status_code == 409 and exc.value.message.startswith(f"None of {A100}, {GTX} is free")


async def test_a_class_is_served_around_a_line_on_a_host_its_waiters_do_not_need(tmp_path):
    """Guards docs/line.md, "Backfill": "A request for any of several models is served
    around each of their lines the same way"; and docs/rest.md, "User options": "the
    server gets one of them and does not wait in line". Carol waits for two
    A100s, which only gpu-a has (alice holds one there); the A100 on gpu-b is no use to
    her, so dave's request for any GPU gets it at once, shown to carol as served ahead of
    her; when alice stops, carol gets gpu-a."""
    import asyncio

    from gpuspawner.web.api import queue_json
    from tests.unit.test_line import until

    three = {
        "gpu-a": [{"uuid": f"GPU-a{i}", "model": A100, "memory_mib": 81920} for i in range(2)],
        "gpu-b": [
            {"uuid": "GPU-b0", "model": A100, "memory_mib": 81920},
            {"uuid": "GPU-b1", "model": GTX, "memory_mib": 8192},
        ],
    }
    w = World(tmp_path, inventory=three, gpu_model_classes=CLASSES, allow_host_choice=True, max_gpus_per_user=2)
    alice = w.spawner("alice", {"gpu_model": A100, "gpu_host": "gpu-a"})
    await w.started(alice)
    await w.started(w.spawner("bob", {"gpu_model": GTX}))
    carol = w.spawner("carol", {"gpu_model": A100, "gpu_count": 2, "gpu_wait": True})
    waiting = asyncio.ensure_future(w.started(carol))
    await until(lambda: w.hub.line.planned_host(carol.service_name) == "gpu-a")
    dave = w.spawner("dave", {"gpu_model": "any GPU"})
    await w.started(dave)
    assert w.owner.get(dave.service_name).held.host == "gpu-b"
    [row] = (await queue_json(w.hub.line))[A100]
    assert [p["user"] for p in row["passed_by"]] == ["dave"]
    await driven(alice.stop(), w.fake.exit_all)
    await waiting
    assert w.owner.get(carol.service_name).held.uuids == ("GPU-a0", "GPU-a1")


async def test_a_class_does_not_take_a_gpu_someone_waits_in_line_for(tmp_path):
    import asyncio

    from tests.unit.test_line import until

    w = World(tmp_path, inventory=TWO_MODELS, gpu_model_classes=CLASSES)
    alice = w.spawner("alice", {"gpu_model": A100})
    await w.started(alice)
    await w.started(w.spawner("bob", {"gpu_model": GTX}))
    carol = w.spawner("carol", {"gpu_model": A100, "gpu_wait": True})
    waiting = asyncio.ensure_future(w.started(carol))
    await until(lambda: w.hub.line.place(carol.service_name) == (A100, 1))
    with pytest.raises(SpawnException) as exc:  # only the GTX is free of a line, and it is taken
        await w.spawner("dave", {"gpu_model": "any GPU"}).start()
    assert GTX in exc.value.message and "None of" in exc.value.message
    await driven(alice.stop(), w.fake.exit_all)
    await waiting  # the A100 that came back went to carol, who waited for it
    assert w.owner.get(carol.service_name).held.model == A100


async def test_the_form_offers_each_class_with_its_models_free_counts(tmp_path):
    w = World(tmp_path, inventory=TWO_MODELS, gpu_model_classes=CLASSES)
    await w.started(w.spawner("alice", {"gpu_model": A100}))
    html = await w.spawner("bob")._render_options_form()
    form = _TreeBuilder()
    form.feed(html)
    [radio] = [n for n in form.root.find_all("input") if n.attrs.get("value") == "any GPU"]
    assert radio.attrs.get("data-class") == "1" and "disabled" not in radio.attrs
    helptext = " ".join(form.root.by_id(radio.attrs["aria-describedby"]).text.split())
    assert (
        helptext == f"Any of {A100}, {GTX} · 1 of 2 free now, up to 1 of one model on one host · does not wait in line"
    )
    [big] = [n for n in form.root.find_all("input") if n.attrs.get("value") == "any big GPU"]  # the H100: not here
    assert " ".join(form.root.by_id(big.attrs["aria-describedby"]).text.split()).startswith(f"Any of {A100} · 0 of 1")


async def test_a_list_from_the_rest_api_is_shown_as_no_choice_on_the_form_and_classes_take_aliases(tmp_path):
    aliases = {"NVIDIA A100-PCIE-80GB": A100}  # as NVML names it
    w = World(tmp_path, inventory=TWO_MODELS, gpu_model_classes={"big": ["NVIDIA A100-PCIE-80GB"]})
    w.config.GPUSwarmSpawner.gpu_model_aliases = aliases
    bob = w.spawner("bob", {"gpu_model": [A100, GTX]})
    assert bob.model_classes() == {"big": [A100]}
    html = await bob._render_options_form()  # the stored list selects nothing, and breaks nothing
    assert 'value="big"' in html and "checked" in html.split('id="gpu-model-none"')[1].split(">")[0]
