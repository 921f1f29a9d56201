"""ipamgc's front door: the command line, the local supervisor, the simulated cluster and the benchmark."""

__version__ = "0.1.0"
