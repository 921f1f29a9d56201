"""Fixtures for talking to the simulated API server with the real kubernetes client over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from lab.apiserver.apiserver import SimApiServer
from tests.polling import wait_until  # noqa: F401  (re-exported to the tests here)


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
