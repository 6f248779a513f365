"""Every benchmark command in README.md and docs/ names a benchmark module
whose own argument parser takes the options written there (a renamed or
dropped option fails here, not for a reader rerunning the figures)."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"python -m benchmarks\.(\w+)([^`#|\n]*)")


def documented() -> list[tuple[str, str, list[str]]]:
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in COMMAND.finditer(doc.read_text()):
            words = shlex.split(m.group(2).replace("[", " ").replace("]", " ").strip().rstrip(")"))
            found.append((doc.name, m.group(1), words))
    return found


class Parsed(Exception):
    pass


@pytest.mark.parametrize(
    ("doc", "module", "argv"), documented(), ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_a_documented_benchmark_command_parses(monkeypatch, doc, module, argv):
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    main = importlib.import_module(f"benchmarks.{module}").main
    with pytest.raises(Parsed):  # not SystemExit: the parser took every option
        main(argv)


def test_the_commands_are_found():
    modules = {module for _, module, _ in documented()}
    assert {"bench_shares", "bench_floor", "bench_allocator", "bench_spawn", "bench_trace"} <= modules
