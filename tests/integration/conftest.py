"""Fixtures for tests that run against a real multi-node Docker Swarm (devtools/swarm/).

``swarm`` (session scope) brings the cluster up once per test session and tears it down at
the end. Environment:

* ``GPUSPAWNER_KEEP_SWARM=1``: leave the cluster running after the session (reused by the
  next session; ``python -m devtools.swarm down`` removes it).
* ``CI=true``: a machine that cannot run the cluster is a failure, not a skip.

Outside CI the tests are skipped only when this machine cannot run a swarm at all (not
root, no dockerd, ...). A cluster that fails to come up is always an error.

Several sessions on one machine share the cluster: the last one to finish tears it down,
and a test that breaks it on purpose waits until it has it to itself.
"""

from __future__ import annotations

import time

import pytest

from devtools import jupyter_image as image_harness
from devtools import postgres
from devtools import swarm as harness
from tests.ci import env_flag, skip_or_fail


@pytest.fixture(autouse=True)
def no_servers_left(request):
    """A test with a hub leaves no server behind, and so no GPU held for the next one."""
    yield
    if "hub" in request.fixturenames:
        request.getfixturevalue("hub").stop_all_servers()


@pytest.fixture(scope="session")
def swarm():
    """The running test cluster (``devtools.swarm.Cluster``)."""
    reason = harness.unavailable_reason()
    if reason:
        skip_or_fail(f"the test swarm cannot run on this machine: {reason}")

    t0 = time.monotonic()
    try:
        # Other test sessions on this machine share the cluster: this one's use of it keeps
        # them from tearing it down or rebuilding it meanwhile (and the other way round).
        harness.use_shared()
        cluster = harness.up()
    except harness.HarnessError as e:
        pytest.fail(f"the test swarm did not come up:\n{e}", pytrace=False)
    print(f"\ntest swarm ready in {time.monotonic() - t0:.1f}s: {cluster.manager_url}")

    yield cluster

    if env_flag("GPUSPAWNER_KEEP_SWARM"):
        print(f"\nGPUSPAWNER_KEEP_SWARM set: leaving the test swarm up ({cluster.manager_url})")
        return
    if not harness.down_if_unused(cluster.state_dir, cluster.run_dir):
        print(f"\nanother test session still uses the test swarm: leaving it up ({cluster.manager_url})")


@pytest.fixture(scope="session")
def jupyter_image(swarm):
    """The real jupyterhub-singleuser image (devtools/jupyter_image.py), on every
    worker; built once and cached between sessions."""
    reason = image_harness.unavailable_reason()
    if reason:
        skip_or_fail(f"the Jupyter server image cannot be built here: {reason}")
    try:
        return image_harness.ensure_on(swarm)
    except harness.HarnessError as e:
        pytest.fail(f"the Jupyter server image could not be built or imported:\n{e}", pytrace=False)


@pytest.fixture(scope="module")
def pg():
    """A running PostgreSQL server of this module's own."""
    reason = postgres.unavailable_reason()
    if reason:
        skip_or_fail(f"no PostgreSQL server can run on this machine: {reason}")
    t0 = time.monotonic()
    try:
        server = postgres.PostgresServer.create()
    except postgres.PostgresError as e:
        pytest.fail(f"the PostgreSQL test server did not start:\n{e}", pytrace=False)
    print(f"\nPostgreSQL test server ready in {time.monotonic() - t0:.1f}s on 127.0.0.1:{server.port}")
    yield server
    server.destroy()
