"""JupyterHub's ERROR lines about an ordinary refusal are left out of the hub's log (gpuspawner
logs it once, below ERROR: test_refusal_logs_hub.py, in a real hub); a fault stays an ERROR
with its traceback. Logged the way JupyterHub logs them: inside its except blocks, through
the hub's own logger (a logger of that name, not a running hub)."""

from __future__ import annotations

import logging

import pytest

from gpuspawner.allocator.refusals import NOT_NOW
from gpuspawner.hub.logs import OrdinaryRefusals, quiet_ordinary_refusals
from gpuspawner.spawn.errors import spawn_error

NONE_FREE = "No NVIDIA A100 80GB PCIe is free right now (0 of 2 free)"


def test_configure_quiets_the_hubs_logger_and_tornados_which_jupyterhubs_users_log_through():
    from tornado.log import app_log
    from traitlets.config import Config

    from gpuspawner.hubconfig import configure

    c = Config()
    c.GPUSwarmSpawner.gpu_inventory = {"gpu-a": [{"uuid": "GPU-a0", "model": "A100", "memory_mib": 1024}]}
    configure(c)
    for logger in (logging.getLogger("JupyterHub"), app_log):
        assert sum(isinstance(f, OrdinaryRefusals) for f in logger.filters) == 1, logger.name


@pytest.fixture
def hub_log(caplog):
    log = logging.getLogger("JupyterHub.test")
    quiet_ordinary_refusals(log)
    quiet_ordinary_refusals(log)  # once, however often configure(c) runs
    assert sum(isinstance(f, OrdinaryRefusals) for f in log.filters) == 1
    caplog.set_level(logging.INFO, logger=log.name)
    yield log
    log.filters.clear()


def fail_as_jupyterhub_does(log, exc):
    try:
        raise exc
    except Exception as e:
        log.error(f"Not starting alice's server : {e}")
        log.error("Failed to spawn single-user server with form", exc_info=True)


@pytest.mark.parametrize("reason", ["gpu_unavailable", "gpu_wait_timeout", "line_removed", "invalid_options"])
def test_jupyterhubs_lines_about_an_ordinary_refusal_are_left_out(hub_log, caplog, reason):
    fail_as_jupyterhub_does(hub_log, spawn_error(NONE_FREE, reason=reason, status_code=NOT_NOW))
    assert caplog.records == []


def test_another_error_logged_while_a_refusal_is_handled_is_kept(hub_log, caplog):
    try:
        raise spawn_error(NONE_FREE, reason="gpu_unavailable", status_code=NOT_NOW)
    except Exception:
        hub_log.error("Failed to remove alice's oauth client")  # neither carries nor names the refusal
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "Failed to remove alice's oauth client")
    ]


@pytest.mark.parametrize("reason", ["ledger_unavailable", "service_create"])
def test_a_fault_stays_an_error_with_its_traceback(hub_log, caplog, reason):
    fail_as_jupyterhub_does(hub_log, spawn_error("the ledger is down", reason=reason, status_code=503))
    assert [r.levelname for r in caplog.records] == ["ERROR", "ERROR"]
    assert "Traceback" in caplog.text


def test_the_lines_jupyterhub_logs_after_the_except_block_are_left_out_too(hub_log, caplog):
    """Outside an except block only the text says which refusal it was, as JupyterHub writes it."""
    hub_log.error(f"Error starting server alice: 409 SpawnException(reason=gpu_unavailable): {NONE_FREE}")
    hub_log.error("Previous spawn for alice failed: 409 SpawnException(reason=gpu_unavailable): none free")
    hub_log.error("Error starting server bob: 503 SpawnException(reason=ledger_unavailable): the ledger is down")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["Error starting server bob"]


def test_other_exceptions_are_left_alone(hub_log, caplog):
    fail_as_jupyterhub_does(hub_log, RuntimeError("boom"))
    assert [r.levelname for r in caplog.records] == ["ERROR", "ERROR"] and "Traceback" in caplog.text
