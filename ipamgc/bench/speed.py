"""The machine's speed at the moment: a fixed CPU workload timed in the benchmark's own process.

Why it exists: these machines' speed moves by up to 2.5× between sessions and by half within an hour
(docs/benchmarks.md), so an absolute figure (µs of CPU per pod event) read on one day cannot be set beside
one read on another.  The benchmark times this workload just before and just after each mode's churn and
once at its start (`speed_probe_us` in the report): a figure divided by the probe of its own run can be
compared across runs as far as the probe follows what slowed the machine (docs/benchmarks.md says how
far it did).  Ratios between modes need no probe: they are taken within one run.

The workload is a little of what ipamgc's processes do per event, on fixed bytes: JSON decoded into
typed structs (msgspec) and into dicts and lists, a dict index built, msgpack encoded, text
formatted and sorted.  It is timed on the calling thread's CPU clock (`time.thread_time_ns`), so a wait
for the CPU does not count, only how fast the CPU runs Python when it runs it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from types import TracebackType

import msgspec


class _Slot(msgspec.Struct):
    handle_id: str | None = None
    secondary: dict[str, str] | None = None


class _Spec(msgspec.Struct):
    cidr: str
    allocations: list[int | None]
    attributes: list[_Slot]
    seqs: dict[str, int] = msgspec.field(name="sequenceNumberForAllocation")


def _document() -> bytes:
    """A /26 IPAMBlock-like spec, 48 of 64 ordinals allocated (~9 KB), the same bytes every time."""
    attributes = [
        {
            "handle_id": f"k8s-pod-network.{i:08x}{'0' * 56}",
            "secondary": {"namespace": f"ns-{i % 10}", "node": f"node-{i % 7:05d}", "pod": f"pod-{i:06d}"},
        }
        for i in range(48)
    ]
    allocations = [i if i < 48 else None for i in range(64)]
    seqs = {str(i): 1_000 + i for i in range(48)}
    spec = {"cidr": "10.0.3.0/26", "allocations": allocations, "attributes": attributes}
    return msgspec.json.encode({**spec, "sequenceNumberForAllocation": seqs})


_DOC = _document()
_DECODER = msgspec.json.Decoder(_Spec)
_REPEAT = 100  # ~4 ms per round on these machines (2026-12-03)


def _workload() -> int:
    """One round; returns a number derived from everything it computed (so nothing is skipped)."""
    total = 0
    for _ in range(_REPEAT):
        spec = _DECODER.decode(_DOC)
        generic = msgspec.json.decode(_DOC)
        by_pod: dict[str, tuple[int, str]] = {}
        for o, idx in enumerate(spec.allocations):
            if idx is None:
                continue
            slot = spec.attributes[idx]
            attrs = slot.secondary or {}
            by_pod[f"{attrs.get('namespace', '')}/{attrs.get('pod', '')}"] = (o, slot.handle_id or "")
        packed = msgspec.msgpack.encode(sorted(by_pod.items()))
        total += len(packed) + len(generic["attributes"]) + len(by_pod)
    return total


def speed_probe(rounds: int = 15, timer: Callable[[], int] = time.thread_time_ns) -> float:
    """The median µs of `timer` (the thread's CPU clock) one round of the workload took, over `rounds`
    rounds after one untimed warm-up round.  Lower is faster."""
    _workload()
    times = []
    for _ in range(max(1, rounds)):
        start = timer()
        _workload()
        times.append((timer() - start) / 1000)
    return round(statistics.median(times), 1)


class SpeedSampler:
    """While active, one round of the workload every `interval` seconds on a thread of its own (a few ms
    of CPU a second, in the unmeasured benchmark process): the machine's speed *during* a phase, which a
    probe before and after it cannot see (a round is ~4 ms; the speed moves within seconds).
    `median_us` is the median round in µs, None if no round ran."""

    def __init__(self, interval: float = 1.0, timer: Callable[[], int] = time.thread_time_ns) -> None:
        self.interval = interval
        self.timer = timer
        self.rounds: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="speed-probe", daemon=True)

    def _run(self) -> None:
        _workload()  # warm-up, untimed
        while not self._stop.wait(self.interval):
            start = self.timer()
            _workload()
            self.rounds.append((self.timer() - start) / 1000)

    @property
    def median_us(self) -> float | None:
        return round(statistics.median(self.rounds), 1) if self.rounds else None

    def __enter__(self) -> SpeedSampler:
        self._thread.start()
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
