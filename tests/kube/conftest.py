"""Fixtures for talking to the simulated API server with the real kubernetes client over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from ipamgc.sim.apiserver import SimApiServer


@pytest.fixture
def server() -> Iterator[SimApiServer]:
    """A fresh server on a free loopback port, with fast bookmarks."""
    with SimApiServer(bookmark_interval=0.2) as srv:
        yield srv


@pytest.fixture
def api(server: SimApiServer) -> Iterator[client.ApiClient]:
    """An ApiClient bound to ``server``, closed after the test."""
    with server.api_client() as api_client:
        yield api_client


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


@pytest.fixture
def coord(api: client.ApiClient) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(api)


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.01) -> Any:
    """Poll ``predicate`` until it returns something truthy, failing after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(interval)
