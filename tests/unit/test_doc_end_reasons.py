"""docs/end-reasons.md lists every end reason a ledger row can be closed with, and only those.

Guards docs/end-reasons.md, "The reasons": its table's first column. The code's reasons are
read from gpuspawner's source, where an end reason is handed on: the reason argument of
``stop_for`` (which names a holding's reason), of the ledger's ``_end``, ``close`` and
``close_missing`` and of the holdings' ``remove`` and ``_release``, and the defaults of
their ``reason`` parameters; each a string or a module's constant. A reason passed on as a
variable must be the parameter of one of those functions, or the idle reclaim's, whose
reasons are those of :mod:`gpuspawner.core.idle` and :mod:`gpuspawner.core.memory`
(pure: reads files, builds no hub)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from gpuspawner.core import idle, memory

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "end-reasons.md"
# Where a reason is handed on: the reason's position (None: by keyword only).
SINKS = {"stop_for": 1, "_end": 3, "close": 2, "close_missing": 2, "remove": None, "_release": 1}
OPEN = ""  # an allocation still held
RECLAIM = ("gpuspawner/reclaim/reclaimer.py", "_stop")  # stops with the reason its timers decide
RECLAIM_REASONS = {idle.IDLE, idle.MAX_HOURS, idle.BUDGET, memory.MEMORY}
ROW = re.compile(r"^\| `([^`]+)` \|")


class Reader:
    """The end reasons one source file hands on, in ``reasons``."""

    def __init__(self, path: Path):
        self.path, self.where = path, str(path.relative_to(ROOT))
        self.module = None
        self.reasons: set[str] = set()
        self.visit(ast.parse(path.read_text()))

    def constant(self, name: str) -> str:
        if self.module is None:
            self.module = importlib.import_module(".".join(self.path.relative_to(ROOT).with_suffix("").parts))
        return getattr(self.module, name)

    def value(self, node: ast.expr, function: ast.FunctionDef | ast.AsyncFunctionDef | None, line: int) -> None:
        if isinstance(node, ast.BoolOp):  # e.g. h.end_reason or reason
            for part in node.values:
                self.value(part, function, line)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            self.reasons.add(node.value)
        elif isinstance(node, ast.Attribute) and node.attr == "end_reason":
            pass  # a holding's reason: set by stop_for, whose callers are read too
        elif (
            isinstance(node, ast.Name)
            and function
            and node.id in {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
        ):
            assert function.name in SINKS or (self.where, function.name) == RECLAIM, (
                f"{self.where}:{line}: a reason passed on from {function.name}'s {node.id}: where does it come from?"
            )
        elif isinstance(node, ast.Name):
            self.reasons.add(self.constant(node.id))
        else:
            raise AssertionError(f"{self.where}:{line}: an end reason this test cannot read: {ast.dump(node)}")

    def visit(self, node: ast.AST, function: ast.FunctionDef | ast.AsyncFunctionDef | None = None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node
            if node.name in SINKS:
                positional = [a.arg for a in node.args.posonlyargs + node.args.args]
                defaults = dict(zip(positional[::-1], node.args.defaults[::-1]))
                defaults |= {a.arg: d for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None}
                if "reason" in defaults:
                    self.value(defaults["reason"], None, node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in SINKS:
                at, given = SINKS[name], {k.arg: k.value for k in node.keywords}.get("reason")
                if given is None and at is not None and len(node.args) > at:
                    given = node.args[at]
                if given is not None:
                    self.value(given, function, node.lineno)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == "end_reason" for t in node.targets
        ):
            self.value(node.value, function, node.lineno)
        for child in ast.iter_child_nodes(node):
            self.visit(child, function)


def code_reasons() -> set[str]:
    """Every end reason gpuspawner's source hands on (see the module's docstring)."""
    reasons = set(RECLAIM_REASONS)
    for path in sorted((ROOT / "gpuspawner").rglob("*.py")):
        reasons |= Reader(path).reasons
    return reasons - {OPEN}


def page_reasons() -> set[str]:
    table = PAGE.read_text().partition("## The reasons")[2].partition("\n## ")[0]
    return {m[1] for line in table.splitlines() if (m := ROW.match(line))}


def test_the_page_lists_exactly_the_end_reasons_the_code_records():
    code, page = code_reasons(), page_reasons()
    assert {"server stopped", "service gone", "idle", "preempted"} <= code  # the scan still finds them
    assert page == code, f"only in the code: {sorted(code - page)}; only in docs/end-reasons.md: {sorted(page - code)}"
