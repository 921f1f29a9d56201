"""The demo's summary says what the workers' CPU holds besides the churn: the full resyncs."""

from __future__ import annotations

from rich.console import Console

from lab.demo import DemoResult, render_summary


def _result(**over: object) -> DemoResult:
    base: dict[str, object] = {
        "leaks_injected": 3,
        "leaks_released": 3,
        "leaks_outstanding": 0,
        "in_use_released": 0,
        "latency_p50": 5.5,
        "latency_p99": 6.3,
        "cpu": {"watcher": 0.5, "worker-0": 2.4},
        "churn": {"created": 586, "deleted": 554, "leaked": 63, "errors": 0},
        "resync_seconds": 2.5,
        "allocations": 4_400,
        "seconds": 71.2,
    }
    return DemoResult(**{**base, **over})  # type: ignore[arg-type]


def _render(result: DemoResult) -> str:
    console = Console(record=True, width=200)
    render_summary(result, console)
    return console.export_text()


def test_the_summary_counts_the_full_resyncs_beside_the_pod_events() -> None:
    text = _render(_result())
    assert (
        "the workers' CPU includes ~28 full resyncs, each re-validating all 4,400 allocations "
        "(Calico's rule: one every grace / 2, 2.5s here, 7m30s at the default 15m grace), "
        "beside 1,203 pod events"
    ) in text


def test_without_a_resync_period_it_says_nothing_of_them() -> None:
    assert "full resyncs" not in _render(_result(resync_seconds=None))
