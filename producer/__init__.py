"""The watcher: lists and watches Kubernetes and Calico IPAM objects and publishes dirty allocations.

It mirrors the minimal state the workers need into Redis and never decides anything (design.md).
"""
