"""The stop-notice file: when the hub announces a stop of this server (a borrowed GPU
taken back for a quota, an idle or held-time limit, a reservation), the file that
``GPUSPAWNER_STOP_NOTICE`` names appears with the stop time in it; it goes away when the
stop is withdrawn. A training loop can watch it and checkpoint, as a spot instance's
notice allows::

    2026-12-07T13:10:00Z
    preempted
    Your default server will be stopped at 13:10 UTC: ...

The server asks the hub (the status bar's answer, :func:`gpuspawner_lab.handlers.status`)
every 30 s while no stop is announced, every ``refresh_seconds`` (5 s at least) while one
is, whether or not a browser is open. A hub that cannot be asked
changes nothing: a notice once written stays until the hub says otherwise.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tornado.ioloop import IOLoop

from .handlers import status

__all__ = ["NOTICE_ENV", "notice_text", "watch", "write_notice"]

NOTICE_ENV = "GPUSPAWNER_STOP_NOTICE"
LEAST_SECONDS = 5.0  # never asked more often, whatever the hub says
QUIET_SECONDS = 30.0  # while no stop is announced: a hub with thousands of servers is asked less

log = logging.getLogger("gpuspawner_lab")


def notice_text(answer: dict) -> str | None:
    """The file's text for the hub's ``answer`` (the soonest announced stop); None: none."""
    notices = [n for n in answer.get("notices") or () if n.get("stop_at")]
    if not notices:
        return None
    n = min(notices, key=lambda n: n["stop_at"])
    return f"{n['stop_at']}\n{n.get('reason', '')}\n{n.get('message', '')}\n"


def write_notice(path: Path, text: str | None) -> bool:
    """Write ``text`` to ``path`` whole (a reader never sees half of it), or remove the
    file when None; True when the file changed."""
    old = path.read_text() if path.exists() else None
    if text == old:
        return False
    if text is None:
        path.unlink(missing_ok=True)
        return True
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)
    return True


async def _tick(path: Path) -> None:
    try:
        answer = await status()
    except Exception as exc:  # noqa: BLE001 - the server runs on; tried again at the next tick
        log.warning("gpuspawner-lab: the stop notice could not be read: %s", exc)
        answer = {"available": False}
    next_in = QUIET_SECONDS
    if answer.get("available"):
        try:
            text = notice_text(answer)
            refresh = float(answer.get("refresh_seconds") or LEAST_SECONDS)
            next_in = max(LEAST_SECONDS, refresh) if text else max(QUIET_SECONDS, refresh)
            if write_notice(path, text):
                log.info("gpuspawner-lab: %s %s", path, "written" if path.exists() else "removed")
        except (OSError, ValueError, TypeError, KeyError) as exc:  # (a file not ours, an odd answer): next time
            log.warning("gpuspawner-lab: the stop notice %s could not be written: %s", path, exc)
    IOLoop.current().call_later(next_in, lambda: IOLoop.current().spawn_callback(_tick, path))


def watch(env=os.environ) -> Path | None:
    """Start watching for stop notices (in the server's IOLoop) where the hub named a file."""
    name = env.get(NOTICE_ENV)
    if not name:
        return None
    path = Path(name)
    IOLoop.current().spawn_callback(_tick, path)
    return path
