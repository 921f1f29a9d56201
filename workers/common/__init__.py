"""What both worker-side components read: the mirror's records in Redis, decoded (`redis_state`).

May import: `shared` and redis.  Never `workers.shards`, `workers.leader` nor `kubeio`, so that both can
use it without either importing the other.
"""
