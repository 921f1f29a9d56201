"""The front door (`ipamgc/`): check, release, status, audit, health, the runner, metrics, the local Redis."""
