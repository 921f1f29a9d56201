"""The watcher: lists and watches Kubernetes and Calico IPAM objects and publishes dirty allocations.

It mirrors the minimal state the workers need into Redis and never decides anything (design.md).
`kube` talks to the API server (lists, watches, 410 → relist, back-off, typing), `mirror` keeps the
Redis mirror and its dirty sets, `election` makes one replica active, `watcher` runs them together.
"""
