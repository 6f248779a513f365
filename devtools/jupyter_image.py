"""The real single-user server image for the local swarm: jupyterhub-singleuser with JupyterLab.

    python -m devtools.jupyter_image build     # build (or find in the cache); print the tar
    python -m devtools.jupyter_image import    # build, then import on the running swarm's workers

Why a Debian root file system from debootstrap, and not the host's Python copied in: the
machines this runs on have every kind of Python (Debian's, pyenv's, /usr/local builds), and
an interpreter copied out of one of them needs its shared libraries and prefix hunted down by
hand. debootstrap makes the same small Debian (``minbase`` + ``python3-venv``) everywhere, from
Debian's own mirror with apt's signature checks, and needs no registry. Its python3 runs a
venv at /opt/jupyter with jupyterhub (the hub's own version, so that server and hub agree) and
jupyterlab. The wheels come from the host's pip, for the image's Python and glibc (``pip
download --platform ...``): the host's index, proxy and certificates apply, and the chroot
needs no network at all.

The server runs as ``jovyan`` (uid 1000): Jupyter refuses to run as root.

Cache (``cache_dir``, default /var/cache/gpuspawner-image, env ``GPUSPAWNER_IMAGE_CACHE``)::

    base-<key>/        debootstrap output, docs and apt lists removed   (cold: 1.5-2 min)
    wheels/            downloaded wheels, reused by later builds         (about 30 s)
    image-<key>.tar    base + venv + user, ready for ``docker import``   (about 1 min)
    image-<key>.json   the tar's digest, the inputs, the build time

Each key is a sha256 of that step's inputs (Debian suite and packages, requirements,
the image settings, and a recipe number bumped when the steps change). A second run with
the same inputs builds nothing, and a node that already holds the image (same digest in
its label) gets no import.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path

from . import swarm

__all__ = ["JUPYTER_IMAGE", "ImageError", "BuiltImage", "build", "ensure_on", "unavailable_reason"]

JUPYTER_IMAGE = "gpuspawner-test/jupyter:latest"
DEFAULT_CACHE = Path(os.environ.get("GPUSPAWNER_IMAGE_CACHE", "/var/cache/gpuspawner-image"))
DEBIAN_MIRROR = os.environ.get("GPUSPAWNER_DEBIAN_MIRROR", "http://deb.debian.org/debian")

SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv")
JUPYTERLAB = "jupyterlab==4.6.6"
VENV = "/opt/jupyter"
USER, UID, GID = "jovyan", 1000, 100  # gid 100: Debian's "users"
IMAGE_CHANGES = (
    f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV SHELL=/bin/bash",
    f"USER {USER}",
    f"WORKDIR /home/{USER}",
)
IMAGE_CMD = ("jupyterhub-singleuser",)
# Removed from the base: nobody reads them in a container, and with the vfs storage
# driver every spawn copies the whole image.
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists")

# Bump when a step changes in a way the values above don't show (its commands, what it
# removes): the cache keys include them.
BASE_RECIPE = 1
IMAGE_RECIPE = 2

STEP_TIMEOUT = 900.0  # one debootstrap, download or install; each prints progress meanwhile
IMPORT_TIMEOUT = 600.0


class ImageError(swarm.HarnessError):
    """The image could not be built or imported."""


def _say(msg: str) -> None:
    swarm.progress(msg, tag="image")


def requirements() -> list[str]:
    """What the venv installs: the hub's own jupyterhub version, and JupyterLab."""
    return [f"jupyterhub=={importlib.metadata.version('jupyterhub')}", JUPYTERLAB]


def unavailable_reason() -> str | None:
    """Why the image cannot be built on this machine (None: it can)."""
    if os.geteuid() != 0:
        return "building the image needs root (debootstrap, chroot)"
    for tool in ("debootstrap", "chroot", "tar"):
        if shutil.which(tool, path=swarm.tool_env()["PATH"]) is None:
            return f"{tool} not found (apt-get install debootstrap)"
    return None


# --------------------------------------------------------------------------------------
# Keys and the cache
# --------------------------------------------------------------------------------------


def _key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _base_inputs() -> dict:
    return {
        "suite": SUITE,
        "packages": DEBIAN_PACKAGES,
        "trim": TRIM,
        "arch": platform.machine(),
        "recipe": BASE_RECIPE,
    }


def _image_inputs() -> dict:
    return {
        "base": _key(_base_inputs()),
        "requirements": requirements(),
        "venv": VENV,
        "user": [USER, UID, GID],
        "changes": IMAGE_CHANGES,
        "cmd": IMAGE_CMD,
        "recipe": IMAGE_RECIPE,
    }


class BuiltImage:
    def __init__(self, tar: Path, digest: str, seconds: float, cached: bool):
        self.tar, self.digest, self.seconds, self.cached = tar, digest, seconds, cached

    def __repr__(self) -> str:
        return f"BuiltImage({self.tar}, cached={self.cached})"


@contextlib.contextmanager
def _cache_lock(cache: Path) -> Iterator[None]:
    """One build at a time per cache (two test sessions may ask at once)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _prune(cache: Path, prefix: str, keep: str) -> None:
    """Remove older builds of a step (the key changed), keeping the current one."""
    for old in cache.glob(prefix + "-*"):
        if not old.name.startswith(f"{prefix}-{keep}"):
            shutil.rmtree(old) if old.is_dir() else old.unlink()


# --------------------------------------------------------------------------------------
# Running the steps, with progress
# --------------------------------------------------------------------------------------


def _stream(cmd: Sequence[str], what: str, *, every: float = 5.0, timeout: float = STEP_TIMEOUT) -> None:
    """Run a long command, showing its latest output line at most every ``every`` seconds,
    and a heartbeat when it has been quiet for a while (a slow step is visibly moving,
    without pages of output). On failure or timeout, raise with the last lines."""
    t0 = time.monotonic()
    last_shown = [t0]
    tail: deque[str] = deque(maxlen=40)
    done = threading.Event()
    proc = subprocess.Popen(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=swarm.tool_env(),
    )
    assert proc.stdout is not None

    def heartbeat() -> None:
        while not done.wait(every):
            now = time.monotonic()
            if now - t0 > timeout:
                proc.kill()  # a step that hangs is stopped, silent or not
            elif now - last_shown[0] >= 3 * every:
                _say(f"{what}: still working ({now - t0:.0f} s)")
                last_shown[0] = now

    watcher = threading.Thread(target=heartbeat, daemon=True)
    watcher.start()
    try:
        for line in proc.stdout:
            line = line.rstrip()
            if not line:
                continue
            tail.append(line)
            now = time.monotonic()
            if now - last_shown[0] >= every:
                _say(f"{what}: {line[:110]}")
                last_shown[0] = now
        proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        done.set()
        watcher.join()
    if time.monotonic() - t0 > timeout:
        raise ImageError(f"{what} took over {timeout:.0f} s and was stopped:\n" + "\n".join(tail))
    if proc.returncode != 0:
        raise ImageError(f"{what} failed ({proc.returncode}): {' '.join(cmd)}\n" + "\n".join(tail))


def _chroot(root: Path, *cmd: str) -> list[str]:
    # A clean environment: nothing of the host's (proxies, pip settings, PATH) leaks in.
    return ["chroot", str(root), "/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", *cmd]


def _build_base(cache: Path) -> Path:
    key = _key(_base_inputs())
    base = cache / f"base-{key}"
    if (base / ".complete").exists():
        return base
    _prune(cache, "base", key)
    work = cache / f"base-{key}.partial"
    shutil.rmtree(work, ignore_errors=True)
    _say(f"debootstrap {SUITE} (minbase + {', '.join(DEBIAN_PACKAGES)}) from {DEBIAN_MIRROR}")
    _stream(
        ["debootstrap", "--variant=minbase", "--include=" + ",".join(DEBIAN_PACKAGES), SUITE, str(work), DEBIAN_MIRROR],
        "debootstrap",
    )
    for rel in TRIM:
        for child in (work / rel).glob("*"):
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    (work / ".complete").touch()
    work.rename(base)
    return base


def platforms(glibc: str, machine: str) -> list[str]:
    """The wheel platforms an interpreter on this glibc and machine can use, newest
    first: pip takes ``--platform`` values literally, without the older ones they imply."""
    major, minor = (int(x) for x in glibc.split(".")[:2])
    if major != 2:
        raise ImageError(f"unexpected glibc version {glibc}")
    plats = [f"manylinux_2_{m}_{machine}" for m in range(minor, 4, -1)]
    plats += [f"manylinux{alias}_{machine}" for alias, m in (("2014", 17), ("2010", 12), ("1", 5)) if m <= minor]
    return plats + ["any"]


def _platform_tags(root: Path) -> tuple[str, list[str]]:
    """(python version, wheel platforms) of the image's interpreter, for pip download."""
    version, glibc, machine = subprocess.run(
        _chroot(
            root,
            "/usr/bin/python3",
            "-c",
            "import platform, sys; print('%d.%d' % sys.version_info[:2], platform.libc_ver()[1], platform.machine())",
        ),
        capture_output=True,
        text=True,
        check=True,
        env=swarm.tool_env(),
    ).stdout.split()
    return version, platforms(glibc, machine)


def _download_wheels(root: Path, cache: Path) -> Path:
    wheels = cache / "wheels"
    wheels.mkdir(exist_ok=True)
    version, plats = _platform_tags(root)
    _say(f"downloading wheels for Python {version} into {wheels} (kept for later builds)")
    abi = "cp" + version.replace(".", "")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--dest",
        str(wheels),
        "--only-binary=:all:",
        "--python-version",
        version,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
        "--progress-bar",
        "off",
        "--disable-pip-version-check",
    ]
    for p in plats:
        cmd += ["--platform", p]
    _stream(cmd + requirements(), "pip download")
    return wheels


def _tree_copy(src: Path, dest: Path) -> None:
    subprocess.run(["cp", "-a", "--", str(src), str(dest)], check=True)


def _cached(tar: Path, meta: Path, t0: float) -> BuiltImage | None:
    """The tar in the cache, if its record says it is complete."""
    try:
        info = json.loads(meta.read_text())
        if tar.stat().st_size == info["size"]:
            return BuiltImage(tar, info["digest"], time.monotonic() - t0, cached=True)
    except (OSError, ValueError, KeyError):
        pass
    return None


def _install(root: Path, cache: Path, t0: float) -> None:
    """The venv with the requirements and the user, in the root fs copied from the base."""
    wheels = _download_wheels(root, cache)
    _say(f"wheels ready ({time.monotonic() - t0:.0f} s); installing into {VENV}")
    inside = root / "tmp" / "wheels"
    _tree_copy(wheels, inside)
    _stream(_chroot(root, "/usr/bin/python3", "-m", "venv", VENV), "venv")
    pip_install = [f"{VENV}/bin/pip", "install", "--no-index", "--find-links", "/tmp/wheels", "--no-cache-dir"]
    _stream(
        _chroot(root, *pip_install, "--progress-bar", "off", "--disable-pip-version-check", *requirements()),
        "pip install",
    )
    shutil.rmtree(inside)
    # Not needed by a running server: pip and setuptools (the nodes have no route to
    # an index), and the hub's own web pages (jupyterhub-singleuser serves its
    # templates from the package).
    _stream(
        _chroot(root, f"{VENV}/bin/python", "-m", "pip", "uninstall", "--yes", "pip", "setuptools"),
        "pip uninstall",
    )
    shutil.rmtree(root / VENV.lstrip("/") / "share" / "jupyterhub")
    _stream(
        _chroot(root, "useradd", "--uid", str(UID), "--gid", str(GID), "--create-home", "--shell", "/bin/bash", USER),
        "useradd",
    )
    (root / ".complete").unlink(missing_ok=True)


def _write_tar(root: Path, dest: Path) -> None:
    # Ownership and mtimes are kept: /home/jovyan is jovyan's, and the .pyc files
    # stay valid only while their sources keep their mtimes.
    excludes = ["--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*"]
    _stream(["tar", "--numeric-owner", "--sort=name", *excludes, "-C", str(root), "-cf", str(dest), "."], "tar")


def build(cache_dir: Path | str | None = None) -> BuiltImage:
    """The image as a tar, from the cache or built now (printing progress)."""
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    t0 = time.monotonic()
    with _cache_lock(cache):
        key = _key(_image_inputs())
        tar, meta = cache / f"image-{key}.tar", cache / f"image-{key}.json"
        cached = _cached(tar, meta, t0)
        if cached is not None:
            return cached
        reason = unavailable_reason()
        if reason:
            raise ImageError(f"cannot build {JUPYTER_IMAGE}: {reason}")
        _say(f"building {JUPYTER_IMAGE} ({', '.join(requirements())}); cached in {cache} for later runs")
        base = _build_base(cache)
        _say(f"base ready ({time.monotonic() - t0:.0f} s)")
        root = cache / f"image-{key}.root"
        shutil.rmtree(root, ignore_errors=True)
        _tree_copy(base, root)
        partial = tar.with_suffix(".partial")
        try:
            _install(root, cache, t0)
            _say(f"installed ({time.monotonic() - t0:.0f} s); writing the image tar")
            _prune(cache, "image", key)  # the old tar goes before the new one is written
            _write_tar(root, partial)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        digest = _sha256(partial)
        partial.rename(tar)
        seconds = time.monotonic() - t0
        record = {"digest": digest, "size": tar.stat().st_size, "inputs": _image_inputs()}
        record.update(built=time.strftime("%Y-%m-%dT%H:%M:%S"), seconds=round(seconds, 1))
        meta.write_text(json.dumps(record, indent=2))
        _say(f"built {tar} ({tar.stat().st_size >> 20} MiB) in {seconds:.0f} s")
        return BuiltImage(tar, digest, seconds, cached=False)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ensure_on(cluster: swarm.Cluster, cache_dir: Path | str | None = None) -> str:
    """Build (or reuse) the image and import it on the workers that lack it; return its
    name. Only workers get it: the local config runs servers on workers only."""
    image = build(cache_dir)
    # The label covers the image settings too, so a changed USER or CMD is imported again.
    label = hashlib.sha256(json.dumps([image.digest, IMAGE_CHANGES, IMAGE_CMD]).encode()).hexdigest()
    t0 = time.monotonic()
    done = swarm.import_tar(
        cluster,
        JUPYTER_IMAGE,
        image.tar,
        cmd=IMAGE_CMD,
        changes=IMAGE_CHANGES,
        digest=label,
        nodes=cluster.workers,
        timeout=IMPORT_TIMEOUT,
    )
    if done:
        _say(f"imported on {', '.join(done)} in {time.monotonic() - t0:.0f} s")
    return JUPYTER_IMAGE


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.jupyter_image", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "import"])
    parser.add_argument("--cache-dir", default=None, help=f"default {DEFAULT_CACHE}")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            image = build(args.cache_dir)
            print(f"{image.tar} ({'cached' if image.cached else 'built'} in {image.seconds:.1f} s)")
        else:
            cluster, problems = swarm.status()
            if cluster is None or problems:
                raise ImageError("the swarm is not up: python -m devtools.swarm up")
            print(ensure_on(cluster, args.cache_dir))
    except swarm.HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
