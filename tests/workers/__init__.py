"""The worker-side components (`workers/`): one folder per component."""
