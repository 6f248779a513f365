"""The Jupyter server image's recipe: cache keys, wheel platforms, and a cached build
that runs nothing (the build itself runs in tests/integration, where the image is used)."""

from __future__ import annotations

import json

import pytest

from devtools import jupyter_image as ji


@pytest.mark.parametrize("name, value", [("JUPYTERLAB", "jupyterlab==4.0.0"), ("IMAGE_RECIPE", -1), ("UID", 1001)])
def test_the_key_follows_the_inputs(monkeypatch, name, value):
    first = ji._key(ji._image_inputs())
    assert ji._key(ji._image_inputs()) == first  # same inputs, same key
    monkeypatch.setattr(ji, name, value)
    assert ji._key(ji._image_inputs()) != first


def test_the_base_is_kept_when_only_the_python_packages_change(monkeypatch):
    base = ji._key(ji._base_inputs())
    monkeypatch.setattr(ji, "JUPYTERLAB", "jupyterlab==4.0.0")
    assert ji._key(ji._base_inputs()) == base
    monkeypatch.setattr(ji, "DEBIAN_PACKAGES", ji.DEBIAN_PACKAGES + ("bash-completion",))
    assert ji._key(ji._base_inputs()) != base


def test_requirements_pin_the_hubs_own_jupyterhub():
    import jupyterhub

    assert f"jupyterhub=={jupyterhub.__version__}" in ji.requirements()


def test_wheel_platforms_for_a_glibc():
    plats = ji.platforms("2.36", "x86_64")
    assert plats[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in plats
    assert plats[-4:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "any"]
    assert "manylinux_2_37_x86_64" not in plats
    old = ji.platforms("2.12", "aarch64")
    assert "manylinux2014_aarch64" not in old and "manylinux2010_aarch64" in old
    with pytest.raises(ji.ImageError, match="unexpected glibc version 3.1"):
        ji.platforms("3.1", "x86_64")


def test_a_cached_image_is_returned_without_building(tmp_path, monkeypatch):
    key = ji._key(ji._image_inputs())
    (tmp_path / f"image-{key}.tar").write_bytes(b"x" * 10)
    (tmp_path / f"image-{key}.json").write_text(json.dumps({"digest": "d" * 64, "size": 10}))
    monkeypatch.setattr(ji, "_stream", lambda *a, **k: pytest.fail("nothing may run"))
    monkeypatch.setattr(ji, "unavailable_reason", lambda: "no debootstrap here")  # not needed when cached
    image = ji.build(tmp_path)
    assert image.cached and image.digest == "d" * 64 and image.tar == tmp_path / f"image-{key}.tar"


def test_a_truncated_tar_is_not_taken_from_the_cache(tmp_path, monkeypatch):
    key = ji._key(ji._image_inputs())
    (tmp_path / f"image-{key}.tar").write_bytes(b"x" * 5)
    (tmp_path / f"image-{key}.json").write_text(json.dumps({"digest": "d" * 64, "size": 10}))
    monkeypatch.setattr(ji, "unavailable_reason", lambda: "debootstrap not found")
    with pytest.raises(ji.ImageError, match="cannot build gpuspawner-test/jupyter:latest: debootstrap not found"):
        ji.build(tmp_path)
