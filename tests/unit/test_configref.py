"""The configuration reference (docs/configuration.md, written by autodoc-traits when
the site is built) shows every setting gpuspawner defines, with its type and default,
and none of dockerspawner's or JupyterHub's; and the README and docs never name a
``c.GPUSwarmSpawner`` setting, or a default, that the code does not have."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import socket
from html import unescape
from pathlib import Path

import pytest
from traitlets import Integer, Unicode, default

from devtools import configref
from gpuspawner.spawn.spawner import GPUSwarmSpawner
from tests.ci import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "configuration.md"
README = REPO / "README.md"
DOCS = [README, *sorted(p for p in (REPO / "docs").glob("*.md") if p != REFERENCE)]


def docs_conf():
    spec = importlib.util.spec_from_file_location("docs_conf", REPO / "docs" / "conf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built_reference(tmp_path_factory) -> str:
    """docs/configuration.md built alone, with the site's own conf.py: the HTML a reader gets."""
    try:
        from sphinx.cmd import build as sphinx
    except ImportError:
        skip_or_fail("Sphinx builds the site here: pip install -e '.[docs]' (make deps installs it)")
    source = tmp_path_factory.mktemp("docs")
    shutil.copy(REFERENCE, source / "index.md")
    (source / "how-it-works.md").write_text("# How it works\n\n## What admin settings cannot change\n")
    out = source / "_build"
    assert sphinx.build_main(["-q", "-b", "html", "-c", str(REPO / "docs"), str(source), str(out)]) == 0
    return (out / "index.html").read_text()


@pytest.mark.docs_site
def test_the_reference_documents_every_setting_gpuspawner_defines(built_reference):
    """Guards docs/configuration.md: "Every setting that gpuspawner adds to
    `c.GPUSwarmSpawner`, with its type, default and help"."""
    ours = {s.name for s in configref.settings()}
    inherited = set(GPUSwarmSpawner.class_traits(config=True)) - ours
    assert {"gpu_inventory", "max_gpus_per_user", "gpu_idle_timeout", "local_gpu_host"} <= ours
    assert {"image", "network_name", "start_timeout"} <= inherited  # dockerspawner's and JupyterHub's: linked to
    shown = set(re.findall(r'id="gpuspawner\.GPUSwarmSpawner\.(\w+)"', built_reference))
    assert shown == ours
    for s in configref.settings():
        assert f"Type: {s.type}." in entry_text(built_reference, s.name), s.name
    assert all(s.help for s in configref.settings()), "a setting without help text"
    for name, example in ((s.name, e) for s in configref.settings() for e in configref.examples(s.help)):
        shown = entry_text(built_reference, name)
        assert example.splitlines()[0] in shown, f"{name}'s example is not in the reference as code"


def entry_text(html: str, name: str) -> str:
    """The setting's entry in the built page, as text."""
    at = html.index(f'id="gpuspawner.GPUSwarmSpawner.{name}"')
    return unescape(re.sub(r"<[^>]+>", "", html[at : html.find("<dt ", at + 1)]))


def test_the_site_leaves_out_exactly_the_inherited_settings():
    conf = docs_conf()
    for name, trait in GPUSwarmSpawner.class_traits(config=True).items():
        skipped = conf.only_gpuspawners_own(None, "attribute", name, trait, False, {})
        assert skipped is (True if name not in conf.SETTINGS else None), name


@pytest.mark.docs_site
def test_the_reference_holds_no_value_of_this_machine(monkeypatch, built_reference):
    """local_gpu_host's default is the hub's hostname: it shows as computed, never as a name."""
    (local,) = [s for s in configref.settings() if s.name == "local_gpu_host"]
    assert local.default.startswith("computed")
    assert socket.gethostname() not in re.sub(r"<[^>]+>", "", built_reference)


def test_a_new_trait_appears_without_editing_the_generator():
    class Extended(GPUSwarmSpawner):
        __module__ = "gpuspawner.extended"

        gpu_example = Unicode(
            help="""First line
            of the first paragraph.

            Second  paragraph."""
        ).tag(config=True)
        gpu_not_configurable = Integer(3)

        @default("gpu_example")
        def _default_gpu_example(self):
            """Found at start, from the hub's name. Not shown."""
            return socket.gethostname()

    (example,) = [s for s in configref.settings(Extended) if s.module == "gpuspawner.extended"]
    assert example == configref.Setting(
        name="gpu_example",
        module="gpuspawner.extended",
        type="Unicode",
        default="computed: Found at start, from the hub's name.",
        help="First line of the first paragraph.\n\nSecond paragraph.",
    )
    assert "gpu_not_configurable" not in {s.name for s in configref.settings(Extended)}


def test_type_names_are_readable():
    types = {s.name: s.type for s in configref.settings()}
    assert types["gpu_inventory"] == "Union of Dict/Unicode"
    assert types["gpu_inventory_source"] == "List of Enum('static','agent','local')"
    assert types["host_network_ports"] == "Tuple(Integer, Integer)"
    assert types["max_gpus_per_user"] == "Integer (0 to 100000)"
    assert types["gpu_fairshare_half_life_days"] == "Float (0, or 0.01 to 3650)"


@pytest.mark.parametrize("doc", DOCS, ids=[p.relative_to(REPO).as_posix() for p in DOCS])
def test_every_setting_a_doc_names_exists(doc):
    """Each ``c.GPUSwarmSpawner.X``: gpuspawner's
    own settings are in the reference, the others are dockerspawner's or JupyterHub's."""
    text = doc.read_text()
    ours = {s.name for s in configref.settings()}
    inherited = set(GPUSwarmSpawner.class_traits(config=True)) - ours
    named = set(re.findall(r"c\.GPUSwarmSpawner\.(\w+)", text))
    assert named - ours - inherited == set(), f"{doc.name} names settings GPUSwarmSpawner does not have"


def readme_defaults() -> list[tuple[str, str]]:
    """(setting, default cell) for each row of README's tables that have a "default" column."""
    rows = []
    for table in re.findall(r"(?:^\|.*\|\n)+", README.read_text(), re.M):
        lines = table.splitlines()
        header = [c.strip().lower() for c in lines[0].strip("|").split("|")]
        if "default" not in header:
            continue
        column = header.index("default")
        for line in lines[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            name = re.match(r"\[?`(?:c\.GPUSwarmSpawner\.)?(\w+)`", cells[0])
            if name:
                rows.append((name.group(1), cells[column]))
    return rows


def test_readme_shows_the_defaults_the_code_has():
    defaults = {s.name: s.default for s in configref.settings()}
    rows = readme_defaults()
    assert {"gpu_inventory_source", "gpu_quotas", "gpu_idle_timeout", "allocation_policy"} <= {n for n, _ in rows}
    for name, cell in rows:
        assert name in defaults, f"README's table names {name}, which is not a gpuspawner setting"
        if defaults[name].startswith("computed"):
            continue
        literal = re.fullmatch(r"`(.*)`", cell)
        assert literal, f"README: {name}'s default {cell!r} is not one `value`"
        assert ast.literal_eval(literal.group(1)) == ast.literal_eval(defaults[name]), (
            f"README says {name} defaults to {literal.group(1)}; the code says {defaults[name]}"
        )
