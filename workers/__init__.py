"""The RQ workers that validate dirty allocations by shard, and the elected leader that releases leaks."""
