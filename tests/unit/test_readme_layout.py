"""README's "How it is built" tree names every module of the package, and only
modules that exist: a split or a new module shows up there, or this fails."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def listed_modules() -> set[str]:
    text = (REPO / "README.md").read_text()
    tree = text.split("## How it is built", 1)[1].split("```", 2)[1]
    package = tree.split("gpuspawner/", 1)[1].split("\nexamples/", 1)[0]
    return set(re.findall(r"^  (\w+\.py)\s", package, re.M))


def test_the_readme_tree_lists_every_module_of_the_package():
    modules = {p.name for p in (REPO / "gpuspawner").glob("*.py")} - {"__init__.py", "_version.py"}
    listed = listed_modules()
    assert modules - listed == set(), "modules missing from README's tree"
    assert listed - modules == set(), "README's tree names modules that do not exist"
