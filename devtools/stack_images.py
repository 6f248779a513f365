"""The production stack's images for the local swarm (no registry): the hub, PostgreSQL.

    python -m devtools.stack_images build      # build both (or find them in the cache)
    python -m devtools.stack_images import     # and import them on the running swarm's workers

Recipes of devtools/debian_image.py. The hub's is examples/stack/Dockerfile made the
debootstrap way (tests/unit/test_stack_images.py checks that both name the same Debian
packages, Python requirements, settings and command), with gpuspawner from this
checkout instead of PyPI: the key covers its files, so a change rebuilds the image.
The database's is Debian's PostgreSQL with an entrypoint that starts it as the
official ``postgres`` image does for the settings the stack gives it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuspawner._version import __version__

from . import debian_image, jupyter_image, swarm

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "examples" / "stack" / "Dockerfile"
HUB_IMAGE = "gpuspawner-test/hub:latest"
POSTGRES_IMAGE = "gpuspawner-test/postgres:latest"
HUB_VENV = "/opt/gpuspawner"
POSTGRES_MAJOR = "15"  # bookworm's
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _source_key() -> str:
    """What the gpuspawner wheel is made from."""
    h = hashlib.sha256()
    files = [REPO / "setup.cfg", REPO / "pyproject.toml"]  # (README.md only describes it)
    files += sorted(p for p in (REPO / "gpuspawner").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def hub_recipe() -> debian_image.Recipe:
    return debian_image.Recipe(
        name=HUB_IMAGE,
        packages=("python3", "python3-venv", "node-configurable-http-proxy"),
        providers=("node-fast-safe-stringify",),  # node-logform's node-safe-stable-stringify
        requirements=(
            f"jupyterhub=={importlib.metadata.version('jupyterhub')}",
            f"gpuspawner[postgres]=={__version__}",
        ),
        venv=HUB_VENV,
        changes=(f"ENV PATH={HUB_VENV}/bin:{PATH}", "ENV LANG=C.UTF-8", "WORKDIR /srv/jupyterhub", "EXPOSE 8000"),
        cmd=("jupyterhub", "-f", "/etc/jupyterhub/jupyterhub_config.py"),
        wheel_source=REPO,
        source_key=_source_key(),
    )


def postgres_recipe() -> debian_image.Recipe:
    entrypoint = "/usr/local/bin/docker-entrypoint.sh"
    script = REPO / "devtools" / "stack_files" / "postgres-entrypoint.sh"
    return debian_image.Recipe(
        name=POSTGRES_IMAGE,
        packages=(f"postgresql-{POSTGRES_MAJOR}",),
        changes=(
            f"ENV PATH=/usr/lib/postgresql/{POSTGRES_MAJOR}/bin:{PATH}",
            "ENV LANG=C.UTF-8",
            "ENV PGDATA=/var/lib/postgresql/data",
        ),
        cmd=(entrypoint,),
        files=((entrypoint, script, 0o755),),
        source_key=hashlib.sha256(script.read_bytes()).hexdigest()[:16],
    )


def dockerfile_settings(text: str) -> dict:
    """What a Dockerfile like examples/stack/Dockerfile installs and sets: its Debian
    packages, pip requirements, ENV/WORKDIR/EXPOSE lines and CMD (one logical line
    per instruction, continuation lines joined)."""
    lines = re.sub(r"\\\n", " ", text).splitlines()
    settings: dict = {"packages": [], "requirements": [], "changes": [], "cmd": None, "from": None}
    for line in (x.strip() for x in lines):
        word, _, rest = line.partition(" ")
        if word == "FROM":
            settings["from"] = rest.strip()
        elif word == "RUN":
            for command in rest.split("&&"):
                args = shlex.split(command)
                if args[:3] == ["apt-get", "install", "-y"]:
                    settings["packages"] += [a for a in args[3:] if not a.startswith("-")]
                elif len(args) > 2 and args[0].endswith("/bin/pip") and args[1] == "install":
                    settings["requirements"] += [a for a in args[2:] if not a.startswith("-")]
        elif word in ("ENV", "WORKDIR", "EXPOSE"):
            settings["changes"].append(f"{word} {rest.strip()}")
        elif word == "CMD":
            settings["cmd"] = json.loads(rest)
    return settings


RECIPES = {"hub": hub_recipe, "postgres": postgres_recipe}


def ensure_on(cluster: swarm.Cluster, cache_dir: Path | str | None = None) -> dict[str, str]:
    """Both images built (or from the cache) and on the workers: {"hub": name, "postgres": name}."""
    return {what: debian_image.ensure_on(cluster, recipe(), cache_dir) for what, recipe in RECIPES.items()}


def main(argv: Sequence[str] | None = None) -> int:
    code = 0
    for recipe in RECIPES.values():
        code = code or jupyter_image.main(argv, which=recipe)
    return code


if __name__ == "__main__":
    sys.exit(main())
