"""docs/report.md names every field of an agent's report that the hub reads (pure: reads files)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "report.md"
# How core/reports.py reads a field: f.text("hostname", …), r.number("interval", …), data.get("topology")
READ = re.compile(r"\.(?:text|number|integer|list|flag|get)\(\"(\w+)\"")


def fields_the_hub_reads() -> set[str]:
    source = (ROOT / "gpuspawner" / "core" / "reports.py").read_text()
    topology = (ROOT / "gpuspawner" / "core" / "topology.py").read_text()
    # parse_topology checks its objects' keys as sets: {"links", "numa"}, {"a", "b", "path", "nvlinks"}
    keys = {k for group in re.findall(r"\{(\"\w+\"(?:, \"\w+\")+)\}", topology) for k in re.findall(r"\w+", group)}
    return set(READ.findall(source)) | keys


def fields_the_page_names() -> set[str]:
    text = PAGE.read_text()
    return set(re.findall(r"`(\w+)`", text)) | set(re.findall(r"\"(\w+)\"", text))


def test_the_report_page_names_every_field_the_hub_reads():
    """Guards docs/report.md, "The agent's report": "The hub checks every field before use"
    (every field it checks is on the page)."""
    read = fields_the_hub_reads()
    assert {"hostname", "interval", "devices", "topology", "share_enforcement", "holder", "links"} <= read
    missing = read - fields_the_page_names()
    assert not missing, f"docs/report.md does not name the report fields {sorted(missing)}"
