"""The whole system end to end: watcher, workers and leader together (up, demo, processes, ACL, TLS)."""
