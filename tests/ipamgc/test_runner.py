"""`ipamgc.runner`: what every component process does beside its work, once for the three (issue 47).

The stop signals reach the component, its heartbeat is written while it runs and deleted when it stops,
what it serves beside its work runs only meanwhile, its exit status is the process's, and a
configuration error is one line and exit status 2."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
from collections.abc import Callable, Iterator, Mapping

import pytest
import redis

from ipamgc.metrics import MetricsServer
from ipamgc.runner import Process, run_process
from shared.errors import ConfigError
from shared.keys import Keys
from tests.polling import wait_until


class _Beside:
    def __init__(self) -> None:
        self.running = False

    def start(self) -> None:
        self.running = True

    def stop(self) -> None:
        self.running = False


class _Component(Process):
    component = "worker"

    def __init__(self, client: redis.Redis, keys: Keys, fail: bool = False) -> None:
        super().__init__(client)
        self.keys, self.fail = keys, fail
        self.stopped = self.resynced = False
        self.beside = _Beside()
        self.seen: dict[str, object] = {}

    def serving(self, server: MetricsServer | None) -> _Beside:
        self.seen["server"] = server
        return self.beside

    def signals(self) -> Mapping[signal.Signals, Callable[[], None]]:
        return {signal.SIGUSR1: self._resync}

    def _resync(self) -> None:
        self.resynced = True

    def run(self) -> int:
        if self.fail:
            raise ConfigError("no such master")
        self.seen["beside"] = self.beside.running
        self.seen["gc"] = (gc.get_freeze_count() > 0, gc.isenabled())
        pattern = f"{self.keys.prefix}:health:*"
        self.seen["beat"] = wait_until(lambda: [k.decode() for k in self.redis.scan_iter(match=pattern)])
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        return 3

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def restore_signals() -> Iterator[None]:
    """The signal handlers and the cyclic collector the runner changes, as they were (the test process is
    pytest's, not a component's)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)
    gc.unfreeze()


@pytest.mark.usefixtures("restore_signals")
def test_the_runner_runs_a_component_with_its_signals_heartbeat_and_exit_status(
    client: redis.Redis, keys: Keys
) -> None:
    component = _Component(client, keys)
    closed: list[bool] = []

    @contextlib.contextmanager
    def opened() -> Iterator[_Component]:
        yield component
        closed.append(True)

    with pytest.raises(SystemExit) as exit_:
        run_process("work", opened(), keys, 0, None)
    assert exit_.value.code == 3
    assert component.seen["server"] is None  # port 0: not served
    assert component.seen["beside"] is True and component.beside.running is False
    beat = component.seen["beat"]
    assert isinstance(beat, list) and [k.split(":")[2] for k in beat] == ["worker"]
    assert list(client.scan_iter(match=f"{keys.prefix}:health:*")) == []  # a clean stop deletes it
    assert component.stopped and component.resynced
    assert closed == [True]
    # Its work ran with what existed before it out of the cyclic collector's reach, the collector on.
    assert component.seen["gc"] == (True, True)


@pytest.mark.usefixtures("restore_signals")
def test_a_configuration_error_is_one_line_and_exit_status_2(
    client: redis.Redis, keys: Keys, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        run_process("lead", contextlib.nullcontext(_Component(client, keys, fail=True)), keys, 0, None)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "ipamgc lead: no such master\n"
