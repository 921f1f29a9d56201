"""End-to-end tests: real Redis, the simulated cluster over HTTP, the watcher, RQ worker processes."""
