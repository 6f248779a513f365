"""Clients for the nodes' Docker Engine API (docker-py), every call with a bounded wait.

The API version is pinned (v1.41, docker.io 20.10's): no version probe on connect, and
the same requests whatever the daemon's version."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import docker
import requests

API_VERSION = "1.41"
API_TIMEOUT = 30.0
# A daemon that is up answers /_ping at once, even on a loaded machine; one that is dead
# refuses the connection (or its socket is gone) at once. Only a daemon that is up but
# starved of CPU needs the time, so a generous timeout costs nothing when it is dead.
HEALTH_PING_TIMEOUT = 10.0

# What a call to a daemon raises: an error answer (docker.errors.APIError and the other
# DockerExceptions), or no answer at all (refused, socket gone, timed out).
ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


def describe(e: BaseException) -> str:
    """An error from a daemon in one line: "HTTP 500: <the daemon's message>" for an error
    answer (docker-py's own text also carries the whole request URL), else the error."""
    if isinstance(e, docker.errors.APIError) and e.response is not None:
        return f"HTTP {e.status_code}: {e.explanation or e.response.reason}"
    return str(e) or type(e).__name__


def client(url: str, timeout: float = API_TIMEOUT) -> docker.DockerClient:
    """A client for the daemon at ``url`` ("unix://..."); every request waits at most ``timeout`` s."""
    return docker.DockerClient(base_url=url, version=API_VERSION, timeout=timeout)


@contextlib.contextmanager
def connected(url: str, timeout: float = API_TIMEOUT) -> Iterator[docker.DockerClient]:
    """``client(url, timeout)``, closed at the end of the block."""
    c = client(url, timeout)
    try:
        yield c
    finally:
        c.close()


def ping(url: str, timeout: float = 2.0) -> bool:
    """Whether the daemon at ``url`` answers /_ping within ``timeout`` s."""
    try:
        with connected(url, timeout) as c:
            return c.ping() is True
    except ENGINE_ERRORS:
        return False


def import_tar(c: docker.DockerClient, data: bytes, repo: str, tag: str, changes: Sequence[str], timeout: float) -> str:
    """``docker import`` of a root fs tar; the daemon's answer (progress, or an error
    message: import errors can come in a 200 answer). docker-py's import_image_from_data
    waits without a limit, so the request is made here, with ``timeout``."""
    api = c.api
    resp = api.post(
        f"{api.base_url}/v{api.api_version}/images/create",
        params=[("fromSrc", "-"), ("repo", repo), ("tag", tag)] + [("changes", ch) for ch in changes],
        data=data,
        headers={"Content-Type": "application/x-tar"},
        timeout=timeout,
    )
    try:
        resp.raise_for_status()
    except requests.exceptions.HTTPError as e:
        docker.errors.create_api_error_from_http_exception(e)  # raises docker.errors.APIError
    return resp.text
