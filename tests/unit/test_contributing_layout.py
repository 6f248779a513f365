"""CONTRIBUTING.md's source tree names every module of the package, and only
modules that exist: a split or a new module shows up there, or this fails."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def listed_modules() -> set[str]:
    """The modules the tree names, as paths in the package (core/sharing.py, cli.py)."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    tree = text.split("## The source tree", 1)[1].split("```", 2)[1]
    package = tree.split("gpuspawner/", 1)[1].split("\nexamples/", 1)[0]
    listed, folder = set(), ""
    for line in package.splitlines():
        top = re.match(r"^  (\w+)(/|\.py)\s", line)
        inner = re.match(r"^    (\w+\.py)\s", line)
        if top:
            folder = top[1] if top[2] == "/" else ""
            if top[2] == ".py":
                listed.add(f"{top[1]}.py")
        elif inner and folder:
            listed.add(f"{folder}/{inner[1]}")
    return listed


def test_the_contributing_tree_lists_every_module_of_the_package():
    package = REPO / "gpuspawner"
    modules = {
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py", "_version.py") and "migrations" not in p.parts
    }
    listed = listed_modules()
    assert "core/sharing.py" in listed and "cli.py" in listed
    assert modules - listed == set(), "modules missing from CONTRIBUTING.md's tree"
    assert listed - modules == set(), "CONTRIBUTING.md's tree names modules that do not exist"


def test_make_unit_leaves_out_the_explorations_that_make_explore_and_make_test_run():
    """Guards CONTRIBUTING.md: `make unit` runs the unit tests less those marked explore; `make explore`
    runs those alone; `make test` runs everything: the unit tests less the explorations, then the
    integration tests with `make explore` beside them at the lowest CPU priority."""
    makefile = (REPO / "Makefile").read_text()

    def recipe(target: str) -> str:
        return re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.M)[1]

    assert '-m "not explore" tests/unit' in recipe("unit")
    assert "-m explore tests/unit" in recipe("explore")
    test = recipe("test")
    assert '-m "not explore" tests/unit;' in test and " tests/integration;" in test  # every test directory
    assert {p.name for p in (REPO / "tests").iterdir() if p.is_dir() and p.name.startswith(("unit", "integ"))} == {
        "unit",
        "integration",
    }
    assert "echo 19 2>/dev/null > /proc/self/autogroup; exec nice -n 19" in test  # (see the Makefile)
    assert 'sh $(MAKE) --no-print-directory explore > "$$log" 2>&1 & beside=$$!' in test
    assert test.index("& beside=") < test.index(" tests/integration;") < test.index("wait $$beside")
    assert "exit $$((unit || integration || explore))" in test  # any failing fails it
    marked = [p.name for p in (REPO / "tests" / "unit").glob("test_*.py") if "@pytest.mark.explore" in p.read_text()]
    assert len(marked) >= 4, marked
    assert "explore:" in (REPO / "setup.cfg").read_text()  # the marker is registered
