"""docs/configuration.md is what devtools.configref generates from the traits now:
a trait added, renamed or re-documented without regenerating it fails here. And
the README and docs never name a ``c.GPUSwarmSpawner`` setting, or a default,
that the code does not have."""

from __future__ import annotations

import ast
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets import Integer, Unicode, default

from devtools import configref
from gpuspawner.spawn.spawner import GPUSwarmSpawner

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "configuration.md"
README = REPO / "README.md"
DOCS = [README, *sorted(p for p in (REPO / "docs").glob("*.md") if p != REFERENCE)]


def test_the_reference_is_up_to_date():
    assert REFERENCE.read_text() == configref.render(), f"docs/configuration.md is out of date: {configref.COMMAND}"


def test_the_reference_documents_every_setting_gpuspawner_defines():
    ours = {s.name for s in configref.settings()}
    inherited = set(GPUSwarmSpawner.class_traits(config=True)) - ours
    assert {"gpu_inventory", "max_gpus_per_user", "gpu_idle_timeout", "local_gpu_host"} <= ours
    assert {"image", "network_name", "start_timeout"} <= inherited  # dockerspawner's and JupyterHub's: linked to
    text = REFERENCE.read_text()
    for name in ours:
        assert f'<a id="{name}"></a>\n\n### `c.GPUSwarmSpawner.{name}`' in text, name
    assert configref.DOCKERSPAWNER_DOCS in text
    assert all(s.help for s in configref.settings()), "a setting without help text"


def test_the_reference_holds_no_value_of_this_machine(monkeypatch):
    """local_gpu_host's default is the hub's hostname: it shows as computed, never as a name."""
    (local,) = [s for s in configref.settings() if s.name == "local_gpu_host"]
    assert local.default.startswith("computed")
    monkeypatch.setattr(socket, "gethostname", lambda: "another-machine")
    assert configref.render() == REFERENCE.read_text()


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
    text = configref.render(Extended)
    assert "### `c.GPUSwarmSpawner.gpu_example`" in text
    assert "gpu_not_configurable" not in text
    assert text != configref.render()


def test_type_names_are_readable():
    types = {s.name: s.type for s in configref.settings()}
    assert types["gpu_inventory"] == "Union of Dict/Unicode"
    assert types["gpu_inventory_source"] == "List of Enum('static','agent','local')"
    assert types["host_network_ports"] == "Tuple(Integer, Integer)"
    assert types["max_gpus_per_user"] == "Integer (0 to 100000)"
    assert types["gpu_fairshare_half_life_days"] == "Float (0, or 0.01 to 3650)"


def test_check_fails_on_a_stale_file_and_names_the_command(tmp_path, capsys):
    current = tmp_path / "configuration.md"
    shutil.copy(REFERENCE, current)
    assert configref.main(["--check", str(current)]) == 0
    stale = tmp_path / "stale.md"
    stale.write_text(REFERENCE.read_text().replace("Seconds", "Minutes", 1))
    assert configref.main(["--check", str(stale)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"python -m devtools.configref --write {stale}" in err
    assert configref.main(["--check", str(tmp_path / "missing.md")]) == 1


def test_the_command_line_writes_and_checks(tmp_path):
    target = tmp_path / "configuration.md"
    run = [sys.executable, "-m", "devtools.configref"]
    subprocess.run([*run, "--write", str(target)], cwd=REPO, check=True)
    assert target.read_text() == REFERENCE.read_text()
    target.write_text(target.read_text() + "\nedited by hand\n")
    done = subprocess.run([*run, "--check", str(target)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        == f"{target} is out of date: regenerate it with python -m devtools.configref --write {target}"
    )


@pytest.mark.parametrize("doc", DOCS, ids=[p.relative_to(REPO).as_posix() for p in DOCS])
def test_every_setting_a_doc_names_exists(doc):
    """Each ``c.GPUSwarmSpawner.X`` and each link to the reference's ``#X``: gpuspawner's
    own settings are in the reference, the others are dockerspawner's or JupyterHub's."""
    text = doc.read_text()
    ours = {s.name for s in configref.settings()}
    inherited = set(GPUSwarmSpawner.class_traits(config=True)) - ours
    named = set(re.findall(r"c\.GPUSwarmSpawner\.(\w+)", text))
    assert named - ours - inherited == set(), f"{doc.name} names settings GPUSwarmSpawner does not have"
    anchors = set(re.findall(r'<a id="(\w+)"></a>', REFERENCE.read_text()))
    linked = set(re.findall(r"configuration\.md#([\w-]+)", text))
    assert linked - anchors == set(), f"{doc.name} links to settings docs/configuration.md does not have"


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
