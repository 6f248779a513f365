"""Check an installed gpuspawner (make wheel-check: the wheel in a fresh venv).

Run it with that venv's python from outside the source tree, giving the source
tree as the argument: the package must come from site-packages, carry every
template and ledger migration the source has, start its two commands, render
its spawn form and run its migrations on a new SQLite database.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import SimpleNamespace

import gpuspawner
from gpuspawner.allocator.allocator import Allocator
from gpuspawner.core.inventory import parse_inventory
from gpuspawner.ledger.ledger import Ledger
from gpuspawner.ledger.migrations import current, head
from gpuspawner.spawn.form import render_form
from gpuspawner.spawn.spawner import GPUSwarmSpawner

MODEL = "NVIDIA GeForce GTX 1070"
UUID = "GPU-5d1c6f2e-0000-4000-8000-000000000001"


def data_files(package: Path) -> set[str]:
    """The files that are data, not code found by `packages = find:`."""
    found = set()
    for folder in ("templates", "ledger/migrations"):
        found |= {
            str(p.relative_to(package))
            for p in (package / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
    return found


def main(source: Path) -> None:
    installed = Path(gpuspawner.__file__).resolve().parent
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert installed.parent == site, f"gpuspawner was imported from {installed}, not from {site}"

    missing = data_files(source / "gpuspawner") - data_files(installed)
    assert not missing, f"the wheel lacks {sorted(missing)}: add them to setup.cfg's package_data"

    for command in ("gpuspawner", "gpuspawner-agent"):
        run = subprocess.run([Path(sys.executable).parent / command, "--help"], capture_output=True, text=True)
        assert run.returncode == 0 and "usage:" in run.stdout, (command, run.returncode, run.stdout, run.stderr)

    allocator = Allocator(parse_inventory({"gpu-a": [{"uuid": UUID, "model": MODEL, "memory_mib": 8192}]}))
    # The real spawner class, made without a hub, as JupyterHub would before a spawn.
    spawner = GPUSwarmSpawner(user=SimpleNamespace(name="alice", id=1))
    cluster = SimpleNamespace(nodes={}, why_unavailable=lambda host: "")  # every host available
    form = render_form(spawner, SimpleNamespace(allocator=allocator, cluster=cluster))
    assert f'value="{MODEL}"' in form and "1 of 1 free now" in form, form

    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(f"sqlite:///{tmp}/ledger.sqlite")
        ledger.open("jupyter-alice", "alice", "", "gpu-a", MODEL, [UUID], [1000])
        assert [(r.user, r.devices) for r in ledger.open_allocations()] == [("alice", (UUID,))]
        assert current(ledger.engine) == (head(),), (current(ledger.engine), head())
        ledger.dispose()
    print(f"installed gpuspawner {gpuspawner.__version__} at {installed}: commands, form and ledger migrations work")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
