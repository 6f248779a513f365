"""Who may do what, and what bad input can do, on a real hub on the real swarm:
admin views for admins only, and fuzzed user_options (REST and form) that only
ever get a clean 4xx, never a 5xx, never a service or a GPU kept."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.support import hub_on, login, services_of

A100 = "NVIDIA A100 80GB PCIe"
GTX = "NVIDIA GeForce GTX 1070"


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    with hub_on(swarm, tmp_path_factory.mktemp("hub"), port_from=20800) as h:
        yield h


ADMIN_VIEWS = [
    ("GET", "/hub/api/gpuspawner/alloc-map"),
    ("POST", "/hub/api/gpuspawner/rescan"),
    ("GET", "/hub/api/gpuspawner/usage"),
    ("GET", "/hub/api/gpuspawner/doctor"),
    ("GET", "/hub/gpus"),
]


@pytest.mark.parametrize("method, path", ADMIN_VIEWS)
def test_admin_views_are_for_admins_only(hub, method, path):
    """Guards docs/security.md, "A user": "see the allocation map, usage, doctor or /hub/gpus" and
    "admin:servers scope on every admin endpoint".

    Guards docs/reliability.md, "Measured on the test swarm": "403 on the allocation map, rescan,
    usage, doctor and /hub/gpus".

    Guards docs/admin.md, "The admin's tools: allocation map, usage, health": "Others get 403"."""
    user = login(hub, "oscar")
    headers = {"X-XSRFToken": user.cookies.get("_xsrf") or ""}
    assert user.request(method, hub.url + path, headers=headers, timeout=30).status_code == 403
    admin = login(hub, "admin")
    headers = {"X-XSRFToken": admin.cookies.get("_xsrf") or ""}
    assert admin.request(method, hub.url + path, headers=headers, timeout=30).status_code == 200


def test_admins_find_the_gpu_page_in_the_navigation_bar_and_users_do_not(hub):
    link = 'href="/hub/gpus">GPUs</a>'
    assert link in login(hub, "admin").get(hub.url + "/hub/home", timeout=30).text
    assert link not in login(hub, "oscar").get(hub.url + "/hub/home", timeout=30).text


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from([A100, GTX, "all", "0", "1", "gpu-a", "gpu-b", "a100,gpu-b", "void", "node.role==manager"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
options = st.dictionaries(
    st.sampled_from(["gpu_model", "gpu_count", "gpu_host", "gpu_share", "image", "env", "constraints", ""]),
    values,
    max_size=4,
)


def check_clean(hub, swarm, user, r):
    assert r.status_code in (201, 202, 400, 409), (r.status_code, r.text)
    if r.status_code in (400, 409):
        assert r.json().get("message") and "Traceback" not in r.text
        assert services_of(swarm, user) == []
        assert hub.server_model(user) is None
    else:
        hub.wait_ready(user)
        (service,) = services_of(swarm, user)
        spec = service.attrs["Spec"]
        env = dict(e.split("=", 1) for e in spec["TaskTemplate"]["ContainerSpec"]["Env"])
        devices = env["NVIDIA_VISIBLE_DEVICES"]
        assert devices == "void" or all(d.startswith("GPU-") for d in devices.split(","))
        hub.stop_server(user)
    # Nothing held afterwards, whatever happened.
    m = hub.api("GET", "/gpuspawner/alloc-map").json()
    assert not [h for host in m.values() for d in host.values() for h in d["holders"]]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=options)
def test_fuzzed_rest_options_never_break_anything(hub, swarm, body):
    """Guards docs/security.md, "A user": "put text of their own into env, constraints or labels; get a
    500 or a traceback".

    Guards docs/reliability.md, "Measured on the test swarm": "never a traceback, never a service or
    a held GPU after a refusal"."""
    check_clean(hub, swarm, "fuzz-rest", hub.spawn("fuzz-rest", body))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    form=st.dictionaries(
        st.sampled_from(["gpu_model", "gpu_count", "gpu_host", "gpu_share", "x"]),
        st.lists(st.text(max_size=20) | st.sampled_from([A100, GTX, "1", "2", "all"]), min_size=1, max_size=2),
        max_size=4,
    )
)
def test_fuzzed_form_fields_never_break_anything(hub, swarm, form):
    """Guards docs/security.md, "A user": "put text of their own into env, constraints or labels; get a
    500 or a traceback".

    Guards docs/reliability.md, "Measured on the test swarm": "never a traceback, never a service or
    a held GPU after a refusal"."""
    s = login(hub, "fuzz-form")
    r = s.post(hub.url + "/hub/spawn/fuzz-form", data={**form, "_xsrf": s.cookies.get("_xsrf")}, timeout=60)
    assert r.status_code < 500, r.text[:500]
    if hub.server_model("fuzz-form") is not None:
        hub.wait_ready("fuzz-form")
        hub.stop_server("fuzz-form")
    assert services_of(swarm, "fuzz-form") == []
    assert "Traceback" not in r.text
