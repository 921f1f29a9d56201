"""The Redis edge (`redisio/`): clients and their options, Sentinel, held connections, Lua in pipelines."""
