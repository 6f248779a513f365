"""The package's modules import each other in one direction only: no cycle,
counting imports inside functions too (they are cycles all the same, only
deferred), and the allocator and its pure siblings import neither docker nor
jupyterhub."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import gpuspawner

PACKAGE = Path(gpuspawner.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module this file imports, anywhere in it (absolute names)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)  # `from . import x` names a module
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports. A module's own parent
    packages are left out: they are imported before it in any case."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py") if "versions" not in p.parts}
    return {
        name: {m for m in imports(p) if m in files and m != name and not name.startswith(m + ".")}
        for name, p in files.items()
    }


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
PURE = [*ALLOCATOR, "sharing", "labels", "options", "inventory", "reports", "views", "ports"]


def test_the_pure_core_imports_neither_docker_nor_jupyterhub():
    assert {"allocator", "allocator_index", "allocator_refusals"} <= set(ALLOCATOR)
    for name in PURE:
        found = {m.split(".")[0] for m in imports(PACKAGE / f"{name}.py")}
        assert not found & {"docker", "jupyterhub", "dockerspawner", "tornado", "yaml"}, (name, found)


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
