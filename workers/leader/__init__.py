"""The leader: the one elected writer that releases confirmed leaks and cleans blocks (`ipamgc lead`).

Owns: the process and its pass (`loop`), the election and fencing (`election`), the decisions it holds
(`ledger`), the handle gate on the mirror (`gate`, `rate_limit`, `settings`, `wake`), the live re-check
and release (`recheck`, `live_release`, `release`, `handle_count`, `report_release`), the cleanups
(`cleanup`, `empty_blocks`, `cooldown`), its Kubernetes protocol (`kube`, `calico_objects`), the audit
trail (`audit`) and its metrics (`metrics`).
May import: `shared`, `workers.common`, `kubeio`, redis.  Never `workers.shards`: the leader takes what
the workers decided from Redis only.
"""
