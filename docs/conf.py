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
# Quotes stay straight: settings, values and messages are meant to be copied.
smartquotes = False
exclude_patterns = ["_build", "screenshots/README.md"]
# Built offline: no inventories fetched from other sites.
intersphinx_mapping: dict[str, tuple[str, None]] = {}

# The spawner's signature (JupyterHub's **kwargs: t.Any) names a type no inventory has.
nitpick_ignore = [("py:class", "t.Any")]

html_theme = "pydata_sphinx_theme"
html_title = "gpuspawner"
# The page's own table of contents names settings without their class.
toc_object_entries_show_parents = "hide"

html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_static_path: list[str] = []
# A copy button on shell and Python blocks, leaving the prompts out.
copybutton_prompt_text = r"\$ |>>> "
copybutton_prompt_is_regexp = True


# -- the configuration reference: autodoc-traits, on gpuspawner's own settings -------------

from traitlets import TraitType  # noqa: E402

from devtools import configref  # noqa: E402

SETTINGS = {s.name: s for s in configref.settings()}
TRAIT_PREFIX = "gpuspawner.GPUSwarmSpawner."


def only_gpuspawners_own(app, what, name, obj, skip, options):
    """dockerspawner's and JupyterHub's settings are in their own references (the page links them)."""
    if isinstance(obj, TraitType) and name not in SETTINGS:
        return True
    return None


def type_and_default(app, what, name, obj, options, lines):
    """Each setting's type, range and default above its help (autodoc-traits shows only the trait's class)."""
    setting = SETTINGS.get(name.removeprefix(TRAIT_PREFIX)) if name.startswith(TRAIT_PREFIX) else None
    if setting is not None:
        default = f"*{setting.default}*" if setting.default.startswith("computed") else f"``{setting.default}``"
        lines[:0] = [f"**Type:** {setting.type}. **Default:** {default}.", ""]


def setup(app):
    app.connect("autodoc-skip-member", only_gpuspawners_own)
    app.connect("autodoc-process-docstring", type_and_default)
