"""Least privilege on a real API server, from its audit log: run last in the tier (the file name sorts
last), it reads every request each component made in the tier's tests (the watcher and the leader under
their ServiceAccounts, `check` as a user bound to `ipamgc-check`, `release` with the leader's
ServiceAccount) and checks both ways against deploy/rbac.yaml:

- RBAC refused nothing (a 403 is a verb or resource deploy/ forgot): this fails the test;
- every (group, resource, verb) deploy/ grants was used by a component it is granted to, or is printed
  (a needless grant shows) and must be one of the known ones below, each with why the tier cannot use it.
"""

from __future__ import annotations

import pytest

from tests.realapi.audit import Call, Recorder, granted
from tests.realapi.conftest import _clusters

pytestmark = pytest.mark.realapi

#: granted, and needed, but not exercised by the tier (each: why).  The handle collector's recreation of a
#: missing IPAMHandle was here until test_handles.py ran the leader on a fake clock (issue 46).
NOT_EXERCISED: dict[tuple[str, str, str], str] = {}


def _key(c: Call) -> tuple[str, str, str, str, str]:
    return (c.verb, c.group, c.resource, c.namespace, c.name)


def _pairs(calls: set[Call]) -> set[tuple[str, str, str]]:
    """The (group, resource, verb) of the calls RBAC allowed (any answer but 403)."""
    return {(c.group, c.resource.split("/")[0], c.verb) for c in calls if c.code != 403}


def test_every_call_was_granted_and_every_grant_was_used() -> None:
    assert _clusters, (
        "no real API server ran in this session: run the whole tier (pytest -m realapi tests/realapi)"
    )
    rec = Recorder()
    for cluster in _clusters.values():
        rec.collect(cluster)
    for who in ("watch", "lead", "check", "release"):
        assert rec.calls.get(who), f"{who} made no request to the real API server"
    lines = []
    for who, calls in sorted(rec.calls.items()):
        lines.append(f"{who}: " + ", ".join(sorted({f"{v} {g or 'core'}/{r}" for g, r, v in _pairs(calls)})))
    print("\n".join(["calls per component (verb group/resource):", *lines]))
    # A 403 for a call that was also answered with a success is no missing grant: right after the API
    # server restart (tests/realapi/test_v3_and_restarts.py) it refuses allowed requests until its RBAC
    # informers have synced.  A call that only ever got 403 is a verb or resource deploy/ lacks.
    answered = {who: {_key(c) for c in calls if c.code < 400} for who, calls in rec.calls.items()}
    refused = sorted((who, c) for who, calls in rec.calls.items() for c in calls if c.code == 403)
    transient = [(who, c) for who, c in refused if _key(c) in answered[who]]
    print(f"403 answered to calls granted and answered otherwise (API server restarts): {len(transient)}")
    denied = [(who, c) for who, c in refused if _key(c) not in answered[who]]
    assert denied == [], f"requests RBAC refused (a verb deploy/rbac.yaml lacks): {denied}"

    grants = {
        "watch": granted(service_account="ipamgc-watcher"),
        "lead": granted(service_account="ipamgc-leader"),
        "check": granted(cluster_role="ipamgc-check"),
    }
    used = {
        "watch": _pairs(rec.calls["watch"]),
        "lead": _pairs(rec.calls["lead"]) | _pairs(rec.calls["release"]),  # the leader's ServiceAccount
        "check": _pairs(rec.calls["check"]),
    }
    unused = {who: sorted(grants[who] - used[who]) for who in grants}
    print("granted but not used in the tier:", unused)
    surprising = {who: [p for p in pairs if p not in NOT_EXERCISED] for who, pairs in unused.items()}
    assert all(not p for p in surprising.values()), (
        f"granted, never used (not least privilege?): {surprising}"
    )
