"""The package's modules import each other in one direction only: no cycle,
counting imports inside functions too (they are cycles all the same, only
deferred), and the allocator and its pure siblings import neither docker nor
jupyterhub. The graph itself is devtools.modgraph's, which also draws it in
CONTRIBUTING.md."""

from __future__ import annotations

import sys
from pathlib import Path

from devtools.modgraph import PACKAGE, graph, imports, refresh

CONTRIBUTING = Path(__file__).resolve().parents[2] / "CONTRIBUTING.md"


def test_the_package_has_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(nxt) :] + [node, nxt]))
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [])


ALLOCATOR = sorted(p.stem for p in PACKAGE.glob("allocator*.py"))
PURE = [*ALLOCATOR, "sharing", "labels", "line", "options", "inventory", "reports", "views", "ports"]


def test_the_pure_core_imports_neither_docker_nor_jupyterhub():
    assert {"allocator", "allocator_index", "allocator_refusals"} <= set(ALLOCATOR)
    for name in PURE:
        found = {m.split(".")[0] for m in imports(PACKAGE / f"{name}.py")}
        assert not found & {"docker", "jupyterhub", "dockerspawner", "tornado", "yaml"}, (name, found)


def test_contributing_md_shows_the_current_module_graph():
    text = CONTRIBUTING.read_text()
    assert refresh(text, str(CONTRIBUTING)) == text, (
        "CONTRIBUTING.md's module graph is out of date: python -m devtools.modgraph --write CONTRIBUTING.md"
    )


def test_the_allocator_needs_only_the_standard_library_and_pure_siblings():
    g = graph()
    seen, todo = set(), ["gpuspawner.allocator"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(g[name])
    assert {m.rpartition(".")[2] for m in seen} <= set(PURE), seen
    for name in seen:
        outside = {m.split(".")[0] for m in imports(PACKAGE / f"{name.rpartition('.')[2]}.py")} - {"gpuspawner"}
        assert outside <= sys.stdlib_module_names | {"__future__"}, (name, outside)
