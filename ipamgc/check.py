"""`ipamgc check`: an offline audit of a cluster snapshot, like `calicoctl ipam check`.

Reads the List printed by `kubectl get nodes,pods,ipamblocks.crd.projectcalico.org,
ipamhandles.crd.projectcalico.org,blockaffinities.crd.projectcalico.org -A -o json` (one or several files,
or `-` for stdin), runs the same rules as the workers and prints a table or the JSON contract of design.md.
Calico's objects may come from either API group (`.projectcalico.org` for a cluster on Calico 3.33's v3
CRDs): both carry the same fields, and a BlockAffinity's `deleted` is read as a string or a boolean.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

import orjson
from rich.console import Console
from rich.table import Table

from ipamgc import __version__, checkhandles
from ipamgc.calicoswitch import CollectorState
from shared.audit import AuditReport, audit
from shared.duration import format_duration, parse_duration
from shared.errors import ConfigError, SnapshotError
from shared.model import ATTR_NAMESPACE, ATTR_POD
from shared.snapshot import Inventory, build_inventory
from shared.verdicts import AllocationType, Release

EXPORT_HINT = (
    "kubectl get nodes,pods,ipamblocks.crd.projectcalico.org,ipamhandles.crd.projectcalico.org,"
    "blockaffinities.crd.projectcalico.org -A -o json (on Calico's v3 CRDs: ipamblocks.projectcalico.org,"
    " ipamhandles.projectcalico.org, blockaffinities.projectcalico.org; with KubeVirt, add "
    "virtualmachines.kubevirt.io,virtualmachineinstances.kubevirt.io)"
)


def parse_grace(text: str) -> float | None:
    """`--leak-grace-period`: a Go duration, or `none` for Calico's unset (no GC on live nodes)."""
    if text.strip().lower() in ("none", "off", "unset", "nil"):
        return None
    return parse_duration(text)


def read_items(source: str, stdin: TextIO | None = None) -> list[Any]:
    """The objects of one snapshot file (`-` for stdin).  Raises SnapshotError with a one-line reason."""
    try:
        if source == "-":
            stream = stdin or sys.stdin
            data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read().encode()
        else:
            data = Path(source).read_bytes()
    except OSError as exc:
        raise SnapshotError(f"{source}: cannot read: {exc.strerror or exc}") from exc
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SnapshotError(f"{source}: not JSON: {exc}") from exc
    if isinstance(doc, dict) and isinstance(doc.get("items"), list):
        return list(doc["items"])
    if isinstance(doc, dict) and isinstance(doc.get("kind"), str) and "metadata" in doc:
        return [doc]
    raise SnapshotError(
        f"{source}: not a Kubernetes List (expected an object with 'items'; export with {EXPORT_HINT})"
    )


def load(sources: Iterable[str], stdin: TextIO | None = None) -> Inventory:
    items: list[Any] = []
    for source in sources:
        items.extend(read_items(source, stdin))
    inv = build_inventory(items)
    _refuse_partial(inv)
    return inv


def _refuse_partial(inv: Inventory) -> None:
    """A partial export would make every allocation look leaked, or a leaking cluster look clean: refuse
    blocks without nodes or pods, and pods without blocks (an empty List is an empty cluster)."""
    has_blocks = bool(inv.blocks) or "IPAMBlock" in inv.kinds_seen
    has_pods = "Pod" in inv.kinds_seen
    if has_pods and not has_blocks:
        raise SnapshotError(
            "snapshot has pods but no IPAM objects (no IPAMBlock): a partial export, or a cluster "
            f"without Calico IPAM; export everything with: {EXPORT_HINT}"
        )
    if not has_blocks:
        return
    if "Node" not in inv.kinds_seen:
        raise SnapshotError(
            f"snapshot has IPAM blocks but no Node objects; export everything with: {EXPORT_HINT}"
        )
    if not has_pods:
        raise SnapshotError(
            f"snapshot has IPAM blocks but no Pod objects; export everything with: {EXPORT_HINT}"
        )


REPORT_GENERATOR = "ipamgc check"
REPORT_FORMAT = 1


def report_header(now: float, source: str) -> dict[str, Any]:
    """What `ipamgc release --from-report` reads first: whose report this is, and when it was made."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    return {
        "generator": REPORT_GENERATOR,
        "format": REPORT_FORMAT,
        "version": __version__,
        "generated_at": stamp,
        "source": source,
    }


def to_json(report: AuditReport, header: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON contract of design.md ("The snapshot format of ipamgc check"), plus `report` (the
    header) and each allocation's `sequence_number` (Calico's, for `release --from-report`'s
    conditional writes)."""
    return {
        **({"report": header} if header is not None else {}),
        "summary": report.summary,
        "allocations": [
            {
                "ip": r.verdict.allocation.ip,
                "block": r.verdict.allocation.block,
                "handle": r.verdict.allocation.handle,
                "node": r.verdict.allocation.node,
                "namespace": r.verdict.allocation.attrs.get(ATTR_NAMESPACE, ""),
                "pod": r.verdict.allocation.attrs.get(ATTR_POD, ""),
                "type": r.verdict.type.value,
                "valid": r.verdict.valid,
                "reason": r.verdict.reason.value,
                "release": r.release.value,
                "sequence_number": r.verdict.allocation.sequence_number,
            }
            for r in report.rows
        ],
        "empty_blocks": [
            {"block": e.block, "node": e.node, "reason": e.reason.value, "release": e.release.value}
            for e in report.empty_blocks
        ],
    }


_RELEASE_STYLE = {Release.NOW: "bold red", Release.AFTER_GRACE: "yellow", Release.NEVER: "dim"}


def render_table(report: AuditReport, grace: float | None, console: Console, show_all: bool = False) -> None:
    """Leaks grouped by node (every allocation with `show_all`), then empty blocks, then a summary line."""
    by_node: dict[str, list[Any]] = defaultdict(list)
    for r in report.rows:
        if show_all or not r.verdict.valid:
            by_node[r.verdict.allocation.node or "(no node attribute)"].append(r)
    for node in sorted(by_node):
        rows = by_node[node]
        gone = " (node deleted)" if node in report.gone_nodes else ""
        title = f"node {node}{gone}: {sum(1 for r in rows if not r.verdict.valid)} leaked"
        table = Table(title=title, title_justify="left", title_style="bold")
        table.add_column("ip", no_wrap=True)
        table.add_column("owner", overflow="fold")
        table.add_column("type", no_wrap=True)
        table.add_column("reason", no_wrap=True)
        table.add_column("release", no_wrap=True)
        table.add_column("block", no_wrap=True)
        table.add_column("handle", no_wrap=True, overflow="ellipsis", max_width=32)
        for r in rows:
            a = r.verdict.allocation
            owner = "/".join(p for p in (a.attrs.get(ATTR_NAMESPACE, ""), a.attrs.get(ATTR_POD, "")) if p)
            if r.verdict.type is AllocationType.TUNNEL:
                owner = a.attrs.get("type", "")
            table.add_row(
                a.ip,
                owner,
                r.verdict.type.value,
                r.verdict.reason.value,
                f"[{_RELEASE_STYLE[r.release]}]{r.release.value}[/]",
                a.block,
                a.handle,
            )
        console.print(table)
    if report.empty_blocks:
        table = Table(title="empty blocks", title_justify="left")
        for col in ("block", "node", "reason", "release"):
            table.add_column(col)
        for e in report.empty_blocks:
            table.add_row(
                e.block, e.node, e.reason.value, f"[{_RELEASE_STYLE[e.release]}]{e.release.value}[/]"
            )
        console.print(table)
    s = report.summary
    empty_now = sum(1 for e in report.empty_blocks if e.release is Release.NOW)
    empty_later = sum(1 for e in report.empty_blocks if e.release is Release.AFTER_GRACE)
    grace_text = "unset" if grace is None else format_duration(grace)
    # Every leaked IP is counted: what is released now, after grace, and what is kept (`release: never`:
    # held by handle all-or-none, by its node's cleanup being held, or by no grace period).
    kept = s["leaked"] - s["release_now"] - s["release_after_grace"]
    leader_only = leader_only_note(report)
    if leader_only:
        console.print(leader_only, highlight=False)
    console.print(
        f"{s['allocations']} allocations: {s['in_use']} in use, {s['leaked']} leaked "
        f"({s['release_now']} release now, {s['release_after_grace']} after the {grace_text} grace period, "
        f"{kept} kept); "
        f"{len(report.empty_blocks)} empty blocks ({empty_now} release now, {empty_later} after grace)",
        highlight=False,
    )


DEFAULT_GRACE = "15m"  # Calico's, for a snapshot (which holds no KubeControllersConfiguration)


def run_check(
    sources: list[str],
    output: str,
    grace_text: str | None,
    show_all: bool,
    out: TextIO,
    err: TextIO,
    stdin: TextIO | None = None,
    live_items: list[Any] | None = None,
    now: float | None = None,
    kubevirt: bool | None = None,
    cluster_grace: tuple[float | None, str] | None = None,
    output_file: str | None = None,
    calico_collector: CollectorState | None = None,
) -> int:
    """The whole command; returns the exit status (0 leaks or not, 2 on unreadable or invalid input).

    `live_items`: objects already read from a live cluster (`--kubeconfig`) instead of snapshot files.
    `kubevirt`: KubeVirt installed (`--kubevirt` / `--no-kubevirt`); None: when the input holds any
    kubevirt.io object.  `grace_text`: `--leak-grace-period`, which wins over `cluster_grace` (the
    grace the running collector uses, and whence: `ipamgc.checklive`), which wins over Calico's 15m.
    `output_file`: the JSON report is written there too (calicoctl's `ipam check -o FILE`).
    `calico_collector`: live, whether Calico's own collector still collects (`ipamgc.calicoswitch`).
    """
    try:
        if grace_text is not None:
            grace, whence = parse_grace(grace_text), "--leak-grace-period"
        elif cluster_grace is not None:
            grace, whence = cluster_grace
        else:
            grace, whence = (
                parse_grace(DEFAULT_GRACE),
                "Calico's default; --leak-grace-period to judge with another",
            )
        if live_items is not None:
            inv = build_inventory(live_items)
            _refuse_partial(inv)
        else:
            inv = load(sources, stdin)
    except (ConfigError, SnapshotError) as exc:
        print(f"ipamgc check: error: {exc}", file=err)
        return 2
    for skipped in inv.skipped:
        print(f"ipamgc check: warning: {skipped}", file=err)
    if grace_text is None:  # not given: say which one judged, and whence
        shown = "unset" if grace is None else format_duration(grace)
        print(f"ipamgc check: leak grace period {shown} ({whence})", file=err)
    if calico_collector is not None:
        print(f"ipamgc check: Calico's collector: {calico_collector.line}", file=err)
    report = audit(inv, grace, kubevirt=kubevirt)
    source = "live" if live_items is not None else "snapshot"
    at = time.time() if now is None else now
    header = report_header(at, source)
    handles = checkhandles.divergent_handles(inv)
    doc = {**to_json(report, header), "handle_gc": checkhandles.handles_json(handles, grace, at)}
    if calico_collector is not None:
        doc["calico_collector"] = calico_collector.to_json()
    if output_file is not None:
        try:
            write_report(output_file, doc)
        except OSError as exc:
            print(f"ipamgc check: error: {output_file}: cannot write: {exc.strerror or exc}", file=err)
            return 2
        print(f"ipamgc check: wrote the report to {output_file}", file=err)
    if output == "json":
        out.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        width = None if out.isatty() else 160
        console = Console(file=out, width=width, soft_wrap=False)
        render_table(report, grace, console, show_all)
        checkhandles.render_handles(handles, grace, at, console)
    return 0


def write_report(path: str, doc: dict[str, Any]) -> None:
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    tmp.replace(target)


def leader_only_note(report: AuditReport) -> str:
    """What `release --from-report` leaves to the running leader: empty blocks, and IPs whose grace
    period is still running ("" when there is none)."""
    blocks = [e for e in report.empty_blocks if e.release in (Release.NOW, Release.AFTER_GRACE)]
    later = sum(1 for r in report.rows if r.release is Release.AFTER_GRACE)
    parts = []
    if blocks:
        parts.append(f"{len(blocks)} empty block(s)")
    if later:
        parts.append(f"{later} IP(s) marked after-grace")
    if not parts:
        return ""
    return (
        f"{' and '.join(parts)} are freed only by the running leader (`ipamgc up`, or the deployment): "
        "`release --from-report` releases the IPs marked `release: now`, never blocks, and nothing "
        "before its grace period has passed"
    )
