"""The gpuspawner package's import graph, read from its source.

The unit tests check it for cycles; CONTRIBUTING.md shows it as a Mermaid
flowchart between two marker comments::

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


def mermaid(g: dict[str, set[str]]) -> str:
    """A flowchart, importers above what they import: each module once, then
    each import; sorted, so that the same graph always prints the same text."""

    def label(name: str) -> str:
        return "gpuspawner/__init__" if name == "gpuspawner" else name.removeprefix("gpuspawner.")

    def ident(name: str) -> str:
        return label(name).replace(".", "_").replace("/", "_")

    lines = ["flowchart TD"]
    lines += [f'    {ident(name)}["{label(name)}"]' for name in sorted(g)]
    lines += [f"    {ident(a)} --> {ident(b)}" for a in sorted(g) for b in sorted(g[a])]
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
