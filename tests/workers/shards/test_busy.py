"""`workers.busy.BusyWindow`: a lingering job's busy fraction, judged with hysteresis."""

from __future__ import annotations

from workers.shards.busy import BusyWindow


def test_a_window_shorter_than_its_span_is_not_judged() -> None:
    w = BusyWindow(0.15, 0.6, 2.0)
    w.start(10.0)
    assert w.judge(10.001) is False and not w.light  # the first look: no evidence of being idle yet
    w.add(1.9)
    assert w.judge(11.9) is False and not w.light  # still one window, 1.9 s long
    assert w.judge(12.0) is True and not w.light  # 1.9 s busy of 2.0: heavy


def test_light_below_heavy_above_and_kept_in_between() -> None:
    w = BusyWindow(0.15, 0.6, 2.0)
    w.start(0.0)
    w.add(0.2)
    assert (w.judge(2.0), w.light) == (False, True)  # 10 %: light
    w.add(0.8)
    assert (w.judge(4.0), w.light) == (False, True)  # 40 %: in between, stays light
    w.add(1.5)
    assert (w.judge(6.0), w.light) == (True, False)  # 75 %: heavy
    w.add(0.8)
    assert (w.judge(8.0), w.light) == (False, False)  # 40 %: in between, stays not light
    assert (w.judge(10.0), w.light) == (False, True)  # idle: light again


def test_disabled_it_is_never_light_but_still_says_heavy() -> None:
    w = BusyWindow(0.15, 0.6, 2.0, enabled=False)
    w.start(0.0)
    assert (w.judge(2.0), w.light) == (False, False)
    w.add(1.8)
    assert (w.judge(4.0), w.light) == (True, False)
