"""What enforces a share on a node (``gpu_share_enforcement``), and whether the node
really has it: its agent looks (``gpuspawner-agent --mps-pipe-dir/--hami-library``)
and reports what it found; the hub compares that with the mode the node is set to.

``mps`` needs the CUDA MPS control daemon: its pipe directory holds the ``control``
pipe while it runs. ``hami`` needs HAMi-core's ``libvgpu.so`` at the configured path.
Pure apart from :func:`look`, which the agent runs on the node.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

__all__ = ["HAMI_LIBRARY", "MPS_PIPE_DIR", "Seen", "look", "missing"]

HAMI_LIBRARY = "/usr/local/vgpu/libvgpu.so"  # where HAMi's device plugin puts it
MPS_PIPE_DIR = "/tmp/nvidia-mps"  # the MPS control daemon's default


@dataclass(frozen=True)
class Seen:
    """What a node's agent found (None: it did not look)."""

    mps_control: bool | None = None  # the MPS control daemon's control pipe is there
    hami_library_bytes: int | None = None  # libvgpu.so's size; 0: not there
    mps_pipe_dir: str = ""
    hami_library: str = ""


def look(mps_pipe_dir: str, hami_library: str) -> dict:
    """What the node has, as the agent reports it (paths as mounted into the agent). A
    folder the agent cannot see (not mounted) is not judged: None, not "missing"."""
    control: bool | None = None
    if os.path.isdir(mps_pipe_dir):
        try:
            control = stat.S_ISFIFO(os.stat(os.path.join(mps_pipe_dir, "control")).st_mode)
        except OSError:
            control = False
    size: int | None = None
    if os.path.isdir(os.path.dirname(hami_library) or "/"):
        try:
            info = os.stat(hami_library)
            size = info.st_size if stat.S_ISREG(info.st_mode) else 0
        except OSError:
            size = 0
    return {
        "mps_pipe_dir": mps_pipe_dir,
        "mps_control": control,
        "hami_library": hami_library,
        "hami_library_bytes": size,
    }


def missing(mode: str, seen: Seen | None) -> str | None:
    """Why a node set to ``mode`` cannot enforce shares, as its agent saw it; None when
    it can, when the mode needs nothing, or when no agent has looked."""
    if seen is None:
        return None
    if mode == "mps" and seen.mps_control is False:
        return f"its MPS control daemon is not running (no control pipe in {seen.mps_pipe_dir or MPS_PIPE_DIR})"
    if mode == "hami" and seen.hami_library_bytes == 0:
        return f"HAMi-core's library is not at {seen.hami_library or HAMI_LIBRARY}"
    return None
