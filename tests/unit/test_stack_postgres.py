"""The stack's PostgreSQL stand-in (devtools/stack_files/postgres-entrypoint.sh) run here,
without docker: the script as the image runs it, on this machine's PostgreSQL binaries
(devtools/postgres.py finds them), its data in a folder of its own and the server on
loopback only (its extra arguments, as the official image's command takes them).

A client stays connected all along, as the hub's connection pool does. The stop signals
then do what they do in the official image, where the server is the container's process 1:
SIGTERM waits for that client, SIGINT ends it and stops at once, cleanly."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from devtools import postgres, stack_images
from tests.ci import skip_or_fail

SCRIPT = stack_images.REPO / "devtools" / "stack_files" / "postgres-entrypoint.sh"
PASSWORD = "stand-in-password"
# What PostgreSQL logs at a start after a stop that was not clean (the stack test reads the
# new container's log for these).
NOT_CLEAN = ("database system was not properly shut down", "automatic recovery in progress")


class StandIn:
    """The entrypoint's server, started and stopped as a container's process 1 would be."""

    def __init__(self, base: Path):
        self.base, self.port, self.starts = base, postgres._free_port(), 0
        (base / "password").write_text(PASSWORD + "\n")
        self.env = {
            "PATH": f"{postgres.bin_dir()}:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "PGDATA": str(base / "data"),
            "POSTGRES_USER": "jupyterhub",
            "POSTGRES_DB": "jupyterhub",
            "POSTGRES_PASSWORD_FILE": str(base / "password"),
        }
        self.proc: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.base / f"start-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        options = ["-c", "listen_addresses=127.0.0.1", "-c", f"port={self.port}"]
        options += ["-c", f"unix_socket_directories={self.base}", "-c", "fsync=off"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(["sh", str(SCRIPT), *options], env=self.env, stdout=out, stderr=out)
        deadline = time.monotonic() + 90
        while not self.ready():
            assert self.proc.poll() is None, f"the server ended at its start:\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"not ready within 90 s:\n{self.log.read_text()}"
            time.sleep(0.2)

    def ready(self) -> bool:
        ping = [str(postgres.bin_dir() / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)]
        return subprocess.run(ping, timeout=10).returncode == 0

    def client(self):
        """A connection over TCP with the password, held open (the hub's pool)."""
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="jupyterhub", password=PASSWORD, dbname="jupyterhub"
        )

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def ended(self, within: float) -> int | None:
        """The server's exit status, or None if it still runs after ``within`` seconds."""
        assert self.proc is not None
        try:
            return self.proc.wait(within)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # immediate shutdown: every backend goes
            self.ended(30)


@pytest.fixture
def stand_in():
    reason = postgres.unavailable_reason()
    if reason:
        skip_or_fail(reason)
    if os.geteuid() != 0:
        skip_or_fail("the entrypoint runs as root (a container's), to start the server as postgres")
    # Not under pytest's tmp_path: its parents are 0700 root, out of reach of 'postgres'.
    base = Path(tempfile.mkdtemp(prefix="gpuspawner-stand-in-"))
    base.chmod(0o755)
    owner = pwd.getpwnam("postgres")
    os.chown(base, owner.pw_uid, owner.pw_gid)
    server = StandIn(base)
    try:
        yield server
    finally:
        server.kill()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_sigint_stops_the_stand_in_at_once_and_cleanly_and_sigterm_waits_for_clients(stand_in):
    """Guards docs/deploy.md, "How a database restart behaves": "The database's service stops
    with SIGINT, PostgreSQL's fast shutdown: it ends the hub's connections, writes a checkpoint
    and exits in seconds, and the next start needs no recovery" and "Docker's default, SIGTERM,
    is PostgreSQL's smart shutdown, which waits for every client to disconnect"."""
    stand_in.start()  # the first start makes the cluster, its user and database
    held = stand_in.client()
    assert held.execute("SELECT current_user").fetchone() == ("jupyterhub",)

    # SIGTERM (docker's default): smart shutdown, which waits for the open connection.
    stand_in.signal(signal.SIGTERM)
    assert stand_in.ended(within=3) is None, "a smart shutdown does not end a client's connection"
    assert "received smart shutdown request" in stand_in.log.read_text()
    held.close()
    assert stand_in.ended(within=30) == 0

    # SIGINT (stack.yml's stop_signal): fast shutdown, with a client still connected.
    stand_in.start()
    assert all(line not in stand_in.log.read_text() for line in NOT_CLEAN)
    held = stand_in.client()
    held.execute("CREATE TABLE kept (x int)")
    held.commit()
    t0 = time.monotonic()
    stand_in.signal(signal.SIGINT)
    assert stand_in.ended(within=20) == 0
    seconds = time.monotonic() - t0
    assert seconds < 10, f"{seconds:.1f} s"
    log = stand_in.log.read_text()
    assert "received fast shutdown request" in log and "database system is shut down" in log
    assert "checkpoint starting: shutdown immediate" in log
    held.close()

    # The next start needs no recovery, and has what was written.
    stand_in.start()
    log = stand_in.log.read_text()
    assert all(line not in log for line in NOT_CLEAN), log
    with stand_in.client() as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    stand_in.signal(signal.SIGINT)
    assert stand_in.ended(within=20) == 0


def test_a_start_after_a_stop_that_was_not_clean_says_so_in_the_words_the_stack_test_reads(stand_in):
    """The stack test reads the new database container's log for these lines: they are what
    PostgreSQL writes when it must recover (here after an immediate shutdown, as after a
    SIGKILL at the end of the grace)."""
    stand_in.start()
    stand_in.signal(signal.SIGQUIT)
    assert stand_in.ended(within=20) is not None
    stand_in.start()
    log = stand_in.log.read_text()
    assert all(line in log for line in NOT_CLEAN), log
