"""`ipamgc compare`'s output: a table per cluster and a summary per difference class, or one JSON document.

The JSON document (`schema: ipamgc-compare/1`) holds every cluster's runs and differences and the
summary; its keys are only ever added to.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, TextIO

from lab.compare.diff import CLASSES, UNDECLARED
from lab.compare.run import ClusterResult

__all__ = ["SCHEMA", "summary_counts", "to_json", "write_table"]

SCHEMA = "ipamgc-compare/1"


def summary_counts(results: Sequence[ClusterResult]) -> dict[str, dict[str, int]]:
    """Per class: differences, and clusters they occurred in."""
    diffs: Counter[str] = Counter()
    clusters: Counter[str] = Counter()
    for r in results:
        seen = set()
        for d in r.differences:
            diffs[d.cls] += 1
            seen.add(d.cls)
        clusters.update(seen)
    return {c: {"differences": diffs[c], "clusters": clusters[c]} for c in sorted(diffs)}


def to_json(results: Sequence[ClusterResult], header: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        **header,
        "clusters": [r.as_dict() for r in results],
        "summary": {
            "clusters": len(results),
            "incomplete_runs": sum(1 for r in results if not r.complete),
            "undeclared": sum(r.undeclared for r in results),
            "classes": {
                name: {**counts, "status": CLASSES[name].status if name in CLASSES else UNDECLARED}
                for name, counts in summary_counts(results).items()
            },
        },
    }


def _t(value: float | None) -> str:
    return "kept" if value is None else f"{value:.1f}s"


def write_table(results: Sequence[ClusterResult], out: TextIO) -> None:
    for r in results:
        runs = []
        for o in (r.calico, r.ipamgc):
            state = "quiet" if o.quiet else ("error: " + o.error.splitlines()[0] if o.error else "deadline")
            runs.append(f"{o.collector} {len(o.released)} released, {len(o.blocks_deleted)} blocks, {state}")
        print(
            f"{r.name}: {r.allocations} allocations, {r.blocks} blocks, {r.affinities} affinities; "
            f"{'; '.join(runs)}; {len(r.differences)} differences",
            file=out,
        )
        for d in r.differences:
            print(
                f"  {d.kind:<10} {d.subject:<28} calico {_t(d.calico):>6}  ipamgc {_t(d.ipamgc):>6}  "
                f"[{d.cls}] truth: {d.truth}; {d.detail}",
                file=out,
            )
    counts = summary_counts(results)
    print(
        f"summary: {len(results)} clusters, {sum(c['differences'] for c in counts.values())} differences",
        file=out,
    )
    for name, c in counts.items():
        status = CLASSES[name].status if name in CLASSES else UNDECLARED
        print(f"  {name:<28} {status:<11} {c['differences']:>4} in {c['clusters']} clusters", file=out)
    incomplete = [r.name for r in results if not r.complete]
    if incomplete:
        print(f"  incomplete runs (not quiet, or an error): {', '.join(incomplete)}", file=out)
