"""Fixtures shared by the unit tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import settings

from devtools import fakenvml
from tests.ci import skip_or_fail

# Properties are checked for what they find, not for how fast: a loaded machine must not
# fail one on hypothesis's 200 ms deadline (speed is measured in benchmarks/).
settings.register_profile("gpuspawner", deadline=None)
settings.load_profile("gpuspawner")


@pytest.fixture(scope="module")
def fake_lib_dir(tmp_path_factory) -> Path:
    """The fake libnvidia-ml.so.1, built with gcc (cached by source hash)."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        skip_or_fail("gcc is required to build the fake libnvidia-ml.so.1 (apt-get install gcc)")
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml")).parent


@pytest.fixture(autouse=True)
def _no_hubs_gauges_outlive_their_test(monkeypatch):
    """The gauges a test's hub shows at /metrics are taken down after it (one process,
    one hub: a hub a test left behind would hide the next test's)."""
    from gpuspawner import metrics

    shown, real = [], metrics.show

    def show(gauges):
        if real(gauges):
            shown.append(gauges)
            return True
        return False

    monkeypatch.setattr(metrics, "show", show)
    yield
    for gauges in shown:
        metrics.hide(gauges)
