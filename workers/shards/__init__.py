"""The validation workers: the RQ shard jobs and the worker process that runs them (`ipamgc work`).

Owns: the job and its wire format (`rq_serializer`, `run`), the shard job's loop (`validate`, `linger`,
`linger_lua`, `job_tuning`, `busy`, `pulse`), its work queue (`queue`), a batch's verdicts and writes
(`batches`, `writes`) and their counters in Redis (`metrics`).
May import: `shared`, `workers.common`, redis and rq.  Never `workers.leader` nor `kubeio`: a shard job
only reads the mirror and writes Redis; every Kubernetes write is the leader's.
"""
