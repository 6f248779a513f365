"""The gpuspawner package's import graph, read from its source, and its layers.

The unit tests check the module graph for cycles and the layers for imports that
go up (tests/unit/test_import_graph.py); CONTRIBUTING.md shows the layers (each
subpackage, or top-level module, and what it imports) as a Mermaid flowchart
between two marker comments::

    python -m devtools.modgraph                          # print the flowchart
    python -m devtools.modgraph --write CONTRIBUTING.md  # refresh it in place

Imports inside functions count: they are dependencies all the same, only deferred.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gpuspawner"
BEGIN = "<!-- modgraph:begin (python -m devtools.modgraph --write CONTRIBUTING.md) -->"
END = "<!-- modgraph:end -->"


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


#: The layers, lowest first: a part (a subpackage, or a module at the package's top) imports
#: only parts of lower layers. Parts in one layer do not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "core"),  # pure values and rules
    ("metrics", "hub_port"),  # Prometheus collectors; the one contact with JupyterHub's internals
    ("allocator", "agent"),  # placement decisions; the node agent
    ("plan",),  # the scheduling rules: the line's serving (backfill), what reservations keep and stop
    ("cluster", "ledger"),  # the swarm seam, nodes, reports and views; the database
    ("holdings",),  # who holds what
    ("line", "reclaim"),  # the waiting line; idle reclaim
    ("hub",),  # GPUHub and the settings it is built from
    ("spawn",),  # GPUSwarmSpawner, its form and messages
    ("web",),  # the endpoints and pages
    ("hubconfig", "cli", "gpuspawner"),  # configure(c); the admin's command line; the package's public names
)


def part(module: str) -> str:
    """The layer part a module belongs to: its subpackage or top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gpuspawner"


def layer_of(name: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if name in names)


def parts_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """Part -> the other parts its modules import."""
    out: dict[str, set[str]] = {}
    for module, imported in g.items():
        out.setdefault(part(module), set()).update(part(m) for m in imported if part(m) != part(module))
    return out


def mermaid(g: dict[str, set[str]]) -> str:
    """A flowchart of the parts, importers above what they import, each with its number of
    modules; sorted, so that the same graph always prints the same text."""
    counts: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        if "versions" not in path.parts:
            counts[part(module_name(path))] = counts.get(part(module_name(path)), 0) + 1
    parts = parts_graph(g)
    lines = ["flowchart TD"]
    for name in sorted(parts):
        what = f"{name}/ ({counts[name]} modules)" if counts[name] > 1 else f"{name}.py"
        what = "__init__.py" if name == "gpuspawner" else what
        lines.append(f'    {name}["{what}"]')
    lines += [f"    {a} --> {b}" for a in sorted(parts) for b in sorted(parts[a])]
    return "\n".join(lines)


def refresh(text: str, where: str = "the text") -> str:
    """``text`` with the flowchart between the markers replaced by the current one."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{where} needs one line {BEGIN} and, after it, one line {END}")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n```mermaid\n{mermaid(graph())}\n```\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.modgraph", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", metavar="FILE", type=Path, help="refresh the flowchart between FILE's markers")
    args = parser.parse_args(argv)
    if args.write is None:
        print(mermaid(graph()))
        return 0
    try:
        args.write.write_text(refresh(args.write.read_text(), str(args.write)))
    except (OSError, ValueError) as exc:
        print(f"modgraph: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
