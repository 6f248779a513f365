"""The tests the docs name exist: a sentence that cites ``test_x.py::test_y`` (or a
test file) as its proof must not outlive the test (pure: reads files)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(r"(test_\w+\.py)(?:::(test_\w+)([…*])?)?")  # "test_x…", "test_x*": names that begin so


def test_every_test_the_docs_cite_exists():
    files = {p.name: p for p in (ROOT / "tests").rglob("test_*.py")}
    cited = 0
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name, function, cut in CITED.findall(doc.read_text()):
            cited += 1
            assert name in files, f"{doc.name} cites {name}, which is not a test file"
            if function:
                source = files[name].read_text()
                end = r"\w*\(" if cut else r"\("
                assert re.search(rf"^(async )?def {function}{end}", source, re.M), (
                    f"{doc.name} cites {name}::{function}, which {name} does not define"
                )
    assert cited > 20  # the docs do cite tests: the pattern still finds them
