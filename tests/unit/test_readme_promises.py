"""Small promises of README.md, each checked against what it describes."""

from __future__ import annotations

import re
from pathlib import Path

from traitlets.config import Config

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_first_config_snippet_is_a_whole_config_that_sets_the_hub_up(tmp_path, monkeypatch):
    from gpuspawner.hub.app import KEY

    snippet = re.search(r"```python\n(# jupyterhub_config\.py\n.*?)```", README, re.S)[1]
    inventory = tmp_path / "gpus.yaml"
    inventory.write_text("gpu-a:\n  - {index: 0, uuid: GPU-a0, model: NVIDIA A100 80GB PCIe, memory_mib: 81920}\n")
    c = Config()
    exec(snippet.replace("/etc/jupyterhub/gpus.yaml", str(inventory)), {"c": c})  # noqa: S102 (our own README)
    assert c.JupyterHub.spawner_class == "gpuswarm"
    assert KEY in c.JupyterHub.tornado_settings.get_value({})  # configure(c) ran: the GPUHub, the endpoints


def test_the_agents_report_every_15_s_and_the_demos_every_5_s():
    """Guards docs/agent.md: "Every 15 seconds it reads every GPU"; and docs/tutorial.md:
    "through the real NVML bindings, every 5 s in the demo"."""
    from gpuspawner.agent.command import build_parser

    assert build_parser().parse_args(["run", "--hub-url", "http://hub:8081/"]).interval == 15
    assert re.search(r"state_dir / \"agent-tokens\", interval=5\b", (ROOT / "devtools/demo.py").read_text())


def test_the_system_packages_readme_lists_are_the_ones_the_installer_installs():
    installer = (ROOT / ".ci/install-system-deps").read_text()
    for package in ("docker.io", "busybox-static", "iproute2", "gcc", "debootstrap", "postgresql", "chromium"):
        assert package in installer
    for named in ("docker.io", "busybox-static", "iproute2", "gcc", "debootstrap", "PostgreSQL's server", "chromium"):
        assert named in README


def test_the_readme_fits_on_two_screens_and_leads_into_the_site():
    """The README carries the two commands, the install, a minimal config, what a node
    needs and the settings most sites change; everything else is in docs/."""
    lines = README.splitlines()
    assert len(lines) <= 150, f"README.md is {len(lines)} lines"
    for heading in ("## The two commands", "## Install", "## What a node needs", "## The settings most sites change"):
        assert heading in lines
    linked = set(re.findall(r"\]\(docs/([\w-]+)\.md", README))
    assert {"index", "nodes", "deploy", "configuration"} <= linked
    assert all((ROOT / "docs" / f"{page}.md").is_file() for page in linked)
