"""The Kubernetes configuration for both components: in a pod its service account, else a kubeconfig
file and context; every failure one `ConfigError` line.

Why it exists: the watcher and the leader load the same configuration the same way (the watcher and
the leader once each had a copy of this loader).  The client is used for its configuration,
authentication and connection pool only; requests go through `kubeio.http`.  A plain configuration
(the in-cluster one; a kubeconfig with a token or certificates) is read by `kubeio.leanconfig` without
importing the `kubernetes` package (~23 MiB and ~0.2 s a process); any other (an exec plugin, an
auth-provider, a proxy, a malformed file) by the `kubernetes` client's loader, as before.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from kubeio import leanconfig
from shared.errors import ConfigError


class ApiClient(Protocol):
    """What the components use of a client (`kubernetes.client.ApiClient` or `leanconfig.LeanApiClient`):
    named here so that the components never import `kubernetes` themselves (an import-linter contract)."""

    configuration: Any
    rest_client: Any
    default_headers: dict[str, str]
    user_agent: str

    def close(self) -> None: ...


def one_line(exc: BaseException) -> str:
    """An exception as one line (YAML errors span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def api_client(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    user_agent: str | None = None,
    pool_size: int | None = None,
) -> ApiClient:
    """An ApiClient: in-cluster config in a pod (no kubeconfig given), else the kubeconfig file.

    `pool_size`: connections kept per host (the watcher's one per concurrent watch, plus its lists and
    its Lease); None leaves the client's default.  urllib3's own retries are off: they would sleep out a
    Retry-After uninterruptibly and uncounted; every retry is the caller's, with back-off and a stop
    check (`kubeio.http` passes `retries=False` on each request as well)."""
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            lean = leanconfig.incluster()
        else:
            lean = leanconfig.from_kubeconfig(kubeconfig, context)
    except leanconfig.NotLean:
        return _client(kubeconfig, context, user_agent=user_agent, pool_size=pool_size)
    lean.connection_pool_maxsize = pool_size
    api = leanconfig.LeanApiClient(lean)
    if user_agent:
        api.user_agent = user_agent
    return api


def _client(
    kubeconfig: str | None, context: str | None, *, user_agent: str | None, pool_size: int | None
) -> ApiClient:
    """The `kubernetes` client's loader and ApiClient (imported only here)."""
    import yaml  # noqa: PLC0415  # kubernetes' own dependency
    from kubernetes import client as k8s  # noqa: PLC0415  # ~23 MiB: only when the lean reader declines
    from kubernetes import config as k8s_config  # noqa: PLC0415

    cfg = k8s.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
    except (k8s_config.ConfigException, OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot load Kubernetes configuration: {one_line(exc)}") from exc
    except (TypeError, KeyError, AttributeError) as exc:  # YAML that is not a kubeconfig's shape
        raise ConfigError(f"cannot load Kubernetes configuration: not a kubeconfig: {one_line(exc)}") from exc
    if pool_size is not None:
        cfg.connection_pool_maxsize = pool_size
    cfg.retries = False
    api = k8s.ApiClient(cfg)
    if user_agent:
        api.user_agent = user_agent
    return api
