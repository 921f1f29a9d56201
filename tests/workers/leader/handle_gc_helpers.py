"""What the handle collector's tests share: a leader with it on, passes on the fake clock, and the ways a
handle goes out of step with its blocks (each one a crash between Calico's two writes)."""

from __future__ import annotations

from typing import Any

from kubeio.election import Leadership
from shared.names import handle_name
from tests.fixtures.leader import GRACE, Env, leader_settings
from workers.leader.audit import AuditRecord, Result
from workers.leader.loop import Leader

SCAN = 60.0  # seconds between scans in these tests


def gc_leader(env: Env, identity: str = "leader-a", **overrides: Any) -> Leader:
    env.sync()
    return env.leader(identity, handle_gc=True, handle_gc_interval_seconds=SCAN, **overrides)


def gc_leader_on(env: Env, api: Any) -> Leader:
    """A started leader with the collector on, talking to the API through `api` (a wrapper that plays a
    CNI or a refusal around the real one)."""
    env.sync()
    lead = Leader(
        leader_settings(handle_gc=True, handle_gc_interval_seconds=SCAN),
        env.redis,
        api,
        Leadership.granted("leader-a"),
        clock=env.clock,
    )
    lead.start()
    return lead


def passes(env: Env, lead: Leader, n: int, every: float = GRACE / 2) -> None:
    """`n` leader passes, the fake clock moved on by `every` after each."""
    for _ in range(n):
        lead.step()
        env.clock.advance(every)


def handle_obj(env: Env, handle: str) -> dict[str, Any]:
    return env.server.store.get("ipamhandles", None, handle_name(handle))


def set_counts(env: Env, handle: str, counts: dict[str, int], deleted: bool | None = None) -> None:
    obj = handle_obj(env, handle)
    obj["spec"]["block"] = counts
    if deleted is not None:
        obj["spec"]["deleted"] = deleted
    env.server.store.replace("ipamhandles", None, obj["metadata"]["name"], obj)


def drop_handle(env: Env, handle: str) -> None:
    env.server.store.delete("ipamhandles", None, handle_name(handle))


def orphan(env: Env, handle: str, counts: dict[str, int], deleted: bool = False) -> None:
    """An IPAMHandle no block holds anything for (a CNI that crashed after its handle write)."""
    body = {
        "apiVersion": env.sim.calico.api_version,
        "kind": "IPAMHandle",
        "metadata": {"name": handle_name(handle)},
        "spec": {"handleID": handle, "block": counts, "deleted": deleted},
    }
    env.server.store.create("ipamhandles", None, body)


def handle_records(env: Env) -> list[AuditRecord]:
    return [r for r in env.audit() if r.rule.startswith("handle-")]


def repaired(env: Env) -> list[tuple[str, str, str]]:
    """(handle, class, action) of every repair recorded."""
    return [
        (r.handle, r.rule.removeprefix("handle-"), r.evidence["handle_gc"]["action"])
        for r in handle_records(env)
        if r.result is Result.REPAIRED
    ]


def leader_writes(env: Env, identity: str = "leader-a") -> list[tuple[str, str, int]]:
    """(method, resource, status) of the leader's writes to Calico's IPAM objects."""
    return [(r.method, r.resource or "", r.status) for r in env.writes(identity)]
