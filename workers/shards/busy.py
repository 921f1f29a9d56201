"""How busy a lingering shard job is: the share of its time spent looking, judged with hysteresis.

Its own module because it decides when a job gathers shards and when it gives them back
(`workers.shards.linger`'s concentration) and is pure arithmetic on the job's monotonic clock, tested alone.
"""

from __future__ import annotations


class BusyWindow:
    """The busy fraction (seconds added by `add` ÷ the window's length) of windows at least `span` s long.
    `judge` closes a window: below `light_below` the job is `light`, above `heavy_above` it is not (and
    `judge` says heavy); in between `light` keeps its value, so that gathering two light jobs' shards
    (about twice the load) does not make the gatherer give them straight back."""

    def __init__(self, light_below: float, heavy_above: float, span: float, *, enabled: bool = True) -> None:
        self.light_below, self.heavy_above, self.span = light_below, heavy_above, span
        self.enabled = enabled  # False: never light (a job keeps to its fair share)
        self.light = False
        self._at = 0.0
        self._busy = 0.0

    def start(self, m: float) -> None:
        self._at, self._busy = m, 0.0

    def add(self, seconds: float) -> None:
        self._busy += seconds

    def judge(self, m: float) -> bool:
        """Close the window at `m` if it is at least `span` long (a job's first look would find it idle);
        returns whether the job is heavy now."""
        length = m - self._at
        if length < self.span:
            return False
        busy = self._busy / length
        self._at, self._busy = m, 0.0
        if busy < self.light_below:
            self.light = self.enabled
        elif busy > self.heavy_above:
            self.light = False
        return busy > self.heavy_above
