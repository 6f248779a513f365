"""A real PostgreSQL server of its own for tests, from Debian's ``postgresql`` package.

``initdb`` makes a fresh cluster in a temporary directory (as the ``postgres`` user when
run as root: the server refuses to run as root), password authentication only, and the
server listens on 127.0.0.1 at a free port and on a unix socket in that directory, never
on another address. ``stop()`` and ``start()`` may be called mid-test (the database going
away and coming back); ``destroy()`` stops it and removes everything.

Usage::

    from devtools import postgres
    reason = postgres.unavailable_reason()        # None when this machine can run one
    server = postgres.PostgresServer.create()     # initdb + start, about 1-2 s
    url = server.create_database("ledger_1")      # postgresql+psycopg://gpuspawner:...@127.0.0.1:PORT/ledger_1
    server.stop(); server.start()
    server.destroy()

This module only needs the standard library; ``create_database`` imports psycopg.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "gpuspawner"  # the cluster's superuser, with a random password


class PostgresError(Exception):
    pass


def bin_dir() -> Path | None:
    """The newest installed server's binaries (Debian keeps them off PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def unavailable_reason() -> str | None:
    """Why this machine can't run a test server (None if it can)."""
    if bin_dir() is None:
        return "no PostgreSQL server binaries (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root but there is no 'postgres' user to run the server as (apt-get install postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the psycopg driver is not installed (pip install 'psycopg[binary]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, base: Path, port: int, password: str):
        self.base = base
        self.data = base / "data"
        self.log = base / "server.log"
        self.port = port
        self.password = password
        self._bin = bin_dir()
        self._owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    @classmethod
    def create(cls) -> PostgresServer:
        reason = unavailable_reason()
        if reason:
            raise PostgresError(reason)
        # Not under pytest's tmp_path: its parents are 0700 root, out of reach of 'postgres'.
        base = Path(tempfile.mkdtemp(prefix="gpuspawner-pg-"))
        server = cls(base, _free_port(), secrets.token_urlsafe(16))
        try:
            server._initdb()
            for attempt in range(3):
                try:
                    server.start()
                    break
                except PostgresError:
                    if attempt == 2:
                        raise
                    server.port = _free_port()  # another process took the free port meanwhile
        except BaseException:
            server.destroy()
            raise
        return server

    def _run(self, *args: str, timeout: float = 60) -> None:
        kwargs = {}
        if self._owner is not None:
            kwargs = {"user": self._owner.pw_uid, "group": self._owner.pw_gid, "extra_groups": []}
        done = subprocess.run(
            [str(self._bin / args[0]), *args[1:]],
            cwd=self.base,
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,
        )
        if done.returncode != 0:
            raise PostgresError(
                f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}\n{self.log_tail()}"
            )

    def _initdb(self) -> None:
        pwfile = self.base / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._owner is not None:
            for path in (self.base, pwfile):
                os.chown(path, self._owner.pw_uid, self._owner.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        pwfile.unlink()

    def start(self) -> None:
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-c port={self.port}",
                f"-c unix_socket_directories={self.base}",
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off",
                "-c max_connections=50 -c shared_buffers=16MB",
            ]
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "30", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; "fast" ends every client's connection, as a stopped service would."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url().replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "server log:\n" + "\n".join(self.log.read_text().splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def destroy(self) -> None:
        try:
            if self.running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
