"""`ipamgc up`'s checks before it starts anything, each failing with one line that names the cause.

Without them a wrong `--redis-url` or kubeconfig shows up only as components restarting in a loop, with
the reason in their log files.  Checked: Redis answers a PING (and accepts the credentials in the URL);
the kubeconfig exists, loads, and its API server lets us list nodes, pods and Calico's IPAMBlocks; the
metrics ports are free; the grace period parses.  Each check is one round trip with a short timeout.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path

import redis

from ipamgc.inventory import probe_cluster
from ipamgc.local_redis import redact
from redisio.client import redis_client
from shared.calicogroup import CalicoGroup
from shared.config import env_calico_group, parse_grace
from shared.errors import ConfigError, IpamgcError

TIMEOUT_SECONDS = 5.0


class PreflightError(Exception):
    """A check failed; the message is the one line to print."""


def check_redis(url: str, timeout: float = TIMEOUT_SECONDS) -> None:
    try:
        client = redis_client(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    except ValueError as exc:
        raise PreflightError(f"--redis-url {redact(url)} is not a Redis URL: {exc}") from exc
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise PreflightError(f"Redis at {redact(url)} refused the credentials: {exc}") from exc
    except redis.RedisError as exc:
        raise PreflightError(f"cannot reach Redis at {redact(url)}: {exc}") from exc
    finally:
        client.close()


def check_cluster(
    kubeconfig: str,
    context: str | None = None,
    timeout: float = TIMEOUT_SECONDS,
    group: CalicoGroup | None = None,
) -> None:
    if kubeconfig not in ("", "-") and not Path(kubeconfig).is_file():
        raise PreflightError(f"kubeconfig {kubeconfig}: no such file")
    try:
        group = group or env_calico_group()  # the components read it from the same environment
        probe_cluster(kubeconfig if kubeconfig not in ("", "-") else None, context, timeout, group)
    except IpamgcError as exc:
        hint = ""
        if "ipamblocks" in str(exc) and "HTTP 404" in str(exc):
            hint = " (are Calico's CRDs installed? ipamgc needs Calico's Kubernetes datastore)"
        raise PreflightError(f"the cluster of kubeconfig {kubeconfig}: {exc}{hint}") from exc


def check_grace(text: str | None) -> None:
    """`--leak-grace-period`, which every component would otherwise refuse, each in its own log."""
    if text is None:
        return
    try:
        parse_grace(text)
    except (ConfigError, ValueError) as exc:
        raise PreflightError(f"--leak-grace-period {text!r}: {exc}") from exc


def check_ports(ports: Mapping[str, int], host: str = "0.0.0.0") -> None:
    """Every metrics port can be bound as the components will bind it (on `host`); 0 is disabled."""
    for name, port in ports.items():
        if port == 0:
            continue
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server does
            try:
                probe.bind((host, port))
            except OSError as exc:
                raise PreflightError(
                    f"metrics port {port} ({name}) is not free on {host}: {exc.strerror}; "
                    "choose another with --metrics-port P, or --metrics-port 0 for none"
                ) from exc


def metrics_ports(first: int, names: list[str]) -> dict[str, int]:
    """The watcher (first of `names`) on `first`, the others on the ports after it; 0 disables all."""
    if first == 0:
        return dict.fromkeys(names, 0)
    if first + len(names) - 1 > 65535:
        raise PreflightError(f"--metrics-port {first}: {len(names)} components need ports up to 65535")
    return {name: first + i for i, name in enumerate(names)}
