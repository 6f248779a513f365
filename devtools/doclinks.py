"""Every internal link of the built documentation site leads somewhere.

Sphinx with ``-n -W`` already fails on a cross-reference it cannot resolve; this
reads the HTML it wrote and checks every relative ``href`` and ``src``: the file
exists and, for ``page.html#id``, the page has an element with that id. Links to
other sites are left alone (the site builds offline)::

    python -m devtools.doclinks docs/_build/html
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name"):
                self.ids.add(value)
            elif (name == "href" and tag == "a") or (name == "src" and tag == "img"):
                self.links.append(value)


def _read(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def broken_links(site: Path) -> list[str]:
    """``page: link`` for each internal link of the site that leads nowhere."""
    pages = {p: _read(p) for p in sorted(site.rglob("*.html"))}
    broken = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            where = f"{path.relative_to(site)}: {link}"
            if not target.exists():
                broken.append(where)
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _read(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(where)
    return broken


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m devtools.doclinks SITE_DIR", file=sys.stderr)
        return 2
    site = Path(args[0])
    broken = broken_links(site)
    for where in broken:
        print(f"broken link: {where}", file=sys.stderr)
    pages = len(list(site.rglob("*.html")))
    print(f"{pages} pages, {len(broken)} broken internal links")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
