"""The leader (`workers/leader/`): release, gate, re-check, cleanup, handle collector, audit, fencing."""
