"""The two worker-side components, each a package of its own, and what both read.

- `workers.shards`: the validation workers — RQ shard jobs that judge dirty allocations on the mirror and
  write leak timers and decisions to Redis;
- `workers.leader`: the elected leader — it reads the decisions, re-checks them live and is the one writer
  to Kubernetes (through `kubeio`);
- `workers.common`: what both read from Redis (the mirror's state).

`workers.shards` and `workers.leader` never import each other, `workers.shards` never imports `kubeio`,
and `workers.common` imports neither component (import-linter contracts in pyproject.toml).
`workers.validate` only keeps the shard job's dotted path, which RQ stores in Redis, importable.
"""
