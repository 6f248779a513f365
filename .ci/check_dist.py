"""Check what `python -m build` made (make wheel-check): one sdist and one wheel of the
version in gpuspawner/_version.py, each holding every template and ledger migration of
the source tree, and the sdist the CHANGELOG."""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from pathlib import Path


def main(dist: Path, source: Path) -> None:
    version = re.search(r'__version__ = "([^"]+)"', (source / "gpuspawner/_version.py").read_text())[1]
    [sdist], [wheel] = sorted(dist.glob("gpuspawner-*.tar.gz")), sorted(dist.glob("gpuspawner-*.whl"))
    assert sdist.name == f"gpuspawner-{version}.tar.gz", sdist.name
    assert wheel.name.startswith(f"gpuspawner-{version}-py3-none-any"), wheel.name
    data = {
        str(p.relative_to(source))
        for folder in ("gpuspawner/templates", "gpuspawner/ledger/migrations")
        for p in (source / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    with tarfile.open(sdist) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert not data - in_wheel, f"the wheel lacks {sorted(data - in_wheel)}: add them to setup.cfg's package_data"
    assert not data - in_sdist, f"the sdist lacks {sorted(data - in_sdist)}: add them to MANIFEST.in"
    assert "CHANGELOG.md" in in_sdist, "the sdist lacks CHANGELOG.md: add it to MANIFEST.in"
    changelog = (source / "CHANGELOG.md").read_text()
    assert f"## {version}" in changelog, f"CHANGELOG.md has no section for {version}"
    print(f"{sdist.name} and {wheel.name}: {len(data)} templates and migrations each, CHANGELOG for {version}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
