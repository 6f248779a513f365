"""The package's modules import each other in one direction only: no cycle,
counting imports inside functions too (they are cycles all the same, only
deferred), and the allocator and its pure siblings import neither docker nor
jupyterhub. The graph itself is devtools.modgraph's, which also draws it in
CONTRIBUTING.md."""

from __future__ import annotations

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


def test_the_pure_core_imports_neither_docker_nor_jupyterhub():
    pure = ["allocator", "sharing", "labels", "options", "inventory", "reports"]
    for name in pure:
        found = {m.split(".")[0] for m in imports(PACKAGE / f"{name}.py")}
        assert not found & {"docker", "jupyterhub", "dockerspawner", "tornado"}, (name, found)


def test_contributing_md_shows_the_current_module_graph():
    text = CONTRIBUTING.read_text()
    assert refresh(text, str(CONTRIBUTING)) == text, (
        "CONTRIBUTING.md's module graph is out of date: python -m devtools.modgraph --write CONTRIBUTING.md"
    )
