"""The commands README and docs show can be typed as they are: each curl
example parses to one URL of the hub's REST API and a JSON body of known
options; the demo's image build names the mirror README says it downloads from;
the variables the sharing docs' code reads in a server are ones its spec sets."""

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
    assert {where for where, _ in EXAMPLES} >= {"docs/tutorial.md", "docs/line.md"}


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
    assert "http://deb.debian.org/debian" in (REPO / "docs" / "tutorial.md").read_text()
    monkeypatch.delenv("GPUSPAWNER_DEBIAN_MIRROR", raising=False)
    debian_image = importlib.reload(importlib.import_module("devtools.debian_image"))
    assert debian_image.DEBIAN_MIRROR == "http://deb.debian.org/debian"
    monkeypatch.setenv("GPUSPAWNER_DEBIAN_MIRROR", "http://127.0.0.1:3142/debian")
    assert importlib.reload(debian_image).DEBIAN_MIRROR == "http://127.0.0.1:3142/debian"
    monkeypatch.delenv("GPUSPAWNER_DEBIAN_MIRROR")
    importlib.reload(debian_image)


def test_every_gpuspawner_variable_the_sharing_docs_code_reads_is_one_a_shared_servers_spec_sets():
    """A user pastes these lines into a notebook: a variable the spec does not set
    would be a KeyError there. Set under every enforcement mode, as the lines do not
    say which one the node has."""
    from gpuspawner.cluster.service_spec import ENFORCEMENT_MODES, build_service, share_enforcement
    from gpuspawner.core.labels import Held

    text = (REPO / "docs" / "sharing.md").read_text()
    code = re.findall(r"```\w*\n(.*?)```", text, re.S) + [
        c for c in re.findall(r"`([^`\n]+)`", text) if "os.environ" in c
    ]
    named = set(re.findall(r"GPUSPAWNER_\w+", "\n".join(code)))
    assert {"GPUSPAWNER_GPU_SHARES", "GPUSPAWNER_GPU_MEMORY_MIB"} <= named  # the PyTorch and TensorFlow lines
    holding = Held(
        user="bob", server="", host="gpu-a", uuids=("GPU-1", "GPU-2"), model="A100", port=None, milli=(600, 600)
    )
    for mode in ENFORCEMENT_MODES:
        spec = build_service(
            name="jupyter-bob",
            image="img",
            command=["run"],
            env={},
            holding=holding,
            enforcement=share_enforcement(mode, holding.milli, (81920, 81920)),
        )
        env = {item.split("=", 1)[0] for item in spec["task_template"]["ContainerSpec"]["Env"]}
        assert named <= env, f"under {mode!r}, the spec does not set {sorted(named - env)}"
