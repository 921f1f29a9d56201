"""End-to-end tests against the simulated Kubernetes API server."""
