"""Pure unit tests: no Redis, no HTTP."""
