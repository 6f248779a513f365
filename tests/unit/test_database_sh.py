"""examples/stack/database.sh, backup and restore, run here: its ``docker`` is a stand-in
that finds the database's container (``docker ps``) and runs the command given to ``docker
exec`` on this machine, against a PostgreSQL server of its own (devtools/postgres.py) with
the stack's role and database. What an admin sees on the terminal is the script's output."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from devtools import postgres
from tests.ci import skip_or_fail

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "stack" / "database.sh"
FAKE_DOCKER = """#!/bin/sh
# docker ps -q -f label=...: the database's container; docker exec [-i] ID CMD...: CMD here.
case "$1" in
  ps) echo c0ffee ;;
  exec) shift; [ "$1" = -i ] && shift; shift; exec "$@" ;;
  *) echo "docker $*: not in this stand-in" >&2; exit 2 ;;
esac
"""


@pytest.fixture(scope="module")
def server():
    reason = postgres.unavailable_reason()
    if reason:
        skip_or_fail(reason)
    server = postgres.PostgresServer.create()
    try:
        import psycopg

        with psycopg.connect(server.url().replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute("CREATE ROLE jupyterhub SUPERUSER LOGIN PASSWORD 'db-sh-test'")
            conn.execute("CREATE DATABASE jupyterhub OWNER jupyterhub")
        yield server
    finally:
        server.destroy()


def run(server, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    env = {
        "PATH": f"{bin_dir}:{postgres.bin_dir()}:/usr/bin:/bin",
        "PGHOST": "127.0.0.1",
        "PGPORT": str(server.port),
        "PGPASSWORD": "db-sh-test",
    }
    return subprocess.run(["sh", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def sql(server, query: str) -> list[tuple]:
    import psycopg

    url = server.url("jupyterhub").replace("+psycopg", "")
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(query)
        return cursor.fetchall() if cursor.description else []


def test_a_backup_is_private_and_a_restore_prints_one_line_and_brings_the_data_back(server, tmp_path):
    sql(server, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (1)")
    dump = tmp_path / "backup.sql"
    backup = run(server, tmp_path, "backup", str(dump))
    assert backup.returncode == 0, backup.stderr
    assert stat.S_IMODE(os.stat(dump).st_mode) == 0o600
    assert backup.stdout == f"backed up to {dump} ({dump.stat().st_size} bytes)\n"
    sql(server, "INSERT INTO kept VALUES (2)")  # after the backup: the restore drops it

    restored = run(server, tmp_path, "restore", str(dump))
    assert restored.returncode == 0, restored.stderr
    # One line: not the results of the dump's own queries (its set_config calls).
    assert restored.stdout == f"restored from {dump}\n"
    assert restored.stderr == ""
    assert sql(server, "SELECT x FROM kept ORDER BY x") == [(1,)]


def test_a_restore_that_fails_says_why_and_exits_non_zero(server, tmp_path):
    bad = tmp_path / "bad.sql"
    bad.write_text("CREATE TABLE t (x int);\nTHIS IS NOT SQL;\n")
    restored = run(server, tmp_path, "restore", str(bad))
    assert restored.returncode != 0 and "syntax error" in restored.stderr
    assert "restored from" not in restored.stdout
