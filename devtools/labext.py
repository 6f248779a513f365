"""gpuspawner's JupyterLab extension (labextension/), built with JupyterLab's own tooling.

    python -m devtools.labext        # build; print the wheel's path (also `make labextension`)

``npm ci`` installs the pinned JavaScript packages (package-lock.json; again only when
it changed), ``npm run build`` compiles the TypeScript and runs ``jupyter-builder`` (from
the venv's jupyterlab) into ``labextension/gpuspawner_lab/labextension``, and
``pip wheel`` makes the wheel that single-user images install
(devtools/jupyter_image.py does). About 15 s cold, 3 s after.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["LABEXT", "build", "build_js", "source_key", "unavailable_reason", "version"]

REPO = Path(__file__).resolve().parents[1]
LABEXT = REPO / "labextension"
SOURCES = ("package.json", "package-lock.json", "tsconfig.json", "pyproject.toml", "README.md")
SOURCE_DIRS = ("src", "schema", "style", "gpuspawner_lab", "jupyter-config")


class LabextError(RuntimeError):
    pass


def unavailable_reason() -> str | None:
    """Why the extension cannot be built here, or None."""
    if shutil.which("npm") is None:
        return "npm not found (apt-get install nodejs npm)"
    if shutil.which("jupyter-builder", path=str(Path(sys.executable).parent)) is None:
        return "jupyter-builder not found next to this Python (pip install -e '.[lab]')"
    return None


def version() -> str:
    """The wheel's version (pyproject.toml's)."""
    for line in (LABEXT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise LabextError("labextension/pyproject.toml names no version")


def _files() -> list[Path]:
    found = [LABEXT / name for name in SOURCES]
    for folder in SOURCE_DIRS:
        found += sorted(
            p
            for p in (LABEXT / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and "labextension" not in p.relative_to(LABEXT).parts[1:2]
        )
    return found


def source_key() -> str:
    """What the extension is made from (its built output excluded)."""
    h = hashlib.sha256()
    for path in _files():
        h.update(str(path.relative_to(LABEXT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(cmd, cwd=LABEXT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise LabextError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def build_js() -> Path:
    """The built JupyterLab extension (labextension/gpuspawner_lab/labextension)."""
    reason = unavailable_reason()
    if reason:
        raise LabextError(f"cannot build the JupyterLab extension: {reason}")
    lock, installed = LABEXT / "package-lock.json", LABEXT / "node_modules" / ".package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        _run(["npm", "ci", "--no-audit", "--no-fund"])
    _run(["npm", "run", "build"])
    return LABEXT / "gpuspawner_lab" / "labextension"


def build(dest: Path | None = None) -> Path:
    """The extension built, as a wheel in ``dest`` (default dist/); its path."""
    build_js()
    dest = dest or REPO / "dist"
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("gpuspawner_lab-*.whl"):
        old.unlink()
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest), str(LABEXT)]
    _run(pip + ["--disable-pip-version-check"])
    (wheel,) = dest.glob("gpuspawner_lab-*.whl")
    shutil.rmtree(LABEXT / "build", ignore_errors=True)  # setuptools' scratch folder
    return wheel


if __name__ == "__main__":
    try:
        print(build())
    except LabextError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
