"""The watcher (`producer/`): reflectors, mirror, backstop, publishing, election, metrics, bad objects."""
