"""Commands and processes: running tools with a bounded wait, and finding, signalling
and waiting for processes through /proc."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import HarnessError

CMD_TIMEOUT = 30.0
KILL_WAIT = 30.0  # a SIGKILLed process in uninterruptible I/O takes a while on a busy machine


def run(cmd: Sequence[str], *, check: bool = True, timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(
            list(cmd), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, env=tool_env()
        )
    except subprocess.TimeoutExpired as e:
        raise HarnessError(f"command timed out after {timeout:.0f}s: {' '.join(cmd)}") from e
    if check and proc.returncode != 0:
        raise HarnessError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()}")
    return proc


def tool_env() -> dict[str, str]:
    """Environment for dockerd and tools: make sure the sbin dirs are on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    path = env.get("PATH", "").split(os.pathsep)
    for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if d not in path:
            path.append(d)
    env["PATH"] = os.pathsep.join(p for p in path if p)
    return env


def which(name: str) -> str | None:
    return shutil.which(name, path=tool_env()["PATH"])


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) of a process, or None if it doesn't exist."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may contain spaces and parens: split after the last ')'.
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def alive(pid: int) -> bool:
    st = proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        # Zombies count as dead; reap the ones that are our own children.
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def descendants(roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        st = proc_stat(pid)
        if st:
            children.setdefault(st[1], []).append(pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        for child in children.get(pid, ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def send_signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_dead(pids: Iterable[int], timeout: float) -> set[int]:
    """Wait until all pids are gone; return the ones still alive at the deadline."""
    pending = {p for p in pids if p != os.getpid()}
    deadline = time.monotonic() + timeout
    while True:
        pending = {p for p in pending if alive(p)}
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.1)
