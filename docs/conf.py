"""Sphinx configuration of gpuspawner's documentation site (`make docs`)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the CLI reference imports gpuspawner.cli from the tree

from gpuspawner._version import __version__  # noqa: E402

project = "gpuspawner"
copyright = "gpuspawner contributors"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "autodoc_traits",
    "sphinx_copybutton",
    "sphinxarg.ext",
]
myst_enable_extensions = ["colon_fence", "deflist"]
# Links like [x](line.md#the-order) resolve to the page's headings.
myst_heading_anchors = 4
# Markdown links resolve to pages and headings only (not to argparse's own domain).
myst_ref_domains = ["std", "py"]
exclude_patterns = ["_build", "screenshots/README.md"]
# Built offline: no inventories fetched from other sites.
intersphinx_mapping: dict[str, tuple[str, None]] = {}

html_theme = "pydata_sphinx_theme"
html_title = "gpuspawner"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_static_path: list[str] = []
# A copy button on shell and Python blocks, leaving the prompts out.
copybutton_prompt_text = r"\$ |>>> "
copybutton_prompt_is_regexp = True
