"""The validation workers: the RQ shard jobs and the worker process that runs them (`ipamgc work`).

Owns: the worker process (`run`), the shard job's loop (`validate`, `linger`, `job_tuning`, `busy`,
`pulse`), a batch's verdicts and writes (`batches`, `writes`) and their counters in Redis (`metrics`).
The shard queue's protocol they run (the job's wire format, leasing, ack, the `queued` flag and its Lua)
is `redisio.shardqueue`, which the watcher imports too.
May import: `shared`, `redisio`, `workers.common`, redis and rq.  Never `workers.leader` nor `kubeio`: a
shard job only reads the mirror and writes Redis; every Kubernetes write is the leader's.
"""
