"""The body gpuspawner-agent posts: NVML's readings plus who sends them, how often,
and what the node's dockerd runs containers with."""

from __future__ import annotations

import json
from pathlib import Path

from .._version import __version__
from ..core.enforcement import look


def docker_default_runtime(path: str | None) -> str | None:
    """dockerd's default runtime as the node's daemon.json sets it ("runc" when
    it sets none), for ``gpuspawner doctor``; None when the file cannot be read
    (e.g. not mounted into the agent's container): then nothing is judged."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    runtime = data.get("default-runtime") if isinstance(data, dict) else None
    return runtime[:64] if isinstance(runtime, str) and runtime else "runc"


def encode_report(
    report: dict,
    hostname: str,
    interval: float,
    docker_config: str | None = None,
    enforcement: tuple[str, str] | None = None,
) -> bytes:
    """The request body: the probe's report plus who sends it, how often, what the
    node's dockerd runs containers with, and what enforces shares there
    (``enforcement``: the MPS pipe directory and HAMi-core's library, to look at)."""
    body = dict(
        report,
        hostname=hostname,
        interval=interval,
        agent_version=__version__,
        docker_default_runtime=docker_default_runtime(docker_config),
    )
    if enforcement is not None:
        body["share_enforcement"] = look(*enforcement)
    return json.dumps(body, separators=(",", ":")).encode()
