"""The shard queue's protocol, owned in one place: how work the watcher publishes reaches a shard job.

A shard's allocation ids wait in `dirty:{s}`; a job leases a batch into `inflight:{s}` (its deadline is the
lease token), validates it and acks it, and an expired lease or a due candidate (`due:{s}`) goes back to
`dirty`.  The `queued:{s}` flag says a job serves the shard: `1` armed (an RQ job enqueued, waiting), or
the token of the lingering job that holds it; the watcher arms a shard with work and no live job, once.

- `lua`: every script of the protocol, each with its `KEYS`/`ARGV` header (leasing, ack, re-arm, the
  flag's hold/step/release, the watcher's kick) and the flag's values and thresholds;
- `queue`: the Python that runs them: `ShardQueue` (a job's side of one shard) and `ShardFlags` (the
  flag of every shard: armed by the watcher, held and let go by lingering jobs);
- `jobs`: the RQ job that carries "shard s has work": its dotted path, options, TTLs, msgpack serializer
  (never pickle), the only job class a worker runs, and its enqueueing.

The watcher (`producer`) and the validation workers (`workers.shards`) both import these modules, and
neither repeats any of it.  Imported by its modules, not from here: this package imports nothing itself,
so that a reader of one part pays for no other.
"""
