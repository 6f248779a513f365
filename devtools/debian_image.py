"""Images without a registry: a small Debian from debootstrap, a venv, ``docker import``.

A :class:`Recipe` says what goes in: Debian packages (the base), Python requirements
installed into a venv from wheels the host's pip downloads (``pip download --platform
...`` for the image's Python and glibc: the host's index, proxy and certificates apply,
and the chroot needs no network), files copied in, a user, and the Dockerfile-style
settings (``ENV``, ``WORKDIR``, ``USER``, ``CMD``) that ``docker import`` gives the image.
devtools/jupyter_image.py (the servers) and devtools/stack_images.py (the production
stack's hub and database) are recipes.

Why debootstrap, and not the host's Python copied in: the machines this runs on have
every kind of Python (Debian's, pyenv's, /usr/local builds), and an interpreter copied
out of one of them needs its shared libraries and prefix hunted down by hand.
debootstrap makes the same small Debian everywhere, from Debian's own mirror with apt's
signature checks.

Cache (``cache_dir``, default /var/cache/gpuspawner-image, env ``GPUSPAWNER_IMAGE_CACHE``)::

    base-<key>/        debootstrap output, docs and apt lists removed   (cold: 1.5-2 min)
    wheels/            downloaded wheels, reused by later builds         (about 30 s)
    image-<key>.tar    base + venv + files + user, ready for ``docker import``
    image-<key>.json   the tar's digest, the inputs, the build time

Each key is a sha256 of that step's inputs (the recipe's values, and a recipe number
bumped when the steps change). A second run with the same inputs builds nothing, and a
node that already holds the image (same digest in its label) gets no import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from . import swarm

__all__ = ["DEFAULT_CACHE", "BuiltImage", "ImageError", "Recipe", "build", "ensure_on", "unavailable_reason"]

DEFAULT_CACHE = Path(os.environ.get("GPUSPAWNER_IMAGE_CACHE", "/var/cache/gpuspawner-image"))
DEBIAN_MIRROR = os.environ.get("GPUSPAWNER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "bookworm"
# Removed from the base: nobody reads them in a container, and with the vfs storage
# driver every container start copies the whole image.
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists")

# Bump when a step changes in a way the recipe's values don't show (its commands, what
# it removes): the cache keys include them.
BASE_RECIPE = 1
STEP_TIMEOUT = 900.0  # one debootstrap, download or install; each prints progress meanwhile
IMPORT_TIMEOUT = 600.0


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What one image is made of."""

    name: str  # e.g. gpuspawner-test/jupyter:latest
    packages: tuple[str, ...]  # Debian packages of the base (debootstrap --include)
    # What provides a virtual package that one of them depends on: debootstrap does not
    # resolve those (apt does, e.g. in a Dockerfile).
    providers: tuple[str, ...] = ()
    requirements: tuple[str, ...] = ()  # pip requirements for the venv (none: no venv)
    venv: str = "/opt/venv"
    changes: tuple[str, ...] = ()  # Dockerfile instructions for docker import (ENV, USER, ...)
    cmd: tuple[str, ...] = ("/bin/sh",)
    user: tuple[str, int, int] | None = None  # (name, uid, gid) added with useradd
    files: tuple[tuple[str, Path, int], ...] = ()  # (path in the image, source, mode)
    drop: tuple[str, ...] = ()  # paths removed after the install (not needed at run time)
    wheel_source: Path | None = None  # a project built with `pip wheel` and offered to pip
    prepare: Callable[[], object] | None = None  # run before that, when the image is built (not when cached)
    source_key: str = ""  # what the wheel_source and files hold (the caller's hash)
    recipe: int = 1  # bumped when this image's steps change

    def base_inputs(self) -> dict:
        return {
            "suite": SUITE,
            "packages": self.packages,
            "trim": TRIM,
            "arch": platform.machine(),
            "recipe": BASE_RECIPE,
        }

    def image_inputs(self) -> dict:
        fields = dataclasses.asdict(self)
        fields.pop("wheel_source")
        fields.pop("prepare")
        fields["files"] = [[path, mode] for path, _, mode in self.files]
        return {"base": key(self.base_inputs()), **fields}

    @property
    def slug(self) -> str:
        """The image's short name, in its cache files: gpuspawner-test/jupyter:latest -> jupyter."""
        return self.name.rsplit("/", 1)[-1].split(":")[0]

    def import_label(self, digest: str) -> str:
        """The label kept on imported images: it covers the settings too, so that a
        changed USER or CMD is imported again."""
        return hashlib.sha256(json.dumps([digest, self.changes, self.cmd]).encode()).hexdigest()


class ImageError(swarm.HarnessError):
    """The image could not be built or imported."""


def _say(msg: str) -> None:
    swarm.progress(msg, tag="image")


def unavailable_reason() -> str | None:
    """Why images cannot be built on this machine (None: they can)."""
    if os.geteuid() != 0:
        return "building the image needs root (debootstrap, chroot)"
    for tool in ("debootstrap", "chroot", "tar"):
        if shutil.which(tool, path=swarm.tool_env()["PATH"]) is None:
            return f"{tool} not found (apt-get install debootstrap)"
    return None


def key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


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


def stream(cmd: Sequence[str], what: str, *, every: float = 5.0, timeout: float = STEP_TIMEOUT) -> None:
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


def _build_base(recipe: Recipe, cache: Path) -> Path:
    base_key = key(recipe.base_inputs())
    base = cache / f"base-{recipe.slug}-{base_key}"
    if (base / ".complete").exists():
        return base
    _prune(cache, f"base-{recipe.slug}", base_key)
    work = cache / f"base-{recipe.slug}-{base_key}.partial"
    shutil.rmtree(work, ignore_errors=True)
    packages = recipe.packages + recipe.providers
    _say(f"debootstrap {SUITE} (minbase + {', '.join(packages)}) from {DEBIAN_MIRROR}")
    stream(
        ["debootstrap", "--variant=minbase", "--include=" + ",".join(packages), SUITE, str(work), DEBIAN_MIRROR],
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


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args, "--progress-bar", "off", "--disable-pip-version-check"]


def _download_wheels(recipe: Recipe, root: Path, cache: Path, local: Path) -> Path:
    wheels = cache / "wheels"
    wheels.mkdir(exist_ok=True)
    version, plats = _platform_tags(root)
    _say(f"downloading wheels for Python {version} into {wheels} (kept for later builds)")
    abi = "cp" + version.replace(".", "")
    cmd = _pip("download", "--dest", str(wheels), "--find-links", str(local), "--only-binary=:all:")
    cmd += ["--python-version", version, "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for p in plats:
        cmd += ["--platform", p]
    stream(cmd + list(recipe.requirements), "pip download")
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


def _install_venv(recipe: Recipe, root: Path, cache: Path, t0: float) -> None:
    """The venv with the recipe's requirements (and its own project's wheel, if any)."""
    with tempfile.TemporaryDirectory(dir=cache) as local:
        if recipe.prepare is not None:
            recipe.prepare()
        if recipe.wheel_source is not None:
            stream(_pip("wheel", "--no-deps", "-w", local, str(recipe.wheel_source)), "pip wheel")
        wheels = _download_wheels(recipe, root, cache, Path(local))
        _say(f"wheels ready ({time.monotonic() - t0:.0f} s); installing into {recipe.venv}")
        inside = root / "tmp" / "wheels"
        _tree_copy(wheels, inside)
        for wheel in Path(local).iterdir():
            shutil.copy(wheel, inside)
    stream(_chroot(root, "/usr/bin/python3", "-m", "venv", recipe.venv), "venv")
    pip_install = [f"{recipe.venv}/bin/pip", "install", "--no-index", "--find-links", "/tmp/wheels", "--no-cache-dir"]
    stream(
        _chroot(root, *pip_install, "--progress-bar", "off", "--disable-pip-version-check", *recipe.requirements),
        "pip install",
    )
    shutil.rmtree(inside)
    # Not needed at run time: pip and setuptools (the nodes have no route to an index).
    stream(_chroot(root, f"{recipe.venv}/bin/python", "-m", "pip", "uninstall", "--yes", "pip", "setuptools"), "pip")


def _install(recipe: Recipe, root: Path, cache: Path, t0: float) -> None:
    """The venv, the files, the user, in the root fs copied from the base."""
    if recipe.requirements:
        _install_venv(recipe, root, cache, t0)
    for rel in recipe.drop:
        shutil.rmtree(root / rel.lstrip("/"))
    for target, source, mode in recipe.files:
        dest = root / target.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
        os.chmod(dest, mode)
    if recipe.user:
        name, uid, gid = recipe.user
        useradd = ["useradd", "--uid", str(uid), "--gid", str(gid), "--create-home", "--shell", "/bin/bash", name]
        stream(_chroot(root, *useradd), "useradd")
    # After useradd, which leaves an existing home (here: root's) as it is.
    for change in recipe.changes:  # docker does not make a missing WORKDIR of an imported image
        if change.startswith("WORKDIR "):
            (root / change.split(" ", 1)[1].lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / ".complete").unlink(missing_ok=True)


def _write_tar(root: Path, dest: Path) -> None:
    # Ownership and mtimes are kept: a user's home is theirs, and the .pyc files
    # stay valid only while their sources keep their mtimes.
    excludes = ["--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*"]
    stream(["tar", "--numeric-owner", "--sort=name", *excludes, "-C", str(root), "-cf", str(dest), "."], "tar")


def image_files(recipe: Recipe, cache: Path) -> tuple[Path, Path]:
    """Where the recipe's tar and its record are kept in the cache."""
    stem = f"image-{recipe.slug}-{key(recipe.image_inputs())}"
    return cache / f"{stem}.tar", cache / f"{stem}.json"


def build(recipe: Recipe, cache_dir: Path | str | None = None) -> BuiltImage:
    """The image as a tar, from the cache or built now (printing progress)."""
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    t0 = time.monotonic()
    with _cache_lock(cache):
        image_key = key(recipe.image_inputs())
        tar, meta = image_files(recipe, cache)
        cached = _cached(tar, meta, t0)
        if cached is not None:
            return cached
        reason = unavailable_reason()
        if reason:
            raise ImageError(f"cannot build {recipe.name}: {reason}")
        _say(f"building {recipe.name} ({', '.join(recipe.requirements or recipe.packages)}); cached in {cache}")
        base = _build_base(recipe, cache)
        _say(f"base ready ({time.monotonic() - t0:.0f} s)")
        root = cache / f"image-{recipe.slug}-{image_key}.root"
        shutil.rmtree(root, ignore_errors=True)
        _tree_copy(base, root)
        partial = tar.with_suffix(".partial")
        try:
            _install(recipe, root, cache, t0)
            _say(f"installed ({time.monotonic() - t0:.0f} s); writing the image tar")
            _prune(cache, f"image-{recipe.slug}", image_key)  # the old tar goes before the new one is written
            _write_tar(root, partial)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        digest = _sha256(partial)
        partial.rename(tar)
        seconds = time.monotonic() - t0
        record = {"digest": digest, "size": tar.stat().st_size, "inputs": recipe.image_inputs()}
        record.update(built=time.strftime("%Y-%m-%dT%H:%M:%S"), seconds=round(seconds, 1))
        meta.write_text(json.dumps(record, indent=2, default=str))
        _say(f"built {tar} ({tar.stat().st_size >> 20} MiB) in {seconds:.0f} s")
        return BuiltImage(tar, digest, seconds, cached=False)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ensure_on(cluster: swarm.Cluster, recipe: Recipe, cache_dir: Path | str | None = None) -> str:
    """Build (or reuse) the image and import it on the workers that lack it; return its
    name. Only workers get it: the local stacks run everything on workers (the manager
    shares this machine's network namespace)."""
    image = build(recipe, cache_dir)
    t0 = time.monotonic()
    done = swarm.import_tar(
        cluster,
        recipe.name,
        image.tar,
        cmd=recipe.cmd,
        changes=recipe.changes,
        digest=recipe.import_label(image.digest),
        nodes=cluster.workers,
        timeout=IMPORT_TIMEOUT,
    )
    if done:
        _say(f"imported {recipe.name} on {', '.join(done)} in {time.monotonic() - t0:.0f} s")
    return recipe.name
