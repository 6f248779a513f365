"""gpuspawner's modules log through the hub's logger while a hub runs (hub/logs.py): each
line once, in the hub's format, with its timestamp, level and logger name, at the levels
the hub logs. Before, their records went to the root logger, which in a running hub has no
handler of its own: a WARNING came out as its bare message and INFO lines were lost.

The hub's logger here is one of the test's own, set up as JupyterHub sets up its own (its
formatter and format, the logger at DEBUG and its handler at the hub's log level, not
propagating)."""

from __future__ import annotations

import asyncio
import io
import logging
import re

import pytest
from jupyterhub.app import JupyterHub

from gpuspawner.holdings import holdings
from gpuspawner.hub import logs
from gpuspawner.hub.app import GPUHub
from gpuspawner.ledger import ledger

HUB_LINE = re.compile(
    r"^\[(?P<level>[A-Z]) \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (?P<name>[\w.]+) \w+:\d+\] (?P<msg>.*)$"
)


@pytest.fixture
def hub_log():
    """(the hub's logger, what its handler wrote)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    # JupyterHub's own formatter, format and date format (its defaults, as init_logging uses them).
    hub_format, hub_datefmt = JupyterHub._log_format_default(None), JupyterHub._log_datefmt_default(None)
    handler.setFormatter(JupyterHub._log_formatter_cls(fmt=hub_format, datefmt=hub_datefmt, color=False))
    handler.setLevel(logging.INFO)
    log = logging.getLogger("gpuspawner-test-hub")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    log.addHandler(handler)
    yield log, out
    log.removeHandler(handler)


class Kept(logging.Handler):
    """The root logger's handler in a hub whose database migrations configured logging."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("gpuspawner."):
            self.records.append(record)


@pytest.fixture
def root_handler():
    root, kept = logging.getLogger(), Kept()
    level = root.level
    root.addHandler(kept)
    root.setLevel(logging.DEBUG)
    yield kept
    root.removeHandler(kept)
    root.setLevel(level)


def test_gpuspawners_lines_come_out_in_the_hubs_format_once_at_the_hubs_levels(hub_log, root_handler):
    log, out = hub_log
    undo = logs.log_through_hub(log)
    try:
        holdings.log.warning("Service %s: a warning", "jupyter-erin")
        ledger.log.info("an info line")
        holdings.log.debug("a debug line")
    finally:
        undo()
    lines = [HUB_LINE.match(line) for line in out.getvalue().splitlines()]
    assert all(lines), out.getvalue()
    assert [(m["level"], m["name"], m["msg"]) for m in lines] == [  # type: ignore[index]
        ("W", "gpuspawner.holdings.holdings", "Service jupyter-erin: a warning"),
        ("I", "gpuspawner.ledger.ledger", "an info line"),
    ]
    assert root_handler.records == []  # not a second time, in another format
    # Undone (the hub stopped): the records go where they went before, and not to the hub's log.
    holdings.log.warning("after the hub")
    assert "after the hub" not in out.getvalue()
    assert [r.getMessage() for r in root_handler.records] == ["after the hub"]


def test_the_hubs_filters_apply_and_a_logger_adapter_is_followed_to_its_logger(hub_log):
    log, out = hub_log
    log.addFilter(lambda record: "left out" not in record.getMessage())
    undo = logs.log_through_hub(logging.LoggerAdapter(log, {}))
    try:
        holdings.log.warning("left out by the hub's filter")
        holdings.log.warning("kept")
    finally:
        undo()
        log.filters.clear()
    assert [HUB_LINE.match(line)["msg"] for line in out.getvalue().splitlines()] == ["kept"]  # type: ignore[index]


async def test_a_hub_logs_gpuspawners_lines_from_its_start_to_its_stop(hub_log, monkeypatch):
    log, out = hub_log
    hub = GPUHub(lambda: pytest.fail("not read here"), log=log)
    monkeypatch.setattr(hub, "show_metrics", lambda: None)
    monkeypatch.setattr(hub, "_spawn_task", lambda job: job.close())  # no background loops
    hub.start()
    holdings.log.warning("while the hub runs")
    await hub.stop()
    holdings.log.warning("after it stopped")
    assert [HUB_LINE.match(line)["msg"] for line in out.getvalue().splitlines()] == ["while the hub runs"]  # type: ignore[index]
    assert not any(isinstance(h, logs.ToHubLog) for h in logging.getLogger("gpuspawner").handlers)
    await asyncio.sleep(0)


def test_a_hub_whose_event_loop_ends_without_its_stop_gives_the_logging_back(hub_log, monkeypatch):
    """A process that runs a hub for a while (a test) and ends its loop without the hub's stop."""
    log, _ = hub_log
    hub = GPUHub(lambda: pytest.fail("not read here"), log=log)
    monkeypatch.setattr(hub, "show_metrics", lambda: None)
    monkeypatch.setattr(GPUHub, "_keep_reconciling", lambda self: asyncio.sleep(0))
    monkeypatch.setattr(GPUHub, "_keep_reclaiming", lambda self: asyncio.sleep(0))

    async def run_a_while() -> None:
        hub.start()
        assert any(isinstance(h, logs.ToHubLog) for h in logging.getLogger("gpuspawner").handlers)
        await asyncio.sleep(0)

    asyncio.run(run_a_while())  # cancels what is left running as the loop ends
    package = logging.getLogger("gpuspawner")
    assert not any(isinstance(h, logs.ToHubLog) for h in package.handlers)
    assert package.propagate and package.level == logging.NOTSET


def test_an_admins_level_for_gpuspawner_is_kept_while_a_hub_runs_and_after(hub_log):
    """``logging.getLogger("gpuspawner").setLevel(WARNING)`` in jupyterhub_config.py
    holds while a hub routes the modules' lines, and level and propagation are as the
    admin left them once it stops."""
    log, out = hub_log
    package = logging.getLogger("gpuspawner")
    package.setLevel(logging.WARNING)
    try:
        undo = logs.log_through_hub(log)
        try:
            ledger.log.info("an info line the admin does not want")
            holdings.log.warning("a warning")
        finally:
            undo()
        assert (package.level, package.propagate) == (logging.WARNING, True)
    finally:
        package.setLevel(logging.NOTSET)
    assert [HUB_LINE.match(line)["msg"] for line in out.getvalue().splitlines()] == ["a warning"]  # type: ignore[index]
