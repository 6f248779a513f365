"""Test images: root file systems (a static busybox and its applets, or any directory)
as reproducible tars, ``docker import``-ed on every node (each daemon has its own image
store), skipped where the node already holds the same content."""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import os
import shutil
import struct
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker

from . import engine
from .errors import HarnessError
from .procs import run, which
from .progress import progress

if TYPE_CHECKING:
    from .cluster import Cluster, Node

TEST_IMAGE = "gpuspawner-test/busybox:latest"
# Label stored on imported images: sha256 of the imported tar, to tell a stale image.
ROOTFS_LABEL = "io.gpuspawner.test.rootfs-sha256"
IMPORT_TIMEOUT = 120.0

_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"
NO_BUSYBOX = "no static busybox found (apt-get install busybox-static)"


def find_busybox() -> str | None:
    for cand in (os.environ.get("GPUSPAWNER_BUSYBOX"), "/usr/bin/busybox", "/bin/busybox", which("busybox")):
        if cand and os.path.isfile(cand) and _is_static_elf(cand):
            return cand
    return None


def _is_static_elf(path: str) -> bool:
    """True for an ELF executable without a PT_INTERP (dynamic loader) segment."""
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            if ident[:4] != b"\x7fELF":
                return False
            is64, little = ident[4] == 2, ident[5] == 1
            end = "<" if little else ">"
            if is64:
                (phoff,) = struct.unpack_from(end + "Q", ident, 0x20)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 0x36)
            else:
                (phoff,) = struct.unpack_from(end + "I", ident, 0x1C)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 0x2A)
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                (p_type,) = struct.unpack(end + "I", f.read(4))
                if p_type == 3:  # PT_INTERP
                    return False
            return True
    except (OSError, struct.error):
        return False


def _busybox_entries(busybox: str) -> list[tuple[str, str, Any, int]]:
    """The busybox root fs as (path, kind, content, mode), kind "dir", "file" (content:
    bytes, or a source path) or "symlink" (content: target); parents before children."""
    entries: dict[str, tuple[str, str, Any, int]] = {}

    def add_dir(rel: str, mode: int = 0o755) -> None:
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in entries:
                entries[d] = (d, "dir", None, mode if i == len(parts) else 0o755)

    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "home", "proc", "sys", "dev", "var/www"):
        add_dir(d)
    add_dir("tmp", 0o1777)
    entries["bin/busybox"] = ("bin/busybox", "file", busybox, 0o755)
    for rel in run([busybox, "--list-full"]).stdout.split():
        rel = rel.strip("/")
        if not rel or "/" not in rel or rel in entries:  # skips e.g. "linuxrc"
            continue
        add_dir(rel.rsplit("/", 1)[0])
        entries[rel] = (rel, "symlink", "/bin/busybox", 0o777)
    entries["etc/passwd"] = ("etc/passwd", "file", _PASSWD.encode(), 0o644)
    entries["etc/group"] = ("etc/group", "file", _GROUP.encode(), 0o644)
    return [entries[k] for k in sorted(entries)]


def build_busybox_rootfs(dest: Path | str, busybox: str | None = None) -> Path:
    """Write a root file system with a static busybox and its applets as symlinks.

    ``dest`` is replaced. Layout: /bin/busybox, one symlink per applet where busybox
    installs it (/bin/sh, /usr/sbin/httpd, /usr/bin/env, ...), /etc/passwd and /etc/group
    (root, nobody), /tmp, /root, /var/www and the usual mount points. Add files to it and
    ``import_image`` it to make other test images.
    """
    busybox = busybox or find_busybox()
    if busybox is None:
        raise HarnessError(NO_BUSYBOX)
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for rel, kind, content, mode in _busybox_entries(busybox):
        path = dest / rel
        if kind == "dir":
            path.mkdir()
        elif kind == "symlink":
            path.symlink_to(content)
            continue
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            shutil.copyfile(content, path)
        os.chmod(path, mode)
    return dest


def _tarinfo(name: str, kind: str, mode: int, size: int = 0, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE}[kind]
    info.mode, info.size, info.linkname = mode, size, target
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def _busybox_tar(busybox: str) -> bytes:
    """The same root fs as build_busybox_rootfs, as a tar made in memory (faster than
    writing ~300 symlinks to disk on every ``up``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_tarinfo(".", "dir", 0o755))
        for rel, kind, content, mode in _busybox_entries(busybox):
            if kind == "file":
                data = content if isinstance(content, bytes) else Path(content).read_bytes()
                tar.addfile(_tarinfo("./" + rel, kind, mode, size=len(data)), io.BytesIO(data))
            else:
                tar.addfile(_tarinfo("./" + rel, kind, mode, target=content or ""))
    return buf.getvalue()


def _rootfs_tar(rootfs: Path) -> bytes:
    """A reproducible tar of a directory (sorted, owned by root, fixed mtime)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(path: Path) -> None:
            arcname = "./" + str(path.relative_to(rootfs)) if path != rootfs else "."
            info = tar.gettarinfo(str(path), arcname=arcname)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
            if path.is_dir() and not path.is_symlink():
                for child in sorted(path.iterdir()):
                    add(child)

        add(rootfs)
    return buf.getvalue()


def _image_label(c: docker.DockerClient, name: str) -> str | None:
    try:
        return c.images.get(name).labels.get(ROOTFS_LABEL)
    except docker.errors.ImageNotFound:
        return None


def import_image(
    cluster: Cluster,
    name: str,
    rootfs_dir: Path | str,
    *,
    cmd: Sequence[str] = ("/bin/sh",),
    force: bool = False,
) -> list[str]:
    """``docker import`` a root fs directory as ``name`` on every node (each daemon has its
    own image store); return the hostnames it was imported on.

    Nodes that already have ``name`` made from the same content are skipped (the content
    hash is kept in the image label ``io.gpuspawner.test.rootfs-sha256``).
    """
    return import_tar(cluster, name, _rootfs_tar(Path(rootfs_dir)), cmd=cmd, force=force)


def import_tar(
    cluster: Cluster,
    name: str,
    tar: bytes | Path,
    *,
    cmd: Sequence[str] = ("/bin/sh",),
    force: bool = False,
    digest: str | None = None,
    changes: Sequence[str] = (),
    nodes: Sequence[Node] | None = None,
    timeout: float = IMPORT_TIMEOUT,
) -> list[str]:
    """Import ``tar`` (bytes, or the path of a tar file, read only if a node needs it) as
    ``name`` on ``nodes`` (default: every node). ``digest`` (default: the tar's sha256)
    is kept in the image label; a node whose image has it already is skipped.
    ``changes`` are Dockerfile instructions added to the default ENV PATH and CMD."""
    repo, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
    if digest is None:
        digest = hashlib.sha256(tar if isinstance(tar, bytes) else Path(tar).read_bytes()).hexdigest()
    changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"CMD {json.dumps(list(cmd))}",
        *changes,
        f"LABEL {ROOTFS_LABEL}={digest}",
    ]
    candidates = nodes if nodes is not None else cluster.nodes.values()
    targets = [n for n in candidates if force or _label(n, name) != digest]
    if not targets:
        return []
    data = tar if isinstance(tar, bytes) else Path(tar).read_bytes()
    if len(data) > 50 << 20:  # a big one takes a while: say so first
        progress(f"importing {name} ({len(data) >> 20} MiB) on {', '.join(n.hostname for n in targets)}")

    def one(node: Node) -> str:
        try:
            with engine.connected(node.docker_url) as c:
                out = engine.import_tar(c, data, repo, tag, changes, timeout)
                # Errors can come back as JSON messages in a 200 answer: check the result instead.
                label = _image_label(c, name)
        except engine.ENGINE_ERRORS as e:
            raise HarnessError(f"import of {name} on {node.hostname} failed: {engine.describe(e)}") from e
        if label != digest:
            raise HarnessError(f"import of {name} on {node.hostname} failed: {out[-2000:]}")
        return node.hostname

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(targets)) as pool:
        done = list(pool.map(one, targets))
    progress(f"imported {name} ({len(data) // 1024} KiB) on {', '.join(done)}")
    return done


def _label(node: Node, name: str) -> str | None:
    try:
        with engine.connected(node.docker_url) as c:
            return _image_label(c, name)
    except engine.ENGINE_ERRORS as e:
        raise HarnessError(f"inspecting {name} on {node.hostname}: {engine.describe(e)}") from e


def ensure_test_image(cluster: Cluster) -> list[str]:
    """Make sure ``TEST_IMAGE`` (busybox) is on every node; return the nodes imported to."""
    busybox = find_busybox()
    if busybox is None:
        raise HarnessError(NO_BUSYBOX)
    return import_tar(cluster, TEST_IMAGE, _busybox_tar(busybox))
