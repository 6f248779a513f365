"""The commands README and docs show can be typed as they are: each curl
example parses to one URL of the hub's REST API and a JSON body of known
options; the demo's image build names the mirror README says it downloads from."""

from __future__ import annotations

import importlib
import json
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
OPTIONS = {"gpu_model", "gpu_count", "gpu_host", "gpu_share", "gpu_wait"}
TAKES_VALUE = {"-X", "-H", "-d"}


def curl_commands(path: Path) -> list[list[str]]:
    """Each ``curl`` command of the file's sh blocks, split as a shell would."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", path.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("curl "):
                commands.append(shlex.split(line))
    return commands


EXAMPLES = [(p.relative_to(REPO).as_posix(), words) for p in DOCS for words in curl_commands(p)]


def test_the_docs_have_curl_examples():
    assert {where for where, _ in EXAMPLES} >= {"README.md", "docs/line.md"}


@pytest.mark.parametrize(("where", "words"), EXAMPLES, ids=[f"{w}:{i}" for i, (w, _) in enumerate(EXAMPLES)])
def test_a_curl_example_names_one_url_and_a_body_of_known_options(where, words):
    positional, body, i = [], None, 1
    while i < len(words):
        if words[i] in TAKES_VALUE:
            body = words[i + 1] if words[i] == "-d" else body
            i += 2
        else:
            positional.append(words[i])
            i += 1
    assert len(positional) == 1, f"{where}: curl is given {positional} (a stray space in the URL?)"
    assert re.fullmatch(r"https?://[\w.:-]+/hub/api/users/\w+/server", positional[0]), positional[0]
    options = json.loads(body)
    assert set(options) <= OPTIONS, f"{where}: unknown options {set(options) - OPTIONS}"


def test_the_image_build_downloads_from_the_mirror_readme_names(monkeypatch):
    assert "http://deb.debian.org/debian" in (REPO / "README.md").read_text()
    monkeypatch.delenv("GPUSPAWNER_DEBIAN_MIRROR", raising=False)
    debian_image = importlib.reload(importlib.import_module("devtools.debian_image"))
    assert debian_image.DEBIAN_MIRROR == "http://deb.debian.org/debian"
    monkeypatch.setenv("GPUSPAWNER_DEBIAN_MIRROR", "http://127.0.0.1:3142/debian")
    assert importlib.reload(debian_image).DEBIAN_MIRROR == "http://127.0.0.1:3142/debian"
    monkeypatch.delenv("GPUSPAWNER_DEBIAN_MIRROR")
    importlib.reload(debian_image)
