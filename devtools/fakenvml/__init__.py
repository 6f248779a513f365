"""A fake libnvidia-ml.so.1 for tests on machines without a GPU.

`build(dest)` compiles fakenvml.c (the NVML calls) and devices.c (the devices file)
with gcc into dest/libnvidia-ml.so.1; put dest on
LD_LIBRARY_PATH of a *new* process (the dynamic loader reads it at start-up) and the
real pynvml bindings load the fake; `process_env` makes such an environment.
`write_devices(path, devices)` writes the file that $FAKE_NVML_DEVICES names. See
devices.c for the file format, fakenvml.c for the other $FAKE_NVML_* switches, nodes.py for a
sample node.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = (HERE / "fakenvml.c", HERE / "devices.c", HERE / "topology.c")
HEADERS = (HERE / "fakenvml.h",)
LIBNAME = "libnvidia-ml.so.1"


class BuildError(RuntimeError):
    """gcc is missing or the compile failed."""


def build(dest_dir: str | os.PathLike) -> Path:
    """Compile the fake library into dest_dir and return its path.

    Cached by source hash: a stamp file next to the library records which source it
    was built from, so repeated calls (and unchanged sources) skip gcc.
    """
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    lib = dest / LIBNAME
    stamp = dest / (LIBNAME + ".sha256")
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS)).hexdigest()
    if lib.exists() and stamp.exists() and stamp.read_text() == digest:
        return lib

    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise BuildError("gcc not found: install gcc to build the fake libnvidia-ml.so.1 (devtools/fakenvml)")
    # Build to a temporary name and rename, so a half-written .so is never loaded.
    tmp = dest / (LIBNAME + ".tmp")
    cmd = [gcc, "-Wall", "-O2", "-shared", "-fPIC", f"-Wl,-soname,{LIBNAME}", "-o", str(tmp), *map(str, SOURCES)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"building the fake NVML library failed:\n{' '.join(cmd)}\n{proc.stderr}")
    tmp.replace(lib)
    stamp.write_text(digest)
    return lib


def process_env(lib_dir: str | os.PathLike, devices: str | os.PathLike | None = None, **extra: str) -> dict[str, str]:
    """Environment for a new process that loads the fake from lib_dir.

    This process's own $FAKE_NVML_* settings are dropped, and so are proxy settings
    (the agent's HTTP must stay on loopback in tests); ``extra`` is added last.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_") and k.lower() not in _PROXY_VARS}
    env["LD_LIBRARY_PATH"] = str(lib_dir)
    if devices is not None:
        env["FAKE_NVML_DEVICES"] = str(devices)
    env.update(extra)
    return env


_PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


# Keys the C side understands, in the order they are written.
_KEYS = (
    "index",
    "uuid",
    "name",
    "memory_total_mib",
    "memory_used_mib",
    "util_gpu",
    "util_mem",
    "temp_c",
    "ecc_uncorrected",
    "ecc_corrected",
    "lost",
    "mig",
    "max_mig",
    "bus",
    "numa",
    "nvlinks",
    "paths",
)
# Keys of one MIG device (a "parent=P" line on the C side).
_MIG_KEYS = (
    "slot",
    "uuid",
    "name",
    "memory_total_mib",
    "memory_used_mib",
    "gi_slices",
    "ci_slices",
    "memory_size_mb",
    "gi_id",
    "ci_id",
)


def _value(key: str, value) -> str:
    if isinstance(value, (list, tuple)):  # nvlinks (a peer's position per link) and paths (a level per position)
        blank = "-" if key == "nvlinks" else "na"
        return ",".join(blank if v is None else "s" if v == "switch" else str(int(v)) for v in value)
    if value is None:
        return "na"  # NVML_ERROR_NOT_SUPPORTED for ecc_uncorrected / mig
    if isinstance(value, bool):
        return "1" if value else "0"
    text = str(value)
    # The C parser splits on whitespace and reads '_' back as a space.
    if "_" in text or any(c.isspace() and c != " " for c in text) or "#" in text:
        raise ValueError(f"fake NVML {key}={text!r}: '_', '#', tabs and newlines are not allowed")
    return text.replace(" ", "_")


def write_devices(
    path: str | os.PathLike, devices: list[dict], *, driver: str | None = None, cuda: int | None = None
) -> Path:
    """Write a devices file for $FAKE_NVML_DEVICES.

    Each dict uses the keys in _KEYS (its links: "bus", "numa", "nvlinks" as the
    position of each NVLink's peer or None, "paths" as NVML's topology level to each
    position or None, "switch" for an NVLink to an NVSwitch; see devices.c) plus "processes": [{"pid": int, "used_mib": int}]
    and "mig_devices": [{key: value for keys in _MIG_KEYS}] (the MIG devices carved
    out of it; give it mig=True too). A key that is absent is left out (for
    ecc_uncorrected / mig: "not supported"); None writes "na", which means the same.
    """
    lines = []
    if driver is not None or cuda is not None:
        system = []
        if driver is not None:
            system.append(f"driver={_value('driver', driver)}")
        if cuda is not None:
            system.append(f"cuda={int(cuda)}")
        lines.append(" ".join(system))
    for position, dev in enumerate(devices):
        unknown = set(dev) - set(_KEYS) - {"processes", "mig_devices"}
        if unknown:
            raise ValueError(f"unknown fake device keys: {sorted(unknown)}")
        fields = [f"{k}={_value(k, dev[k])}" for k in _KEYS if k in dev]
        procs = dev.get("processes") or []
        if procs:
            fields.append("procs=" + ",".join(f"{int(p['pid'])}:{int(p['used_mib'])}" for p in procs))
        lines.append(" ".join(fields))
        for mig in dev.get("mig_devices") or []:
            unknown = set(mig) - set(_MIG_KEYS)
            if unknown:
                raise ValueError(f"unknown fake MIG device keys: {sorted(unknown)}")
            lines.append(" ".join([f"parent={position}"] + [f"{k}={_value(k, mig[k])}" for k in _MIG_KEYS if k in mig]))
    out = Path(path)
    out.write_text("\n".join(lines) + "\n")
    return out
