"""Metrics of the shard jobs: the validation counters, kept in Redis.

Counters that many processes add to live in Redis.  The validation counters (batches and their latency,
verdicts, decisions by reason) are written by every worker process, and workers run as many containers
on many hosts, scaled up and down by an autoscaler.  prometheus-client's multiprocess mode does not fit:
it aggregates only processes that share one directory on one host (and needs that directory cleaned on
every restart), and per-process series of short-lived workers would come and go with each scale-down.
So a batch adds a few HINCRBY/HINCRBYFLOAT to the pipeline it already sends with its ack (no extra round
trip, ~5 commands against the ~59 of one RQ job) to the `P:metrics` hash, and one process — the active
watcher (`producer/metrics.py`) — exposes the sums.  The histogram is stored non-cumulative, one field
per bucket, and made cumulative at exposition.
"""

from __future__ import annotations

from collections.abc import Mapping

import redis

from shared import metrics_names as m
from shared.keys import Keys


def record_batch(
    pipe: redis.client.Pipeline, keys: Keys, seconds: float, validated: int, decisions: Mapping[str, int]
) -> None:
    """Count one validated batch in the `metrics` hash, inside the batch's own write pipeline."""
    key = keys.metrics
    pipe.hincrby(key, m.bucket_field(seconds), 1)  # the +Inf total is the batch count
    pipe.hincrbyfloat(key, m.FIELD_BATCH_SUM, seconds)
    if validated:
        pipe.hincrby(key, m.FIELD_VALIDATED, validated)
    for reason, n in sorted(decisions.items()):
        pipe.hincrby(key, f"{m.DECISION_FIELD_PREFIX}{reason}", n)
