"""The validation workers (`workers/shards/`): shard jobs, lingering, decisions, worker processes."""
