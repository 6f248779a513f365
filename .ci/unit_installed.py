"""The unit tests against the installed gpuspawner (make wheel-check), from outside the
source tree: a copy of the repository without gpuspawner/, where the package is a link to
the one in this interpreter's site-packages, so every import and every file the tests
read is the wheel's."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path


def main(source: Path) -> int:
    installed = Path(sysconfig.get_paths()["purelib"]) / "gpuspawner"
    assert (installed / "__init__.py").exists(), f"gpuspawner is not installed in {installed.parent}"
    with tempfile.TemporaryDirectory(prefix="gpuspawner-installed-") as tmp:
        copy = Path(tmp)
        ignore = shutil.ignore_patterns(
            "__pycache__", ".venv*", "dist", "build", "*.egg-info", ".git", "*-state", "node_modules"
        )
        for entry in source.iterdir():
            if entry.name in ("gpuspawner", ".git") or entry.name.startswith(".venv") or entry.name.endswith("-state"):
                continue
            if entry.is_dir():
                shutil.copytree(entry, copy / entry.name, ignore=ignore, symlinks=True)
            else:
                shutil.copy2(entry, copy / entry.name)
        (copy / "gpuspawner").symlink_to(installed, target_is_directory=True)
        where = subprocess.run(
            [sys.executable, "-c", "import gpuspawner, os; print(os.path.realpath(gpuspawner.__file__))"],
            cwd=copy,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert where == str((installed / "__init__.py").resolve()), where
        print(f"unit tests against {installed}", flush=True)
        # The JupyterLab extension's server half is another wheel (labextension/), for
        # single-user images: `make test` runs its tests.
        # The long explorations of interleavings test the logic, not the packaging, and the
        # documentation site is built from the tree with the docs extra: `make test` runs both.
        leave_out = ["--ignore", "tests/unit/test_labextension.py", "-m", "not explore and not docs_site"]
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider", "tests/unit", *leave_out],
            cwd=copy,
        ).returncode


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
