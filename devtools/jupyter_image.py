"""The real single-user server image for the local swarm: jupyterhub-singleuser with JupyterLab.

    python -m devtools.jupyter_image build     # build (or find in the cache); print the tar
    python -m devtools.jupyter_image import    # build, then import on the running swarm's workers

A recipe of devtools/debian_image.py (a debootstrap'd Debian, a venv, ``docker import``;
no registry): Debian ``minbase`` + ``python3-venv``, and a venv at /opt/jupyter with
jupyterhub (the hub's own version, so that server and hub agree), jupyterlab, and
gpuspawner's JupyterLab extension (devtools/labext.py builds it from labextension/).

The server runs as ``jovyan`` (uid 1000): Jupyter refuses to run as root.

Cache: /var/cache/gpuspawner-image (env ``GPUSPAWNER_IMAGE_CACHE``), as debian_image
describes: cold about 3 minutes, then nothing is built while the inputs stay the same.
"""

from __future__ import annotations

import argparse
import configparser
import importlib.metadata
import sys
from collections.abc import Sequence
from pathlib import Path

from . import debian_image, labext, swarm
from .debian_image import DEFAULT_CACHE, BuiltImage, ImageError

__all__ = ["JUPYTER_IMAGE", "ImageError", "BuiltImage", "build", "ensure_on", "recipe", "unavailable_reason"]

JUPYTER_IMAGE = "gpuspawner-test/jupyter:latest"


def _lab_pin() -> str:
    """setup.cfg's ``lab`` extra: the JupyterLab the extension is built with."""
    config = configparser.ConfigParser()
    config.read(labext.REPO / "setup.cfg")
    (pin,) = config["options.extras_require"]["lab"].split()
    return pin


JUPYTERLAB = _lab_pin()
VENV = "/opt/jupyter"
USER, UID, GID = "jovyan", 1000, 100  # gid 100: Debian's "users"


def requirements() -> list[str]:
    """What the venv installs: the hub's own jupyterhub version, JupyterLab, and the
    status bar's extension (its wheel built here, see :func:`build`)."""
    return [
        f"jupyterhub=={importlib.metadata.version('jupyterhub')}",
        JUPYTERLAB,
        f"gpuspawner-lab=={labext.version()}",
    ]


def recipe() -> debian_image.Recipe:
    """The server image. It runs as ``jovyan`` (uid 1000): Jupyter refuses to run as root."""
    return debian_image.Recipe(
        name=JUPYTER_IMAGE,
        packages=("python3", "python3-venv"),
        requirements=tuple(requirements()),
        venv=VENV,
        changes=(
            f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            "ENV SHELL=/bin/bash",
            f"USER {USER}",
            f"WORKDIR /home/{USER}",
        ),
        cmd=("jupyterhub-singleuser",),
        user=(USER, UID, GID),
        # The hub's own web pages: jupyterhub-singleuser serves its templates from the package.
        drop=(f"{VENV}/share/jupyterhub",),
        wheel_source=labext.LABEXT,
        prepare=_built_extension,
        source_key=labext.source_key(),
        recipe=4,  # 3: the home made by useradd, not before it; 4: the status bar's extension
    )


def unavailable_reason() -> str | None:
    """Why the image cannot be built here (debootstrap, or the extension's npm), or None."""
    return debian_image.unavailable_reason() or labext.unavailable_reason()


def build(cache_dir: Path | str | None = None) -> BuiltImage:
    """The image as a tar, from the cache or built now (printing progress)."""
    return debian_image.build(recipe(), cache_dir)


def ensure_on(cluster: swarm.Cluster, cache_dir: Path | str | None = None) -> str:
    """Build (or reuse) the image and import it on the workers that lack it; return its
    name. Only workers get it: the local config runs servers on workers only."""
    return debian_image.ensure_on(cluster, recipe(), cache_dir)


def _built_extension() -> None:
    """The extension's JavaScript, which its wheel takes (seconds when up to date); run
    when the image is built, not when it is found in the cache."""
    try:
        labext.build_js()
    except labext.LabextError as exc:
        raise ImageError(str(exc)) from None


def main(argv: Sequence[str] | None = None, which=recipe) -> int:
    """``build`` or ``import`` the image of ``which()`` (a recipe)."""
    parser = argparse.ArgumentParser(description=(sys.modules[which.__module__].__doc__ or "").split("\n")[0])
    parser.add_argument("command", choices=["build", "import"])
    parser.add_argument("--cache-dir", default=None, help=f"default {DEFAULT_CACHE}")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            image = debian_image.build(which(), args.cache_dir)
            print(f"{image.tar} ({'cached' if image.cached else 'built'} in {image.seconds:.1f} s)")
        else:
            cluster, problems = swarm.status()
            if cluster is None or problems:
                raise ImageError("the swarm is not up: python -m devtools.swarm up")
            print(debian_image.ensure_on(cluster, which(), args.cache_dir))
    except swarm.HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
