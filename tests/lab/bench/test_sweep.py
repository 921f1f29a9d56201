"""`ipamgc bench --churn 1,5,20,50`: the rate below which ipamgc costs more CPU a second than Calico."""

from __future__ import annotations

from typing import Any

from lab.bench.sweep import crossover, summary


def test_no_crossover_when_ipamgc_never_costs_more() -> None:
    assert crossover([(0, 0.5, 0.6), (1, 2.0, 3.0), (50, 30.0, 140.0)]) == 0.0


def test_the_crossover_is_interpolated_where_the_difference_changes_sign() -> None:
    # ipamgc costs 2 ms/s more idle, 1 more at 1/s, 3 less at 5/s: equal at 1 + 4 × 1/4 = 2 events/s.
    assert crossover([(0, 4.0, 2.0), (1, 6.0, 5.0), (5, 12.0, 15.0)]) == 2.0


def test_no_rate_when_ipamgc_costs_more_at_every_rate_measured() -> None:
    assert crossover([(0, 4.0, 0.4), (1, 9.0, 5.0), (50, 200.0, 140.0)]) is None


def _mode(idle_cpu: float, by_rate: dict[str, tuple[float, float]]) -> dict[str, Any]:
    def phase(cpu: float, wall: float) -> dict[str, Any]:
        return {"cpu_seconds": {"total": cpu}, "wall_seconds": wall, "cpu_per_event_us": {"total": 1.0}}

    return {
        "phases": {
            "idle": phase(idle_cpu, 60.0),
            "churn_by_rate": {rate: phase(cpu, wall) for rate, (cpu, wall) in by_rate.items()},
        }
    }


def test_the_summary_has_each_mode_at_each_rate_and_the_crossover_against_calico() -> None:
    modes = {
        "incremental": _mode(0.06, {"1": (0.2, 40.0), "50": (0.7, 20.0)}),
        "calico": _mode(0.024, {"1": (0.2, 40.0), "50": (2.8, 20.0)}),
        "per-node": {"skipped": "not asked"},
    }
    out = summary(modes, ["calico"])
    assert out is not None
    assert out["rates"] == [1.0, 50.0]
    assert out["idle_cpu_ms_per_second"] == {"incremental": 1.0, "calico": 0.4}
    assert out["by_rate"]["50"]["calico"]["cpu_ms_per_second"] == 140.0
    # 0.6 ms/s more idle, equal at 1/s: the crossover is at 1 event/s.
    assert out["crossover_events_per_second"] == 1.0


def test_no_summary_for_a_single_rate_run() -> None:
    assert summary({"incremental": {"phases": {"churn": {}}}}, []) is None
