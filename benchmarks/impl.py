"""The allocator of this tree, or that of another commit, for benchmarks that
run both in one process (alternating, so that both see the same machine).

    impl = load("main")   # gpuspawner/ of that commit, imported as its own package

The allocator modules import only the standard library and each other (by
relative imports), so the other commit's package is imported under another
name from a temporary directory (its ``__init__`` left out: that one would load
the spawner), in either layout: flat, or in layers.
"""

from __future__ import annotations

import importlib
import io
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from gpuspawner.allocator import allocator
from gpuspawner.core import inventory

__all__ = ["THIS", "Impl", "load"]


@dataclass(frozen=True)
class Impl:
    name: str
    Allocator: type
    Request: type
    Refused: type
    GPU: type
    in_milli: bool = True  # shares in thousandths (Request.milli, adopt's milli); older trees took Fractions

    def share(self, milli: int, **fields) -> object:
        """A request for a share of ``milli`` thousandths, in this allocator's terms."""
        return (
            self.Request(milli=milli, **fields)
            if self.in_milli
            else self.Request(share=Fraction(milli, 1000), **fields)
        )

    def shares(self, milli: list[int]) -> list:
        """Per device shares for ``adopt``, in this allocator's terms."""
        return milli if self.in_milli else [Fraction(m, 1000) for m in milli]


THIS = Impl("this tree", allocator.Allocator, allocator.Request, allocator.AllocationRefused, inventory.GPU)


def load(ref: str) -> Impl:
    """The allocator of commit ``ref`` (anything ``git archive`` takes)."""
    root = Path(__file__).resolve().parent.parent
    tar = subprocess.run(["git", "archive", ref, "gpuspawner"], cwd=root, capture_output=True, check=True).stdout
    package = "gpuspawner_" + re.sub(r"\W", "_", ref)
    where = Path(tempfile.mkdtemp(prefix="bench-impl-"))
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(where, filter="data")
    (where / "gpuspawner").rename(where / package)
    (where / package / "__init__.py").write_text("")
    sys.path.insert(0, str(where))
    if (where / package / "allocator").is_dir():  # in layers (core/, allocator/, ...)
        old = importlib.import_module(f"{package}.allocator.allocator")
        gpu = importlib.import_module(f"{package}.core.inventory").GPU
    else:  # one flat package, before the layers
        old = importlib.import_module(f"{package}.allocator")
        gpu = importlib.import_module(f"{package}.inventory").GPU
    in_milli = "milli" in old.Request.__dataclass_fields__
    return Impl(ref, old.Allocator, old.Request, old.AllocationRefused, gpu, in_milli)
