"""The package's modules import each other in one direction only: no cycle,
counting imports inside functions too (they are cycles all the same, only
deferred); each part (a subpackage, or a module at the top) imports only parts
of lower layers (devtools.modgraph.LAYERS); the pure core and the allocator
import nothing of the hub's side, the allocator only the standard library, and
the node agent nothing of the hub. The graph is devtools.modgraph's, which also
draws the layers in CONTRIBUTING.md."""

from __future__ import annotations

import sys
from pathlib import Path

from devtools.modgraph import PACKAGE, graph, imports, layer_of, part, refresh

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


def test_every_part_of_the_package_has_a_layer_and_imports_only_lower_layers():
    g = graph()
    for module, imported in g.items():
        here = part(module)
        for other in {part(m) for m in imported} - {here}:
            assert layer_of(other) < layer_of(here), f"{module} imports {other}: layer {here} may not import it"


HUB_SIDE = {
    "docker",
    "dockerspawner",
    "jupyterhub",
    "tornado",
    "sqlalchemy",
    "alembic",
    "traitlets",
    "prometheus_client",
}


def _outside_imports(module: str) -> set[str]:
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
    return {m.split(".")[0] for m in imports(path)} - {"gpuspawner"}


def test_the_pure_core_and_the_allocator_import_nothing_of_the_hubs_side():
    g = graph()
    pure = [m for m in g if part(m) in ("core", "allocator")]
    assert {"gpuspawner.allocator.allocator", "gpuspawner.core.sharing", "gpuspawner.core.options"} <= set(pure)
    for module in pure:
        assert not _outside_imports(module) & HUB_SIDE, (module, _outside_imports(module) & HUB_SIDE)


def test_the_agent_imports_nothing_of_the_hub():
    """It runs on GPU nodes: of the package, only its own modules, the pure core's
    report rules and the version."""
    g = graph()
    agent = [m for m in g if part(m) == "agent"]
    assert "gpuspawner.agent.command" in agent
    for module in agent:
        assert {part(m) for m in g[module]} <= {"agent", "core", "_version"}, (module, g[module])
        assert not _outside_imports(module) & HUB_SIDE, module


def test_contributing_md_shows_the_current_module_graph():
    text = CONTRIBUTING.read_text()
    assert refresh(text, str(CONTRIBUTING)) == text, (
        "CONTRIBUTING.md's module graph is out of date: python -m devtools.modgraph --write CONTRIBUTING.md"
    )


def test_the_allocator_needs_only_the_standard_library_and_the_pure_core():
    g = graph()
    seen, todo = set(), ["gpuspawner.allocator.allocator"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(g[name])
    assert {part(m) for m in seen} <= {"allocator", "core"}, seen
    for name in seen:
        outside = _outside_imports(name)
        assert outside <= sys.stdlib_module_names | {"__future__"}, (name, outside)


def test_the_plan_is_pure_like_the_allocator():
    """The scheduling round: the standard library, the pure core and the allocator only."""
    g = graph()
    plan = [m for m in g if part(m) == "plan"]
    assert "gpuspawner.plan.backfill" in plan
    for module in plan:
        assert {part(m) for m in g[module]} <= {"plan", "core", "allocator"}, (module, g[module])
        assert _outside_imports(module) <= sys.stdlib_module_names | {"__future__"}, module


def test_the_package_imports_itself_by_relative_imports_only():
    """So that a copy of the package imported under another name (beside this one, as a
    vendored or side-by-side copy would be) never reaches into this tree's modules."""
    import ast

    absolute = []
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts and path.name != "__init__.py":
            continue  # scripts alembic runs by their path, outside the package (env.py, versions/)
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            absolute += [f"{path.relative_to(PACKAGE)}: {n}" for n in names if n.split(".")[0] == "gpuspawner"]
    assert absolute == []
