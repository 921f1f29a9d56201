"""The chart's knobs of issue 45, one test each, rendered by the real helm (tests/deploy/tools.py):
per-component extraArgs/extraEnv, the leader's rate limit, priorityClassName, topologySpreadConstraints
(zone spread of the standbys by default), the security contexts (OpenShift's arbitrary UIDs), PDBs with
maxUnavailable 1, a NetworkPolicy per component (egress to Redis, DNS and the API server only), and a
values.schema.json that refuses a misspelt value."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.deploy.conftest import Obj, find, load_manifests
from tests.deploy.test_helm import ALL_VALUES, CHART, CI_VALUES, helm_template, render


def _pod(objs: list[Obj], name: str) -> Any:
    [d] = find(objs, "Deployment", name)
    return d["spec"]["template"]["spec"]


def _env(objs: list[Obj], name: str) -> list[tuple[str, str | None]]:
    [c] = _pod(objs, name)["containers"]
    return [(e["name"], e.get("value")) for e in c["env"]]


def test_extra_args_and_env_per_component() -> None:
    objs = render(
        CI_VALUES,
        sets=(
            "worker.extraArgs={--batch-size=500,--job-idle=20s}",
            "leader.extraEnv[0].name=IPAMGC_LOG_LEVEL",
            "leader.extraEnv[0].value=DEBUG",
            "extraEnv[0].name=IPAMGC_PREFIX",
            "extraEnv[0].value=gc",
        ),
    )
    [worker] = _pod(objs, "ipamgc-worker")["containers"]
    assert worker["args"][-2:] == ["--batch-size=500", "--job-idle=20s"]
    [watcher] = _pod(objs, "ipamgc-watcher")["containers"]
    assert "--batch-size" not in watcher["args"]
    leader = _env(objs, "ipamgc-leader")
    # the global extraEnv, then the component's own (which so wins)
    assert leader.index(("IPAMGC_PREFIX", "gc")) < leader.index(("IPAMGC_LOG_LEVEL", "DEBUG"))
    assert ("IPAMGC_LOG_LEVEL", "DEBUG") not in _env(objs, "ipamgc-watcher")


def test_the_leaders_rate_limit() -> None:
    assert not [n for n, _ in _env(render(CI_VALUES), "ipamgc-leader") if n == "IPAMGC_RATE_LIMIT"]
    for value, text in (("7.5", "7.5"), ("0", "0")):
        objs = render(CI_VALUES, sets=(f"leader.rateLimit={value}",))
        assert ("IPAMGC_RATE_LIMIT", text) in _env(objs, "ipamgc-leader")
        assert "IPAMGC_RATE_LIMIT" not in dict(_env(objs, "ipamgc-worker"))
    objs = render(CI_VALUES, sets=("leader.deletedNodeRateLimit=300",))
    assert ("IPAMGC_DELETED_NODE_RATE_LIMIT", "300") in _env(objs, "ipamgc-leader")
    assert "IPAMGC_DELETED_NODE_RATE_LIMIT" not in dict(_env(render(CI_VALUES), "ipamgc-leader"))


def test_priority_class_global_and_per_component() -> None:
    objs = render(
        CI_VALUES, sets=("priorityClassName=system-cluster-critical", "leader.priorityClassName=gc-high")
    )
    assert _pod(objs, "ipamgc-watcher")["priorityClassName"] == "system-cluster-critical"
    assert _pod(objs, "ipamgc-leader")["priorityClassName"] == "gc-high"
    assert "priorityClassName" not in _pod(render(CI_VALUES), "ipamgc-worker")


def test_standbys_spread_over_zones_by_default_and_the_spread_is_settable() -> None:
    objs = render(CI_VALUES)
    for component in ("watcher", "leader"):
        [spread] = _pod(objs, f"ipamgc-{component}")["topologySpreadConstraints"]
        assert spread["topologyKey"] == "topology.kubernetes.io/zone"
        assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # never keeps a replica from starting
        assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
    assert "topologySpreadConstraints" not in _pod(objs, "ipamgc-worker")
    custom = render(
        CI_VALUES,
        sets=(
            "worker.topologySpreadConstraints[0].maxSkew=2",
            "worker.topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
            "worker.topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
            "leader.topologySpreadConstraints=null",
        ),
    )
    assert _pod(custom, "ipamgc-worker")["topologySpreadConstraints"][0]["maxSkew"] == 2
    assert "topologySpreadConstraints" not in _pod(custom, "ipamgc-leader")


def test_security_contexts_for_arbitrary_uids() -> None:
    objs = render(
        CI_VALUES,
        sets=(
            "podSecurityContext.runAsUser=null",
            "podSecurityContext.runAsGroup=null",
            "securityContext.readOnlyRootFilesystem=false",
        ),
    )
    for component in ("watcher", "worker", "leader"):
        pod = _pod(objs, f"ipamgc-{component}")
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        [c] = pod["containers"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is False
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


COMPONENTS_AND_REDIS = ("leader", "redis", "watcher", "worker")


def test_disruption_budgets_never_block_a_drain() -> None:
    for objs in (render(CI_VALUES), load_manifests()):
        budgets = find(objs, "PodDisruptionBudget")
        assert sorted(b["metadata"]["name"] for b in budgets) == [f"ipamgc-{c}" for c in COMPONENTS_AND_REDIS]
        for pdb in budgets:
            assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"], pdb


def _egress_ports(policy: Obj) -> list[tuple[int, ...]]:
    return [tuple(p["port"] for p in rule["ports"]) for rule in policy["spec"]["egress"]]


def test_a_network_policy_per_component_with_egress_to_redis_dns_and_the_api_server_only() -> None:
    objs = render(CI_VALUES)
    [redis] = find(objs, "NetworkPolicy", "ipamgc-redis")
    assert redis["spec"]["policyTypes"] == ["Ingress", "Egress"] and "egress" not in redis["spec"]
    for component, api in (("watcher", True), ("worker", False), ("leader", True)):
        [policy] = find(objs, "NetworkPolicy", f"ipamgc-{component}")
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        [ingress] = policy["spec"]["ingress"]
        assert ingress["ports"] == [{"protocol": "TCP", "port": 9094}]
        expected = [(6379,), (53, 53)] + ([(443, 6443)] if api else [])
        assert _egress_ports(policy) == expected, component
        redis_rule = policy["spec"]["egress"][0]
        assert redis_rule["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    narrowed = render(
        CI_VALUES,
        ALL_VALUES,
        sets=(
            "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
            "networkPolicy.externalRedis.cidrs={192.0.2.10/32}",
            "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring",
        ),
    )
    assert not find(narrowed, "NetworkPolicy", "ipamgc-redis")  # external Redis: none of ours
    [leader] = find(narrowed, "NetworkPolicy", "ipamgc-leader")
    redis_rule, _dns, api_rule = leader["spec"]["egress"]
    assert redis_rule == {
        "ports": [{"protocol": "TCP", "port": 6379}],
        "to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}],
    }
    assert api_rule["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    assert leader["spec"]["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    ]
    assert not find(render(CI_VALUES, sets=("networkPolicy.enabled=false",)), "NetworkPolicy")


def test_the_schema_refuses_a_misspelt_value_and_accepts_every_default() -> None:
    """And a number where Kubernetes wants a string (an argument), which would render an invalid pod."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    for typo in ("watcher.replicsa=3", "leader.rateLimt=5", "networkPolicy.enabeld=false", "dryrun=true"):
        done = helm_template(CI_VALUES, sets=(typo,))
        assert done.returncode != 0, typo
        assert "additional properties" in done.stderr.lower() or "not allowed" in done.stderr.lower(), (
            done.stderr
        )
    for wrong in ("logFormat=yaml", "worker.extraArgs={--batch-size,500}", "leader.rateLimit=fast"):
        assert helm_template(CI_VALUES, sets=(wrong,)).returncode != 0, wrong
    # every default and every optional piece validates
    assert helm_template(CI_VALUES, ALL_VALUES).returncode == 0
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(schema["properties"]) == set(values) | {"global"}


def _redis(objs: list[Obj]) -> Obj:
    [sts] = find(objs, "StatefulSet", "ipamgc-redis")
    return sts


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


_UNITS = {"kb": 1024, "mb": 1024**2, "gb": 1024**3, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}


def _bytes(quantity: str) -> int:
    number = quantity.rstrip("kmgbKMGi")
    return int(number) * _UNITS[quantity[len(number) :]]


def test_the_bundled_redis_is_valkey_bounded_with_noeviction_and_persisted_on_a_claim() -> None:
    """deploy/ and the chart's defaults: Valkey, maxmemory with noeviction and room under the memory limit
    for an AOF rewrite's fork (limit >= 2 x maxmemory + 128Mi), the AOF on a PersistentVolumeClaim of at
    least twice maxmemory, `--hz 1` kept."""
    for objs in (render(CI_VALUES), load_manifests()):
        sts = _redis(objs)
        [c] = sts["spec"]["template"]["spec"]["containers"]
        assert c["image"].startswith("valkey/valkey:")
        assert c["livenessProbe"]["exec"]["command"] == ["valkey-cli", "ping"]
        args = c["args"]
        assert args[0].startswith("--")  # flags only: the image's entrypoint runs its own server
        assert _flag(args, "--maxmemory-policy") == "noeviction" and _flag(args, "--hz") == "1"
        assert _flag(args, "--appendonly") == "yes" and _flag(args, "--save") == ""
        maxmemory = _bytes(_flag(args, "--maxmemory"))
        # docs/redis-keys.md's bytes per pod IP for 150,000 pods, and the audit stream at its cap
        assert maxmemory >= 1.25 * (150_000 * 982 * 1.5 + 100e6) * 0.99
        assert _bytes(c["resources"]["limits"]["memory"]) >= 2 * maxmemory + 128 * 1024**2
        [claim] = sts["spec"]["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "data" and "storageClassName" not in claim["spec"]
        assert _bytes(claim["spec"]["resources"]["requests"]["storage"]) >= 2 * maxmemory
        assert "data" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}


def test_redis_values_choose_the_server_the_bound_and_the_volume() -> None:
    objs = render(
        CI_VALUES,
        sets=(
            "redis.server=redis",
            "redis.maxmemory=600mb",
            "redis.persistence.storageClass=fast-ssd",
            "redis.persistence.size=2Gi",
        ),
    )
    sts = _redis(objs)
    [c] = sts["spec"]["template"]["spec"]["containers"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert c["image"] == values["redis"]["images"]["redis"]
    assert c["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]
    assert _flag(c["args"], "--maxmemory") == "600mb"
    [claim] = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"

    off = _redis(render(CI_VALUES, sets=("redis.persistence.enabled=false",)))
    [c] = off["spec"]["template"]["spec"]["containers"]
    assert _flag(c["args"], "--appendonly") == "no" and "volumeClaimTemplates" not in off["spec"]
    assert {"name": "data", "emptyDir": {}} in off["spec"]["template"]["spec"]["volumes"]
    no_budget = render(CI_VALUES, sets=("redis.podDisruptionBudget.enabled=false",))
    assert len(find(no_budget, "PodDisruptionBudget")) == 3  # the components' stay
    assert not find(no_budget, "PodDisruptionBudget", "ipamgc-redis")
    for bad in ("redis.server=keydb", "redis.maxmemory=400MB", "redis.persistence.size=1G"):
        done = helm_template(CI_VALUES, sets=(bad,))
        assert done.returncode != 0 and "values don't meet the specifications" in done.stderr, bad
