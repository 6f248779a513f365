"""docs/metrics.md lists every metric gpuspawner exports, and only those, each with its
type and labels.

Guards docs/metrics.md: its tables' rows (`` | `name` | type | labels | meaning | ``). The
code's metrics are found in gpuspawner's source: every prometheus_client metric it
constructs (``Counter``, ``Gauge``, ``Histogram``, … under any name it imports them as),
and the families of its own collectors (the classes with ``describe`` and ``collect``),
whose per-host and per-holder series the page says are gated by ``gpu_metrics_per_host``
and ``gpu_metrics_per_holder`` (pure: reads files, builds no hub)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gpuspawner import metrics
from gpuspawner.spawn.spawner import GPUSwarmSpawner

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "metrics.md"
KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary", "Info": "info"}
ROW = re.compile(r"^\| `(gpuspawner_\w+)` \| (\w+) \| ([^|]*) \|")
# Each collector of the hub's, made as the hub makes it, and the setting that gates its extra series.
COLLECTORS = {
    "DeviceGauges": (lambda: metrics.DeviceGauges(lambda: None), "gpu_metrics_per_host"),
    "HolderMemoryGauges": (lambda: metrics.HolderMemoryGauges(lambda: [], lambda: False), "gpu_metrics_per_holder"),
}


def constructed() -> dict[str, tuple[str, set[str]]]:
    """name as exported -> (type, labels) of each metric gpuspawner's source constructs."""
    found: dict[str, tuple[str, set[str]]] = {}
    for path in sorted((ROOT / "gpuspawner").rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = {
            alias.asname or alias.name: KINDS[alias.name]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus_client")
            for alias in node.names
            if alias.name in KINDS
        }
        for node in ast.walk(tree):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Name):
                kind = names.get(func.id)
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                kind = KINDS.get(func.attr) if func.value.id == "prometheus_client" else None
            else:
                kind = None
            if kind is None:
                continue
            args = {**dict(enumerate(node.args)), **{k.arg: k.value for k in node.keywords}}  # type: ignore[union-attr]
            name, labels = args.get(0, args.get("name")), args.get(2, args.get("labelnames"))
            assert isinstance(name, ast.Constant), f"{path}:{node.lineno}: a metric whose name is not written out"
            exported = name.value + ("_total" if kind == "counter" else "")
            found[exported] = (kind, set(ast.literal_eval(labels)) if labels is not None else set())
    return found


def collectors() -> dict[str, tuple[str, set[str], str]]:
    """name -> (type, labels, the setting that gates more series) of each collector's family."""
    made = {
        node.name
        for path in (ROOT / "gpuspawner").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and {"describe", "collect"} <= {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
    }
    assert made == set(COLLECTORS), f"collectors in gpuspawner: {sorted(made)}; this test knows {sorted(COLLECTORS)}"
    found = {}
    for make, setting in COLLECTORS.values():
        collector = make()
        families = list(collector.describe())
        if isinstance(collector, metrics.DeviceGauges):  # per host: the same names, with a host label too
            families += collector.describe(("host", "model"))
        for family in families:
            kind, labels, _ = found.get(family.name, (family.type, set(), setting))
            found[family.name] = (kind, labels | set(family._labelnames), setting)
    return found


def listed() -> dict[str, tuple[str, str]]:
    """name -> (type, the rest of its row) of each metric the page lists."""
    rows: dict[str, tuple[str, str]] = {}
    for line in PAGE.read_text().splitlines():
        match = ROW.match(line)
        if match:
            assert match[1] not in rows, f"docs/metrics.md lists {match[1]} twice"
            rows[match[1]] = (match[2], line[match.end(2) :])
    return rows


def test_the_page_lists_exactly_the_metrics_the_code_defines():
    code = {name: kind for name, (kind, _) in constructed().items()} | {
        name: kind for name, (kind, _, _) in collectors().items()
    }
    page = {name: kind for name, (kind, _) in listed().items()}
    assert len(code) >= 20  # the scan still finds them
    assert set(page) == set(code), (
        f"only in the code: {sorted(set(code) - set(page))}; only in docs/metrics.md: {sorted(set(page) - set(code))}"
    )
    wrong = {name: (page[name], kind) for name, kind in code.items() if page[name] != kind}
    assert not wrong, f"docs/metrics.md gives the wrong type (page, code): {wrong}"


def test_each_row_names_the_metrics_labels_and_the_setting_that_gates_more_series():
    rows = listed()
    for name, (_, labels) in constructed().items():
        for label in labels:
            assert f"`{label}`" in rows[name][1], f"docs/metrics.md, {name}: the label {label} is not named"
    for name, (_, labels, setting) in collectors().items():
        assert setting in GPUSwarmSpawner.class_trait_names(), setting
        assert f"`{setting}`" in rows[name][1], f"docs/metrics.md, {name}: {setting} is not named"
        for label in labels:
            assert f"`{label}`" in rows[name][1], f"docs/metrics.md, {name}: the label {label} is not named"
