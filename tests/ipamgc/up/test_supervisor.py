"""The supervisor behind `up` and `demo`: restarts what exits, and names a component that keeps failing
with the last error line of its log (so `up` stops loudly instead of restarting it for ever)."""

from __future__ import annotations

import sys
from pathlib import Path

from ipamgc.supervisor import GIVE_UP_AFTER_QUICK_EXITS, Supervisor, last_error_line
from tests.polling import wait_until


def _failing(code: int, message: str) -> list[str]:
    script = f"import sys; print('starting'); print({message!r}, file=sys.stderr); sys.exit({code})"
    return [sys.executable, "-c", script]


def test_a_component_that_keeps_exiting_soon_after_its_start_is_a_failure(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    try:
        comp = sup.add("worker-0", _failing(1, "RuntimeError: cannot reach it"))
        sup.add("steady", [sys.executable, "-c", "import time; time.sleep(60)"])
        failures: list[str | None] = []

        def failed() -> str | None:
            sup.poll()
            failures.append(sup.failure())
            return failures[-1]

        line = wait_until(failed, 20, interval=0.05, what="the supervisor to give up on worker-0")
        # Restarted (with back-off) until the give-up count, and not reported before it.
        assert comp.starts == GIVE_UP_AFTER_QUICK_EXITS
        assert comp.exits == [1] * GIVE_UP_AFTER_QUICK_EXITS
        assert line == (
            f"worker-0 keeps failing (exited {GIVE_UP_AFTER_QUICK_EXITS} times in a row, status 1): "
            "RuntimeError: cannot reach it"
        )
        assert sup.components["steady"].pid is not None  # only the failing one is reported
    finally:
        sup.stop()


def test_bad_configuration_is_a_failure_at_the_first_exit(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    try:
        sup.add("leader", _failing(2, "ipamgc lead: bad setting"))
        line = wait_until(lambda: sup.poll() or sup.failure(), 10, what="the leader to fail")
        assert line == "leader keeps failing (exited once, status 2): ipamgc lead: bad setting"
    finally:
        sup.stop()


def test_the_last_error_line_is_the_error_not_the_noise_after_it(tmp_path: Path) -> None:
    log = tmp_path / "watcher.log"
    log.write_text(
        "2025-01-01 00:00:00 INFO producer.watcher: started\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "redis.exceptions.ConnectionError: Error 111 connecting to 127.0.0.1:6379.\n"
        "2025-01-01 00:00:01 INFO ipamgc.metrics: stopped\n\n"
    )
    assert last_error_line(log) == "redis.exceptions.ConnectionError: Error 111 connecting to 127.0.0.1:6379."
    log.write_text("2025-01-01 00:00:00 INFO a: one\n2025-01-01 00:00:00 INFO a: two\n")
    assert last_error_line(log) == "2025-01-01 00:00:00 INFO a: two"
    assert last_error_line(tmp_path / "missing.log") == ""
