"""gpuspawner's JupyterLab extension: the server's GPUs in JupyterLab's status bar.

Two halves, one package: a prebuilt JupyterLab extension (``labextension/src``,
built with JupyterLab's own tooling into ``gpuspawner_lab/labextension``) and a
Jupyter server extension (:mod:`gpuspawner_lab.handlers`) that serves it the
server's GPUs, asked of the hub with the server's own token, and writes the
stop-notice file (:mod:`gpuspawner_lab.notice`), and under a hub it has JupyterHub's own
client look the hub's address up afresh (:mod:`gpuspawner_lab.hub_lookups`).
"""

from __future__ import annotations

import os

__all__ = ["__version__"]

__version__ = "0.1.0"


def _jupyter_labextension_paths() -> list[dict]:
    return [{"src": "labextension", "dest": "gpuspawner-lab"}]


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "gpuspawner_lab"}]


def _load_jupyter_server_extension(server_app) -> None:
    from .handlers import setup_handlers  # noqa: PLC0415 - only where a Jupyter server runs
    from .hub_lookups import look_hub_up_afresh  # noqa: PLC0415
    from .notice import watch  # noqa: PLC0415

    setup_handlers(server_app.web_app)
    server_app.log.info("gpuspawner-lab: the status bar shows this server's GPUs")
    if os.environ.get("JUPYTERHUB_API_URL"):
        look_hub_up_afresh(server_app.io_loop, server_app.log)
    path = watch()
    if path is not None:
        server_app.log.info("gpuspawner-lab: a stop the hub announces is written to %s", path)
