"""The shard job's dotted path as RQ stores it in Redis: `workers.validate.shard_job`.

RQ enqueues a job by the dotted path of its function and imports that path when a worker takes the job.
The job moved to `workers.shards.validate` (#37), but the path the watcher enqueues
(`redisio/shardqueue/jobs.py` `SHARD_JOB`) stays this one, so that jobs
already queued and watchers and workers of the previous version in a rolling upgrade (docs/upgrading.md)
keep working both ways.  Nothing else belongs here.
"""

from __future__ import annotations

from workers.shards.validate import shard_job

__all__ = ["shard_job"]
