"""Where one cluster's files live: the state dir (kept between runs) and the run dir
(sockets, pid files, exec roots)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

DEFAULT_STATE_DIR = Path(os.environ.get("GPUSPAWNER_SWARM_STATE_DIR", "/var/lib/gpuspawner-swarm"))
DEFAULT_RUN_DIR = Path(os.environ.get("GPUSPAWNER_SWARM_RUN_DIR", "/run/gpuspawner-swarm"))


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one cluster's files live. ``<name>`` is "manager" or a worker's hostname."""

    state_dir: Path
    run_dir: Path

    @property
    def state_file(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def daemon_json(self) -> Path:
        return self.state_dir / "daemon.json"

    @property
    def resolv_conf(self) -> Path:
        return self.state_dir / "resolv.conf"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    def data_root(self, name: str) -> Path:
        return self.state_dir / "nodes" / name

    def exec_root(self, name: str) -> Path:
        return self.run_dir / name

    def pidfile(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def sock(self, name: str) -> Path:
        return self.run_dir / f"{name}.sock"

    def log(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"


def layout(state_dir: Path | str | None, run_dir: Path | str | None) -> Layout:
    state = Path(state_dir) if state_dir is not None else DEFAULT_STATE_DIR
    if run_dir is None:
        run_dir = DEFAULT_RUN_DIR if state == DEFAULT_STATE_DIR else state / "run"
    return Layout(state.absolute(), Path(run_dir).absolute())
