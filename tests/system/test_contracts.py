"""The seams between components: the producer's RQ jobs are the workers' jobs (one definition, the shard
queue's protocol, imported by both), settings come from flags and
`IPAMGC_*`, and `fetch_live_inventory` reads a live cluster as `ipamgc check` expects it."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

import producer.watcher
import workers.shards.run
import workers.shards.validate
from ipamgc.commands.watch import watch
from ipamgc.commands.work import work
from ipamgc.inventory import fetch_live_inventory
from kubeio import errors as kube_errors
from kubeio.watch import Backoff
from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from redisio.shardqueue import jobs
from shared.config import GraceOverride, Settings, from_env
from shared.errors import ConfigError
from shared.snapshot import build_inventory
from tests.fixtures.stack import KEYS
from workers.shards.run import parse_shards


def test_the_producer_enqueues_exactly_the_workers_shard_job(client: redis.Redis) -> None:
    # One definition: the watcher enqueues with the protocol's enqueuer, the workers run its job class.
    assert producer.watcher.ShardEnqueuer is jobs.ShardEnqueuer
    assert workers.shards.validate.ShardEnqueuer is jobs.ShardEnqueuer
    assert workers.shards.run.ShardJob is jobs.ShardJob
    jobs.ShardEnqueuer(client, KEYS)(3)
    reference = jobs.enqueue_shard(jobs.shard_queue(client, KEYS, 4), 4)
    [job_id] = client.lrange(f"rq:queue:{KEYS.queue_name(3)}", 0, -1)
    ours = client.hgetall(f"rq:job:{job_id.decode()}")
    theirs = client.hgetall(reference.key)
    data = jobs.MsgpackSerializer.loads(zlib.decompress(ours[b"data"]))
    assert data == ["workers.validate.shard_job", None, [3], {"prefix": "ipamgc"}]
    assert data[0] == jobs.SHARD_JOB
    for field in (b"timeout", b"result_ttl", b"failure_ttl"):
        assert ours[field] == theirs[field]
    assert (ours[b"timeout"], ours[b"result_ttl"], ours[b"failure_ttl"]) == (
        str(jobs.JOB_TIMEOUT_SECONDS).encode(),
        str(jobs.RESULT_TTL_SECONDS).encode(),
        str(jobs.FAILURE_TTL_SECONDS).encode(),
    )


def test_settings_come_from_the_environment_and_flags_win() -> None:
    env = {
        "REDIS_URL": "redis://fallback:6379/0",
        "IPAMGC_REDIS_URL": "redis://r:6380/1",
        "IPAMGC_SHARDS": "8",
        "IPAMGC_LEAK_GRACE_PERIOD": "none",
        "IPAMGC_RESYNC_PERIOD": "2m30s",
        "IPAMGC_KICK_INTERVAL": "3",
        "IPAMGC_ELECTION": "false",
        "POD_NAMESPACE": "calico-system",
    }
    s = from_env(env)
    assert (s.redis_url, s.shards, s.leak_grace_override) == ("redis://r:6380/1", 8, GraceOverride(None))
    assert (s.resync_period_seconds, s.kick_interval_seconds, s.election) == (150.0, 3.0, False)
    assert s.election_namespace == "calico-system"
    assert from_env({"REDIS_URL": "redis://fallback:6379/0"}).redis_url == "redis://fallback:6379/0"
    assert s.with_overrides(shards=4, redis_url=None).shards == 4
    assert Settings().resync_period(900.0) == 450.0 and Settings().resync_period(None) == 300.0
    with pytest.raises(ConfigError, match="IPAMGC_SHARDS"):
        from_env({"IPAMGC_SHARDS": "many"})
    with pytest.raises(ConfigError):
        Settings(election_lease_seconds=2, election_renew_seconds=2.0)
    assert parse_shards("0,1,5-7", 16) == [0, 1, 5, 6, 7]
    with pytest.raises(ConfigError):
        parse_shards("3,16", 16)


def test_the_commands_reject_bad_flags_with_a_usage_error() -> None:
    runner = CliRunner()
    assert runner.invoke(work, ["--shards", "0-99"]).exit_code == 2
    assert runner.invoke(watch, ["--leak-grace-period", "soon"]).exit_code == 2
    assert runner.invoke(watch, ["--help"]).exit_code == 0


def test_fetch_live_inventory_reads_the_cluster_for_check(
    server: SimApiServer, sim: SimCluster, tmp_path: Path
) -> None:
    sim.populate(nodes=2, pods_per_node=3)
    sim.leak_node_deleted("node-00001")
    path = server.write_kubeconfig(tmp_path / "kubeconfig")
    items = fetch_live_inventory(str(path))
    inv = build_inventory(items)
    assert inv.skipped == []
    assert (len(inv.nodes), len(inv.pods)) == (1, 3)
    assert len(inv.blocks) == sim.store.count("ipamblocks") and len(inv.handles) == sim.store.count(
        "ipamhandles"
    )
    assert len(inv.affinities) == sim.store.count("blockaffinities")


def test_full_jitter_back_off_and_error_translation() -> None:
    backoff = Backoff(0.5, 4.0, rng=lambda: 1.0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert backoff.next(retry_after=10.0) == 10.0
    backoff.reset()
    assert Backoff(0.5, 4.0, rng=lambda: 0.25).next() == 0.125
    assert isinstance(kube_errors.classify_status(410, "gone"), kube_errors.ResourceExpired)
    for status in (0, 409, 429, 500, 503):
        assert isinstance(kube_errors.classify_status(status, "x"), kube_errors.KubeTransientError)
    for status in (401, 403, 404, 422):
        assert isinstance(kube_errors.classify_status(status, "x"), kube_errors.KubePermanentError)
    assert kube_errors.retry_after_of({"Retry-After": "7"}) == 7.0
    assert kube_errors.retry_after_of({}, {"details": {"retryAfterSeconds": 3}}) == 3.0
