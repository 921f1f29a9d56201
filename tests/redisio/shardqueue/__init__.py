"""The shard-queue protocol (`redisio/shardqueue/`): its Lua, RQ jobs, msgpack payloads, one owner."""
