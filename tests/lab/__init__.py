"""The laboratory (`lab/`): the demo's summary here; one folder per lab package below."""
