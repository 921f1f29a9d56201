"""What a failed chaos run leaves behind for its post-mortem: the run's Redis goes with the run, so before
it stops, the leader's audit stream and what Redis holds of each leak still outstanding are written into
the run's log directory (`evidence.json`).

Per outstanding IP: its mirrored allocation records (shard, id, sequence number, node), the worker's
marks on each (candidate timer, decided mark, due time, dirty), the decisions the stream still holds for
it, and the audit records that name it.  Whatever cannot be read is written as the error it gave: a
post-mortem of a run whose Redis was failing must still be written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis

from shared.codec import RecordError
from shared.gcrecords import decode_candidate, decode_decided, decode_decision
from shared.keys import Keys
from shared.records import decode_allocation
from workers.leader.audit import read_audit


def keep_evidence(client: redis.Redis, keys: Keys, outstanding: list[str], shards: int, path: Path) -> str:
    """Write the evidence of `outstanding` (IPs) to `path`; returns a one-line summary for the timeline."""
    doc: dict[str, Any] = {"outstanding": {}, "audit": [], "errors": []}
    try:
        records, unreadable = read_audit(client, keys)
        doc["audit"] = [r.as_json() for r in records]
        doc["audit_unreadable"] = unreadable
        wanted = set(outstanding)
        for ip in outstanding:
            doc["outstanding"][ip] = {"allocations": [], "decisions": []}
        for shard in range(shards):
            for alloc in _allocations(client, keys, shard, wanted, doc["errors"]):
                doc["outstanding"][alloc["ip"]]["allocations"].append(alloc)
        for entry, d in _decisions(client, keys, wanted, doc["errors"]):
            doc["outstanding"][d["ip"]]["decisions"].append({"entry": entry, **d})
        for ip in outstanding:
            doc["outstanding"][ip]["audit"] = [r for r in doc["audit"] if r.get("ip") == ip]
    except redis.RedisError as exc:
        doc["errors"].append(f"Redis: {exc}")
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2, default=str))
    return (
        f"{path} ({len(doc['audit'])} audit records, {len(outstanding)} outstanding IPs"
        + (f", {len(doc['errors'])} errors" if doc["errors"] else "")
        + ")"
    )


def _allocations(
    client: redis.Redis, keys: Keys, shard: int, ips: set[str], errors: list[str]
) -> list[dict[str, Any]]:
    """The shard's allocation records of `ips`, each with the worker's marks on it."""
    found: list[dict[str, Any]] = []
    for raw_id, raw in client.hscan_iter(keys.alloc(shard), count=1000):
        alloc_id = raw_id.decode(errors="replace")
        try:
            a = decode_allocation(alloc_id, raw)
        except RecordError as exc:
            errors.append(f"allocation {alloc_id}: {exc}")
            continue
        if a.ip in ips:
            found.append(
                {
                    "shard": shard,
                    "id": alloc_id,
                    "ip": a.ip,
                    "sequence_number": a.sequence_number,
                    "node": a.node,
                }
            )
    pipe = client.pipeline(transaction=False)  # every found allocation's marks in one round trip
    for item in found:
        pipe.hget(keys.cand(shard), item["id"])
        pipe.hget(keys.decided(shard), item["id"])
        pipe.zscore(keys.due(shard), item["id"])
        pipe.sismember(keys.dirty(shard), item["id"])
    replies = pipe.execute() if found else []
    for i, item in enumerate(found):
        cand, decided, due, dirty = replies[4 * i : 4 * i + 4]
        item["candidate"] = _decoded(decode_candidate, cand, errors)
        item["decided"] = _decoded(decode_decided, decided, errors)
        item["due"] = due
        item["dirty"] = bool(dirty)
    return found


def _decisions(
    client: redis.Redis, keys: Keys, ips: set[str], errors: list[str]
) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for raw_entry, fields in client.xrange(keys.decisions) or []:
        entry = raw_entry.decode() if isinstance(raw_entry, bytes) else str(raw_entry)
        raw = (fields or {}).get(b"d", b"")
        try:
            d = decode_decision(raw if isinstance(raw, bytes) else b"")
        except RecordError as exc:
            errors.append(f"decision {entry}: {exc}")
            continue
        if d.ip in ips:
            out.append((entry, dataclasses.asdict(d)))
    return out


def _decoded(decode: Callable[[bytes], Any], raw: bytes | None, errors: list[str]) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        return dict(dataclasses.asdict(decode(raw)))
    except RecordError as exc:
        errors.append(str(exc))
        return {"unreadable": raw.hex()}
