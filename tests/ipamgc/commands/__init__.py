"""The component commands (`ipamgc/commands/`): flags, environment, metrics endpoints, lead, audit."""
