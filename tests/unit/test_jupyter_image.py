"""The images' recipes (devtools/debian_image.py): cache keys, wheel platforms, and a
cached build that runs nothing (the build itself runs in tests/integration, where the
images are used)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from devtools import debian_image as di
from devtools import jupyter_image as ji


@pytest.mark.parametrize(
    "field, value", [("requirements", ("jupyterlab==4.0.0",)), ("recipe", -1), ("user", ("jovyan", 1001, 100))]
)
def test_the_key_follows_the_inputs(field, value):
    recipe = ji.recipe()
    first = di.key(recipe.image_inputs())
    assert di.key(ji.recipe().image_inputs()) == first  # same inputs, same key
    assert di.key(dataclasses.replace(recipe, **{field: value}).image_inputs()) != first


def test_the_base_is_kept_when_only_the_python_packages_change():
    recipe = ji.recipe()
    base = di.key(recipe.base_inputs())
    assert di.key(dataclasses.replace(recipe, requirements=("jupyterlab==4.0.0",)).base_inputs()) == base
    assert di.key(dataclasses.replace(recipe, packages=(*recipe.packages, "bash-completion")).base_inputs()) != base


def test_requirements_pin_the_hubs_own_jupyterhub():
    import jupyterhub

    assert f"jupyterhub=={jupyterhub.__version__}" in ji.requirements()
    assert ji.recipe().requirements == tuple(ji.requirements())


def test_wheel_platforms_for_a_glibc():
    plats = di.platforms("2.36", "x86_64")
    assert plats[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in plats
    assert plats[-4:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "any"]
    assert "manylinux_2_37_x86_64" not in plats
    old = di.platforms("2.12", "aarch64")
    assert "manylinux2014_aarch64" not in old and "manylinux2010_aarch64" in old
    with pytest.raises(di.ImageError, match="unexpected glibc version 3.1"):
        di.platforms("3.1", "x86_64")


def test_a_cached_image_is_returned_without_building(tmp_path, monkeypatch):
    tar, meta = di.image_files(ji.recipe(), tmp_path)
    tar.write_bytes(b"x" * 10)
    meta.write_text(json.dumps({"digest": "d" * 64, "size": 10}))
    monkeypatch.setattr(di, "stream", lambda *a, **k: pytest.fail("nothing may run"))
    monkeypatch.setattr(di, "unavailable_reason", lambda: "no debootstrap here")  # not needed when cached
    image = ji.build(tmp_path)
    assert image.cached and image.digest == "d" * 64 and image.tar == tar


def test_a_truncated_tar_is_not_taken_from_the_cache(tmp_path, monkeypatch):
    tar, meta = di.image_files(ji.recipe(), tmp_path)
    tar.write_bytes(b"x" * 5)
    meta.write_text(json.dumps({"digest": "d" * 64, "size": 10}))
    monkeypatch.setattr(di, "unavailable_reason", lambda: "debootstrap not found")
    with pytest.raises(di.ImageError, match="cannot build gpuspawner-test/jupyter:latest: debootstrap not found"):
        ji.build(tmp_path)


def test_each_image_keeps_its_own_cache_files(tmp_path):
    from devtools import stack_images

    names = {
        di.image_files(r(), tmp_path)[0].name.rsplit("-", 1)[0] for r in (ji.recipe, *stack_images.RECIPES.values())
    }
    assert names == {"image-jupyter", "image-hub", "image-postgres"}
