"""What the realapi tests share: the allocations a real server holds, and the judgement of a run against
the actors' ground truth (every leak released, no IP in use released)."""

from __future__ import annotations

from collections.abc import Callable

from lab.cluster.cluster import SimCluster
from lab.cluster.restapi import RestStore
from shared.blockops import ip_of
from tests.polling import wait_until


def allocated_ips(store: RestStore) -> set[str]:
    """Every IP an IPAMBlock on the server holds for a handle (cooling-down ordinals are free)."""
    out: set[str] = set()
    for block in store.list("ipamblocks")["items"]:
        spec = block["spec"]
        attrs = spec.get("attributes") or []
        for ordinal, idx in enumerate(spec.get("allocations") or []):
            if (
                isinstance(idx, int)
                and 0 <= idx < len(attrs)
                and (attrs[idx] or {}).get("handle_id") is not None
            ):
                out.add(ip_of(spec, ordinal))
    return out


def store_of(sim: SimCluster) -> RestStore:
    assert isinstance(sim.store, RestStore)
    return sim.store


def wait_released(
    sim: SimCluster, leaked: set[str], timeout: float = 90.0, alive: Callable[[], None] | None = None
) -> None:
    """Poll until every IP in `leaked` is free on the server and the actors' truth has seen it freed
    (`alive`: fails the test at once when a component has exited)."""
    store = store_of(sim)

    def done() -> bool:
        if alive is not None:
            alive()
        if allocated_ips(store) & leaked:
            return False
        store.settle()
        return not (sim.truth.leaked_ips() & leaked)

    wait_until(done, timeout=timeout, interval=0.25, what=f"the release of {sorted(leaked)}")


def judge(sim: SimCluster) -> None:
    """No IP in use was released, and every IP in use is still allocated on the server."""
    store = store_of(sim)
    store.settle()
    assert sim.truth.violations == [], f"IPs in use released: {sim.truth.violations}"
    in_use = sim.truth.in_use_ips()
    missing = in_use - allocated_ips(store)
    assert missing == set(), f"IPs in use no longer allocated: {sorted(missing)}"
