"""ipamgc's Redis edge: the clients, the connection and pipeline helpers, and the shard queue's protocol.

Owns:
- `client`: every Redis client the components build (`redis_client`: RESP2, bytes, no CLIENT SETINFO;
  `blocking_client` for XREAD BLOCK and BZPOPMIN), and `sentinel`: Sentinel-managed URLs;
- `heldconn`: a pipeline on a connection its thread keeps; `luapipe`: Lua scripts in pipelines without
  SCRIPT EXISTS;
- `shardqueue`: the shard queue's protocol (the Lua scripts of leasing, ack, re-arm and the `queued:{s}`
  flag, the RQ shard job and its msgpack serializer), which the watcher and the workers both import.

May import: `shared` (the pure domain: keys, records, settings, errors), redis, hiredis, rq and msgpack.
Never `producer`, `workers`, `ipamgc`, `kubeio` nor kubernetes: the components import this package, and
it knows none of them (import-linter contracts in pyproject.toml).  The Redis key layout itself is
`shared.keys` (pure names), documented in docs/redis-keys.md.
"""
